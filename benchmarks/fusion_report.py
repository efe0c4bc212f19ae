"""What torch.compile fuses in the pre-training step, and what it leaves to libraries (issue 35, item 4).

    python benchmarks/fusion_report.py                 # BERT-Large's width, 2 layers, bf16 autocast, on the GPU
    python benchmarks/fusion_report.py --cpu           # BERT-tiny on the CPU (a test in CI)

Compiles BertForPreTraining as model.compile=true does (the whole model and its losses, fullgraph), runs one
forward and backward of a seq-128 batch with 20 masked positions a row under bf16 autocast, and reads the code
inductor generated (torch._inductor.utils.run_and_get_code): each generated kernel (triton on a GPU, C++ on the CPU)
is named after the operators it fused, e.g. `triton_per_fused_add_native_layer_norm_native_layer_norm_backward_3`;
the matmuls and attention go to library kernels (`extern_kernels.mm`, `aten._scaled_dot_product_...`). Two layers at
BERT-Large's width give the kernels of every layer of the full model at a fraction of the compile time.
Prints a table: per generated kernel, the operators it fused (forward and backward), and the library calls left.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import torch
from common import REPO_ROOT  # noqa: F401  (puts the repository root on sys.path)

from model import BertConfig, BertForPreTraining

KERNEL = re.compile(r"\b((?:triton_[a-z]+|cpp)_fused_[A-Za-z0-9_]+?)_\d+\b")
LIBRARY_CALL = re.compile(r"\b(extern_kernels\.[a-z_]+|(?:torch\.ops\.)?aten\.[A-Za-z0-9_]+(?:\.[a-z_]+)?)\(")


def compiled_step_code(config: BertConfig, batch: int, seq: int, predictions: int, device: torch.device) -> list[str]:
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = BertForPreTraining(config).to(device).train()
    model.compile(fullgraph=True, dynamic=False)
    inputs = {"input_ids": torch.randint(0, config.vocab_size, (batch, seq), device=device),
              "token_type_ids": torch.zeros(batch, seq, dtype=torch.long, device=device),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
              "masked_positions": torch.randint(1, seq, (batch, predictions), device=device),
              "masked_lm_labels": torch.randint(0, config.vocab_size, (batch, predictions), device=device),
              "next_sentence_labels": torch.randint(0, 2, (batch,), device=device)}

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()

    _, code = run_and_get_code(step)
    return code


def report(code: list[str]) -> str:
    kernels = Counter(name for text in code for name in KERNEL.findall(text))
    calls = Counter(call.removeprefix("torch.ops.") for text in code for call in LIBRARY_CALL.findall(text))
    calls = Counter({c: n for c, n in calls.items() if not c.startswith(("aten.empty", "aten.as_strided"))})
    lines = [f"{len(kernels)} generated kernels (each named after what it fused), {sum(calls.values())} library "
             "calls left\n", "| generated kernel | operators fused |", "|---|---|"]
    for name in sorted(kernels):
        operators = name.split("_fused_", 1)[1]
        lines.append(f"| {name} | {operators.replace('_', ' ')} |")
    lines += ["", "| library call left | calls |", "|---|---|"]
    lines += [f"| {call} | {count} |" for call, count in calls.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="BERT-tiny on the CPU (CI)")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --cpu")
    device = torch.device("cpu" if args.cpu else "cuda")
    config = (BertConfig.from_preset("tiny", vocab_size=1024) if args.cpu
              else BertConfig.from_preset("large", num_layers=2))
    code = compiled_step_code(config, batch=4 if args.cpu else 64, seq=128, predictions=20, device=device)
    print(f"{'BERT-tiny' if args.cpu else 'BERT-Large width, 2 layers'}, {device}, torch {torch.__version__}, "
          "bf16 autocast, forward + backward of the whole model compiled:\n")
    print(report(code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
