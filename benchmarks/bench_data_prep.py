"""Data-prep benchmark on the real corpora: throughput per core against the reference run in the same script, peak
memory at 1x and 4x the corpora, wall time per GB on 2 workers, the DaskRunner against the DirectRunner.

    pip install -e ".[bench]"        # the reference: bert-tensorflow (google-research/bert) on tensorflow-cpu
    python benchmarks/bench_data_prep.py --shared-data ../shared/data [--reference-python PYTHON] [--copies 4]
    python benchmarks/bench_data_prep.py --shared-data ../shared/data --dask-vs-direct   # needs the dask extra

The corpora: every folder of <shared-data>/corpora (WikiExtractor's Wikipedia, the MediaWiki sample, 303 Gutenberg
books, the six books, the IMDB reviews: about 350 MB of text), read from their raw files, so decompression, parsing,
sentence splitting and tokenization are all timed. Nx is N copies under distinct names (links to the same files):
distinct documents, the same text statistics. Settings: seq 128, 20 predictions, dupe_factor 5, seed 12345, static
masking, the bundled uncased vocabulary (preset=phase1).

1. Per core against the reference: the 303 Gutenberg books, ours in one process on one core (in-process
   DirectRunner, one tokenizer thread, Beam start-up included) and google-research/bert's create_pretraining_data.py
   (bert-tensorflow 1.0.4, its TF1 names from tensorflow's compat.v1; its main() timed, TensorFlow's import not) on
   the same books, pre-split into sentences by our reader and segmenter (not timed), with the same settings.
2. Memory and wall time: 1x and Nx the corpora on the multi-processing DirectRunner with 2 worker processes; the peak
   RSS of the largest process (the launcher or a worker), output tokens/s per core, seconds per GB of text.
--dask-vs-direct: 1x on Beam's DaskRunner (a LocalCluster of 2 workers, started and stopped by the job) and on the
DirectRunner (2 worker processes): wall times and whether the shards are byte-identical.
Each measurement runs in a fresh process so that its peak RSS is its own.
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BUNDLED_VOCAB as VOCAB
from common import add_shared_data_flag, shared_path

ONE_CORE_ENV = {"RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
TWO_WORKERS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
SETTINGS = ["preset=phase1", "dupe_factor=5", "seed=12345"]


def measure(argv: list[str]) -> None:
    """Child mode: run the job once and print its figures as JSON."""
    from data_prep.run import run
    started = time.perf_counter()
    manifest = run(argv)
    wall = time.perf_counter() - started
    print(json.dumps({
        "wall_s": wall, "instances": manifest["totals"]["instances"], "tokens": manifest["totals"]["tokens"],
        "totals": manifest["totals"], "skipped": manifest["skipped"],
        "shard_sha256": [shard["parquet"]["sha256"] for shard in manifest["shards"]],
        "statistics": manifest["statistics"],
        "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))


def measure_reference(spec: dict) -> None:
    """Child mode: google-research/bert's create_pretraining_data.main() on spec's sentence file, as JSON figures."""
    import tensorflow

    sys.modules["tensorflow"] = tensorflow.compat.v1   # the reference's tf.flags, tf.gfile, tf.python_io, ...
    tf = tensorflow.compat.v1
    tf.logging.set_verbosity(tf.logging.WARN)
    from bert import create_pretraining_data as reference

    reference.FLAGS([sys.argv[0], f"--input_file={spec['input']}", f"--output_file={spec['output']}",
                     f"--vocab_file={VOCAB}", "--do_lower_case=True", "--max_seq_length=128",
                     "--max_predictions_per_seq=20", "--masked_lm_prob=0.15", "--random_seed=12345",
                     "--dupe_factor=5", "--short_seq_prob=0.1"])
    reference.tf.logging.info = lambda *args, **kwargs: None   # it logs its first 20 instances token by token
    started = time.perf_counter()
    reference.main(None)
    wall = time.perf_counter() - started
    instances = tokens = random_next = 0
    for record in tf.python_io.tf_record_iterator(spec["output"]):
        example = tf.train.Example.FromString(record)
        instances += 1
        tokens += sum(example.features.feature["input_mask"].int64_list.value)
        random_next += example.features.feature["next_sentence_labels"].int64_list.value[0]
    print(json.dumps({"wall_s": wall, "instances": instances, "tokens": tokens,
                      "random_next_share": random_next / max(instances, 1),
                      "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def write_reference_input(books: Path, target: Path) -> None:
    """The reference's input format: one sentence per line, a blank line between documents (our reader's books,
    cut into sentences by our segmenter), so both sides start from the same documents and sentences."""
    from data_prep.documents import Document
    from data_prep.readers import read_documents
    from data_prep.segmentation import split_paragraphs_into_sentences

    with open(target, "w", encoding="utf-8") as out:
        for path in sorted(books.iterdir()):
            for item in read_documents(str(path), "books", path.name):
                if isinstance(item, Document):
                    out.write("\n".join(split_paragraphs_into_sentences(item.paragraphs)) + "\n\n")


def reference_available(python: str) -> bool:
    probe = "import tensorflow, bert.create_pretraining_data"
    return subprocess.run([python, "-c", probe], capture_output=True, env={**os.environ, **ONE_CORE_ENV},
                          check=False).returncode == 0


def run_reference(python: str, books: Path, root: Path) -> dict:
    sentences, output = root / "reference.sentences.txt", root / "reference.tfrecord"
    write_reference_input(books, sentences)
    spec = {"input": str(sentences), "output": str(output)}
    result = subprocess.run([python, __file__, "--measure-reference", json.dumps(spec)], capture_output=True,
                            text=True, env={**os.environ, **ONE_CORE_ENV}, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def corpus_copies(corpora: Path, root: Path, copies: int) -> Path:
    """`copies` copies of every corpus folder under distinct names, as links to the same files."""
    target = root / f"corpora_x{copies}"
    for copy in range(copies):
        for folder in sorted(p for p in corpora.iterdir() if p.is_dir()):
            for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
                link = target / f"copy{copy}" / folder.name / path.relative_to(folder)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(path.resolve())
    return target


def text_bytes(folder: Path) -> int:
    """Bytes of text the input files hold, decompressed (bz2 and gzip by their magic bytes)."""
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb") as raw:
            magic = raw.read(3)
        opener = bz2.open if magic == b"BZh" else gzip.open if magic[:2] == b"\x1f\x8b" else open
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                total += len(chunk)
    return total


def run_job(inputs: str, out: Path, beam_args: list[str], *extra: str, checkout: Path | None = None) -> dict:
    """One job in a fresh process; `checkout`: run another checkout's data_prep (a baseline in the same run)."""
    argv = [f"inputs=[{inputs}]", f"output_dir={out}", *SETTINGS, *extra, *beam_args]
    env = {**os.environ, **ONE_CORE_ENV}   # one tokenizer thread per process: per-core figures
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    result = subprocess.run([sys.executable, __file__, "--measure", json.dumps(argv)], capture_output=True,
                            text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def largest_process_mb(result: dict) -> float:
    return max(result["peak_rss_mb_self"], result["peak_rss_mb_largest_child"])


def per_core_against_reference(books: Path, root: Path, reference_python: str, baseline: Path | None) -> None:
    inputs = f"{{path: '{books}/', format: books}}"
    ours = run_job(inputs, root / "out_books", IN_PROCESS)
    rate = ours["tokens"] / ours["wall_s"]
    print(f"== per core: the {len(list(books.iterdir()))} Gutenberg books, one process, one core")
    print(f"ours: {ours['instances']:,} instances, {ours['tokens']:,} output tokens in {ours['wall_s']:.1f} s = "
          f"{rate:,.0f} tokens/s; random-next share {ours['statistics']['random_next_share']:.4f}; "
          f"peak RSS {ours['peak_rss_mb_self']:.0f} MB", flush=True)
    if baseline is not None:
        old = run_job(inputs, root / "out_books_baseline", IN_PROCESS, checkout=baseline)
        print(f"baseline checkout {baseline} (same run): {old['tokens'] / old['wall_s']:,.0f} tokens/s, peak RSS "
              f"{old['peak_rss_mb_self']:.0f} MB; ours / baseline {rate / (old['tokens'] / old['wall_s']):.2f}x; "
              f"shards byte-identical: {old['shard_sha256'] == ours['shard_sha256']}", flush=True)
    if not reference_available(reference_python):
        print(f"reference not installed for {reference_python} (pip install -e '.[bench]'): no ratio")
        return
    ref = run_reference(reference_python, books, root)
    ref_rate = ref["tokens"] / ref["wall_s"]
    print(f"reference (same run): {ref['instances']:,} instances, {ref['tokens']:,} output tokens in "
          f"{ref['wall_s']:.1f} s = {ref_rate:,.0f} tokens/s; random-next share {ref['random_next_share']:.4f}; "
          f"peak RSS {ref['peak_rss_mb_self']:.0f} MB")
    print(f"ratio ours / reference, per core: {rate / ref_rate:.2f}x", flush=True)


def memory_and_wall_time(corpora: Path, root: Path, copies: int) -> None:
    results = {}
    for n in (1, copies):
        folder = corpus_copies(corpora, root, n)
        gigabytes = text_bytes(folder) / 1e9
        result = run_job(f"{folder}/", root / f"out_x{n}", TWO_WORKERS)
        shutil_rmtree(root / f"out_x{n}")
        results[n] = result
        print(f"== {n}x the corpora ({gigabytes:.3f} GB of text), DirectRunner, 2 worker processes")
        print(f"{result['totals']['documents']:,} documents, {result['instances']:,} instances, {result['tokens']:,} "
              f"output tokens in {result['wall_s']:.1f} s: {result['tokens'] / result['wall_s'] / 2:,.0f} output "
              f"tokens/s per core, {result['wall_s'] / gigabytes:.1f} s per GB; peak RSS of the largest process "
              f"{largest_process_mb(result):,.0f} MB (launcher {result['peak_rss_mb_self']:,.0f} MB, largest worker "
              f"{result['peak_rss_mb_largest_child']:,.0f} MB); skipped {result['skipped']}", flush=True)
    ratio = largest_process_mb(results[copies]) / largest_process_mb(results[1])
    print(f"peak RSS of the largest process, {copies}x / 1x: {ratio:.2f} (goal <= 1.30; under 2,048 MB)")


def shutil_rmtree(path: Path) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def compare_dask_with_direct(corpora: Path, root: Path) -> None:
    folder = corpus_copies(corpora, root, 1)
    direct = run_job(f"{folder}/", root / "out_direct", TWO_WORKERS)
    dask = run_job(f"{folder}/", root / "out_dask", [], "dask.cluster=local", "dask.workers=2")
    print("== Dask vs DirectRunner: 1x the corpora, 2 workers each, start-up included")
    for name, r in (("DirectRunner, multi_processing, 2 workers", direct), ("DaskRunner, LocalCluster of 2", dask)):
        print(f"{name}: {r['wall_s']:.1f} s, {r['instances']:,} instances, {r['tokens'] / r['wall_s']:,.0f} tokens/s")
    same_shards = direct["shard_sha256"] == dask["shard_sha256"]
    print(f"Dask / Direct wall time: {dask['wall_s'] / direct['wall_s']:.2f}x; shards byte-identical: {same_shards} "
          f"({len(dask['shard_sha256'])} shards); manifest totals equal: {direct['totals'] == dask['totals']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_data_flag(parser)
    parser.add_argument("--copies", type=int, default=4, help="the larger corpus for the memory figure: N x 1x")
    parser.add_argument("--reference-python", default=sys.executable,
                        help="interpreter with the bench extra (tensorflow-cpu, bert-tensorflow) for the reference")
    parser.add_argument("--skip-reference", action="store_true", help="only the memory and wall-time figures")
    parser.add_argument("--baseline-checkout", type=Path, default=None,
                        help="another checkout (e.g. a git worktree of an older commit) whose data_prep runs the "
                             "per-core job too, in the same run")
    parser.add_argument("--skip-memory", action="store_true", help="only the per-core figures against the reference")
    parser.add_argument("--dask-vs-direct", action="store_true",
                        help="only compare the DaskRunner (LocalCluster, 2 workers) with the DirectRunner (2 workers)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-reference", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(json.loads(args.measure))
        return
    if args.measure_reference:
        measure_reference(json.loads(args.measure_reference))
        return
    corpora = shared_path(args, "corpora")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.dask_vs_direct:
            compare_dask_with_direct(corpora, root)
            return
        if not args.skip_reference:
            per_core_against_reference(corpora / "gutenberg", root, args.reference_python,
                                       args.baseline_checkout and args.baseline_checkout.resolve())
        if not args.skip_memory:
            memory_and_wall_time(corpora, root, args.copies)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
