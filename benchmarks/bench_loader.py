"""Training-loader benchmark: sequences/s of ONE loader worker, reading, shuffling, collating and masking included.

    python benchmarks/bench_loader.py --shared-data ../shared/data [--batches 4000] [--batch-size 32]

Two shard sets are made from the six Gutenberg books with the real data_prep job (preset phase1: seq 128, 20
predictions; dupe_factor 1; 3 shards), one statically masked and one for dynamic masking, in a temporary
directory. Then, for each set, the same stream is timed two ways:
- in-process: the dataset iterated directly (num_workers=0): exactly the work of one worker process;
- PretrainingDataLoader with one worker process: what training sees, with the worker's start at every epoch
  and the transfer of its batches to the main process included.
The sets hold ~6,800 rows, so a run goes over several epochs: each epoch re-reads its row groups and, for the
dynamic set, masks every row anew. Besides wall-clock rates, the CPU seconds of the worker are reported
(sequences per CPU-second of the worker process, in-process: of this process), which do not depend on what
else the machine runs. Goal: >= 20,000 sequences/s at batch 32, seq 128.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from common import add_shared_data_flag, shared_path

GOAL_SEQ_PER_S = 20_000


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measure(dataset, batches: int, num_workers: int) -> dict:
    """Iterate epochs 0, 1, ... of `dataset` until `batches` batches: wall and CPU rates in sequences/s."""
    from pipeline.pretraining.data.loader import PretrainingDataLoader
    seen = sequences = epoch = 0
    started, self_cpu, children_cpu = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF), \
        cpu_seconds(resource.RUSAGE_CHILDREN)
    while seen < batches:
        dataset.set_epoch(epoch)
        source = dataset if num_workers == 0 else PretrainingDataLoader(dataset)
        for batch in source:
            sequences += batch["input_ids"].shape[0]
            seen += 1
            if seen == batches:
                break
        del source          # a worker's CPU time is counted once it has exited
        epoch += 1
    wall = time.perf_counter() - started
    main_cpu = cpu_seconds(resource.RUSAGE_SELF) - self_cpu
    worker_cpu = main_cpu if num_workers == 0 else cpu_seconds(resource.RUSAGE_CHILDREN) - children_cpu
    return {"wall": sequences / wall, "worker_cpu": sequences / worker_cpu, "main_cpu_us_per_batch":
            (main_cpu / seen * 1e6) if num_workers else None, "batches": seen, "epochs": epoch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_data_flag(parser)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    import torch
    torch.set_num_threads(1)
    from pipeline.pretraining.data import PretrainingDataset, ShardSet
    from tests.helpers.shard_sets import build_books_set

    books_dir = shared_path(args, "corpora", "books")
    books = sorted(books_dir.glob("*.txt"))
    if not books:
        sys.exit(f"no books in {books_dir}")
    print(f"command: python benchmarks/bench_loader.py --shared-data {args.shared_data} --batches {args.batches} "
          f"--batch-size {args.batch_size}")
    with tempfile.TemporaryDirectory() as root:
        worst = float("inf")
        for masking in ("static", "dynamic"):
            out = Path(root) / masking
            manifest = build_books_set(out, books, f"masking={masking}")
            shard_set = ShardSet.open(out, max_seq_length=128, vocab_size=manifest["tokenizer"]["vocab_size"])
            print(f"== {masking} set: {shard_set.total_rows:,} rows in {len(shard_set.shards)} shards, "
                  f"mean {manifest['statistics']['mean_instance_length']:.1f} tokens per row")
            for workers, label in ((0, "in-process (one worker's work)"), (1, "PretrainingDataLoader, 1 worker")):
                dataset = PretrainingDataset(shard_set, args.batch_size, num_workers=workers)
                r = measure(dataset, args.batches, workers)
                worst = min(worst, r["wall"])
                main = (f"; main process {r['main_cpu_us_per_batch']:,.0f} CPU-us/batch"
                        if r["main_cpu_us_per_batch"] is not None else "")
                print(f"{label:32s} {r['wall']:>9,.0f} seq/s wall, {r['worker_cpu']:>9,.0f} seq per worker "
                      f"CPU-second{main}  ({r['batches']} batches of {args.batch_size}, {r['epochs']} epochs)")
    verdict = "met" if worst >= GOAL_SEQ_PER_S else "NOT met"
    print(f"slowest wall rate: {worst:,.0f} sequences/s; goal >= {GOAL_SEQ_PER_S:,} per worker: {verdict}")


if __name__ == "__main__":
    main()
