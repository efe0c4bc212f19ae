"""Data-prep benchmark: throughput per core against the reference, memory at 1x vs 4x, scaling over workers.

    python benchmarks/bench_data_prep.py [--books ../shared/data/corpora/books] [--skip-scaling] [--scaling-copies 16]

Input: the six Gutenberg books (the corpus the reference figures below were measured on), read from raw
text, so sentence splitting and tokenization are included. Each measurement runs in a fresh process so that
its peak RSS is its own. Reference (google-research/bert create_pretraining_data.py on the same books,
pre-split into sentences, seq 128, dupe_factor 5, one core of this machine): 42,316 instances, 4.64 M
output tokens, ~234 k output tokens/s, 176 MB peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE = {"instances": 42316, "tokens": 4.64e6, "tokens_per_s": 234e3, "peak_rss_mb": 176}


def measure(argv: list[str]) -> None:
    """Child mode: run the job once and print its figures as JSON."""
    sys.path.insert(0, str(REPO_ROOT))
    from data_prep.run import run
    started = time.perf_counter()
    manifest = run(argv)
    wall = time.perf_counter() - started
    print(json.dumps({
        "wall_s": wall,
        "instances": manifest["totals"]["instances"],
        "tokens": manifest["totals"]["tokens"],
        "statistics": manifest["statistics"],
        "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))


def replicate(books: Path, root: Path, copies: int) -> Path:
    """`copies` copies of the books under distinct names: distinct documents, the same text statistics."""
    target = root / f"books_x{copies}"
    target.mkdir()
    for copy in range(copies):
        for book in sorted(books.glob("*.txt")):
            shutil.copy(book, target / f"{book.stem}-{copy}.txt")
    return target


def run_job(corpus: Path, out: Path, shards: int, beam_args: list[str]) -> dict:
    argv = [f"inputs=[{{path: '{corpus}/*.txt', format: books}}]", f"output_dir={out}", "preset=phase1",
            f"num_shards={shards}", "dupe_factor=5", *beam_args]
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}   # one tokenizer thread per process: per-core figures
    result = subprocess.run([sys.executable, __file__, "--measure", json.dumps(argv)], capture_output=True,
                            text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--books", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "corpora" / "books")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--scaling-copies", type=int, default=16,
                        help="corpus copies for the 1 vs 2 worker run: large enough that start-up does not dominate")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(json.loads(args.measure))
        return

    in_process = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        x1 = replicate(args.books, root, 1)
        one = run_job(x1, root / "out1", 1, in_process)
        tokens_per_s = one["tokens"] / one["wall_s"]
        print("== throughput: one process, one core (in-process DirectRunner, 1 tokenizer thread), six books")
        print(f"instances {one['instances']:,} (reference {REFERENCE['instances']:,}); output tokens {one['tokens']:,} "
              f"(reference {REFERENCE['tokens']:,.0f})")
        print(f"statistics {json.dumps({k: round(v, 4) for k, v in one['statistics'].items()})}")
        print(f"wall {one['wall_s']:.2f} s; {tokens_per_s:,.0f} output tokens/s per core = "
              f"{tokens_per_s / REFERENCE['tokens_per_s']:.2f}x the reference's {REFERENCE['tokens_per_s']:,.0f}")
        print(f"peak RSS {one['peak_rss_mb_self']:.0f} MB (reference {REFERENCE['peak_rss_mb']} MB)")

        x4 = replicate(args.books, root, 4)
        four = run_job(x4, root / "out4", 4, in_process)
        print("== memory: 4x the corpus (4 shards of the same size as the 1x run's one)")
        print(f"peak RSS 1x {one['peak_rss_mb_self']:.0f} MB, 4x {four['peak_rss_mb_self']:.0f} MB: "
              f"ratio {four['peak_rss_mb_self'] / one['peak_rss_mb_self']:.3f} (goal <= 1.20); "
              f"4x throughput {four['tokens'] / four['wall_s']:,.0f} tokens/s")

        if not args.skip_scaling:
            copies = args.scaling_copies
            corpus = replicate(args.books, root, copies)
            results = {}
            for workers in (1, 2):
                results[workers] = run_job(corpus, root / f"out_scaling_{workers}", copies, [
                    "--runner=DirectRunner", "--direct_running_mode=multi_processing",
                    f"--direct_num_workers={workers}"])
            speedup = results[1]["wall_s"] / results[2]["wall_s"]
            print(f"== scaling: {copies}x the corpus, multi-processing DirectRunner")
            for workers, r in results.items():
                print(f"{workers} worker(s): {r['wall_s']:.1f} s, {r['tokens'] / r['wall_s']:,.0f} tokens/s, "
                      f"largest worker peak RSS {r['peak_rss_mb_largest_child']:.0f} MB")
            print(f"speedup 2 workers / 1 worker: {speedup:.2f}x (goal >= 1.7x)")


if __name__ == "__main__":
    main()
