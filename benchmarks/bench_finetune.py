"""Fine-tuning throughput: one epoch of SST-2 for the mini preset on the CPU, ours against transformers.

    python benchmarks/bench_finetune.py                      # the real SST-2 train set (67,349), dev set (872)
    python benchmarks/bench_finetune.py --examples 5000      # a quicker look on the first 5,000 training rows

Both sides start from the same weights (BERT-mini at random initialisation, seed 0, written once as a Hugging Face
directory) and train with the same recipe (AdamW, lr, weight decay 0.01, 10% linear warmup then linear decay,
gradient clipping 1.0, batch 32, dropout 0.1), one epoch, then are evaluated on the dev set:
- ours: pipeline/finetune.py's finetune() itself (Lightning, batches padded to their longest), once with
  length-grouped batches (data.group_by_length=true) and once in plain random order;
- the baseline: transformers' BertForSequenceClassification fed as its run_glue example does by default (every
  sequence padded to max_seq_length 128, shuffled batches), in a plain PyTorch loop (no Trainer overhead counted
  against it).
Tokenization is timed apart from training on both sides. Install the baseline with `pip install -e ".[test]"`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "downstream" / "glue" / "SST-2"
VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"


def write_initial_weights(out_dir: Path) -> Path:
    from model import BertConfig, BertForPreTraining
    from model.hf_conversion import export_hf

    torch.manual_seed(0)
    return export_hf(BertForPreTraining(BertConfig.from_preset("mini")), out_dir, VOCAB)


def run_ours(init: Path, data: Path, work: Path, examples: int | None, lr: float, grouped: bool) -> dict:
    from pipeline.finetune import compose_config, finetune

    name = "grouped" if grouped else "random"
    overrides = [f"init={init}", "task=sst2", f"data.dir={data}", f"output_dir={work / name}",
                 f"data.cache_dir={work / 'cache'}", "trainer.max_epochs=1", f"optimizer.lr={lr}",
                 f"data.group_by_length={str(grouped).lower()}", "trainer.enable_progress_bar=false",
                 "export.hf=false", "export.plot=false", "seed=0"]
    if examples:
        overrides.append(f"data.limit_train_examples={examples}")
    started = time.perf_counter()
    finetune(compose_config(overrides))
    wall = time.perf_counter() - started
    record = json.loads((work / name / "metrics.json").read_text())
    return {"name": f"ours, {'length-grouped' if grouped else 'random order'}, padded to longest",
            "examples": record["data"]["train"]["examples"], "train_seconds": record["train_seconds"],
            "wall_seconds": wall, "dev_acc": record["metrics"]["dev"]["acc"]}


def run_transformers(init: Path, data: Path, examples: int | None, lr: float, batch_size: int = 32,
                     max_seq_length: int = 128) -> dict:
    import numpy as np
    import transformers

    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(init)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(init, num_labels=2)

    def read(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
        rows = [line.rsplit("\t", 1) for line in lines[:limit] if line]
        return [r[0] for r in rows], [int(r[1]) for r in rows]

    started = time.perf_counter()
    train_text, train_labels = read(data / "train.tsv", examples)
    dev_text, dev_labels = read(data / "dev.tsv")
    encode = lambda texts: tokenizer(texts, padding="max_length", truncation=True, max_length=max_seq_length,  # noqa: E731
                                     return_tensors="pt")
    train_inputs, dev_inputs = encode(train_text), encode(dev_text)
    tokenize_seconds = time.perf_counter() - started

    steps = math.ceil(len(train_labels) / batch_size)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, eps=1e-6)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * steps), steps)
    labels = torch.tensor(train_labels)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    model.train()
    started = time.perf_counter()
    for step in range(steps):
        rows = order[step * batch_size:(step + 1) * batch_size]
        out = model(input_ids=train_inputs["input_ids"][rows], token_type_ids=train_inputs["token_type_ids"][rows],
                    attention_mask=train_inputs["attention_mask"][rows], labels=labels[rows])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    train_seconds = time.perf_counter() - started

    model.eval()
    predictions = []
    with torch.no_grad():
        for start in range(0, len(dev_labels), 128):
            batch = {k: v[start:start + 128] for k, v in dev_inputs.items()}
            predictions.append(model(**batch).logits.argmax(-1))
    dev_acc = float((torch.cat(predictions).numpy() == np.asarray(dev_labels)).mean())
    return {"name": f"transformers BertForSequenceClassification, padded to {max_seq_length}",
            "examples": len(train_labels), "train_seconds": train_seconds,
            "wall_seconds": tokenize_seconds + train_seconds, "dev_acc": dev_acc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SST-2 folder (train.tsv, dev.tsv)")
    parser.add_argument("--examples", type=int, default=None, help="first N training rows (default: all)")
    parser.add_argument("--lr", type=float, default=1e-4, help="peak learning rate, both sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-random-order", action="store_true", help="run ours length-grouped only")
    args = parser.parse_args()
    if not (args.data / "train.tsv").is_file():
        sys.exit(f"no SST-2 train.tsv in {args.data}: pass --data=<GLUE SST-2 folder>")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = write_initial_weights(work / "init")
        results = [run_ours(init, args.data, work, args.examples, args.lr, grouped=True)]
        if not args.skip_random_order:
            results.append(run_ours(init, args.data, work, args.examples, args.lr, grouped=False))
        results.append(run_transformers(init, args.data, args.examples, args.lr))

    baseline = results[-1]["examples"] / results[-1]["train_seconds"]
    print(f"\nOne epoch of SST-2 ({results[0]['examples']:,} sentences), BERT-mini, batch 32, lr {args.lr:g}, "
          f"{args.threads} threads, dev set {args.data / 'dev.tsv'}\n")
    print("| run | training examples/s | vs transformers | training s | dev accuracy |")
    print("|---|---|---|---|---|")
    for r in results:
        rate = r["examples"] / r["train_seconds"]
        print(f"| {r['name']} | {rate:,.0f} | {rate / baseline:.2f}x | {r['train_seconds']:.1f} | {r['dev_acc']:.4f} |")


if __name__ == "__main__":
    main()
