"""Where a pre-training step's time goes on one GPU: our model alone, without Lightning, the loader or logging.

    python benchmarks/gpu_step.py            # BERT-Large, 64 x 128, 4 micro-batches a step, bf16 autocast
    python benchmarks/gpu_step.py --cpu      # the same code at BERT-tiny on the CPU (a test in CI)

gpu_check.py measures the pipeline's whole run; this takes the step apart, on the same shapes as its seq-128 rows
(micro-batch 64 x 128, 20 masked positions a row, 4 micro-batches per optimizer step, bf16 autocast over fp32
weights), so that the gap between the pipeline's MFU and the model's is visible:
- fwd+bwd: forward and backward of one micro-batch, nothing else (the model's own ceiling);
- step: 4 micro-batches accumulated, gradient clipping to 1.0, the optimizer step, zero_grad: what one optimizer step
  of the pipeline computes, with the pipeline's optimizer (pipeline.core.optim.optimizers.build_optimizer: LAMB as
  `optimizer=lamb`, torch's fused AdamW as `optimizer=adamw`);
each eager and compiled as `model.compile=true` does (the whole model and its losses: pipeline/pretraining/compiled.py).
Per variant: sequences/s and MFU (model/flops.py, as the throughput callback) over --steps timed steps after
--warmup, the time synchronised at both ends only; and, for the steps, the milliseconds that are not forward and
backward (clipping and the optimizer: step time minus 4 times the fwd+bwd time of the same compilation).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from bench_train_step import make_batch, our_loss
from common import at_least_one  # also puts the repository root on sys.path

from model import BertConfig, BertForPreTraining
from model.flops import flops_per_token, peak_flops_for_device
from pipeline.core.optim.optimizers import build_optimizer
from pipeline.pretraining.compiled import apply_compile_settings

OPTIMIZERS = {"lamb": {"name": "lamb", "lr": 1e-4, "weight_decay": 0.01},
              "fused adamw": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.01, "fused": True}}


def timed(fn, steps: int, warmup: int, device: torch.device) -> float:
    """Seconds per call of fn, after warmup calls; synchronised before and after the timed calls only."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def measure(config: BertConfig, batch: dict, device: torch.device, compiled: bool, optimizer: str | None,
            accumulation: int, steps: int, warmup: int) -> float:
    torch.manual_seed(0)
    model = BertForPreTraining(config).to(device).train()
    apply_compile_settings(model, {"compile": compiled})
    params = list(model.parameters())
    opt = build_optimizer(model, OPTIMIZERS[optimizer]) if optimizer else None

    def forward_backward():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = our_loss(model, batch)
        loss.backward()

    def step():
        for _ in range(accumulation):
            forward_backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return timed(step if opt else forward_backward, steps, warmup, device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="BERT-tiny on the CPU, 2 x 64: the code path, for CI")
    parser.add_argument("--eager-only", action="store_true", help="leave out the compiled variants")
    parser.add_argument("--steps", type=at_least_one, default=10, help="timed steps (1 or more)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens there)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --cpu")
    preset, micro, seq, predictions, accumulation = ("tiny", 2, 64, 10, 4) if args.cpu else ("large", 64, 128, 20, 4)
    config = BertConfig.from_preset(preset)
    batch = {key: value.to(device) if torch.is_tensor(value) else value
             for key, value in make_batch(config.vocab_size, micro, seq, predictions, seed=0, short_fraction=0).items()}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    peak = peak_flops_for_device(name) if device.type == "cuda" else None
    flops_per_sequence = flops_per_token(config, seq, predictions) * seq
    print("command: python benchmarks/gpu_step.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {name}, torch {torch.__version__}; BERT-{preset}, micro-batch {micro} x "
          f"{seq}, {accumulation} micro-batches a step, bf16 autocast; {args.steps} timed steps after {args.warmup}")
    print("\n| variant | ms | sequences/s | MFU | ms not forward/backward |\n|---|---|---|---|---|")
    fwd_bwd = {}
    for compiled in (False,) if args.eager_only else (False, True):
        label = "compiled" if compiled else "eager"
        rows = [(f"fwd+bwd, {label}", None)] + [(f"step, {label}, {opt}", opt) for opt in OPTIMIZERS]
        for row, optimizer in rows:
            seconds = measure(config, batch, device, compiled, optimizer, accumulation, args.steps, args.warmup)
            sequences = micro * (accumulation if optimizer else 1)
            rate = sequences / seconds
            mfu = f"{flops_per_sequence * rate / peak:.1%}" if peak else "n/a"
            if optimizer is None:
                fwd_bwd[compiled] = seconds
                rest = ""
            else:
                rest = f"{(seconds - accumulation * fwd_bwd[compiled]) * 1e3:,.0f}"
            print(f"| {row} | {seconds * 1e3:,.1f} | {rate:,.1f} | {mfu} | {rest} |", flush=True)


if __name__ == "__main__":
    main()
