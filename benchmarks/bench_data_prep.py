"""Data-prep benchmark: throughput per core against the reference run in the same script, memory at 1x vs 4x,
scaling over workers.

    pip install -e ".[bench]"        # the reference: bert-tensorflow (google-research/bert) on tensorflow-cpu
    python benchmarks/bench_data_prep.py --shared-data ../shared/data [--skip-scaling] [--scaling-copies 16]
        [--reference-python PYTHON]   # an interpreter that has the bench extra, if this one does not
    python benchmarks/bench_data_prep.py --shared-data ../shared/data --dask-vs-direct [--scaling-copies 16]   # needs the dask extra

--dask-vs-direct runs only this: the 16x corpus on Beam's DaskRunner (a LocalCluster of 2 worker processes,
started and stopped by the job: dask.cluster=local dask.workers=2) against the multi-processing DirectRunner with
2 workers; wall time of each (cluster start-up included) and whether the shards are byte-identical.

Input: the six Gutenberg books, read from raw text by us, so sentence splitting and tokenization are included.
The baseline is google-research/bert's create_pretraining_data.py (bert-tensorflow 1.0.4, its TF1 names taken
from tensorflow's compat.v1), run here, in this script, on the same books (1x and 4x), pre-split into sentences
by our reader and segmenter (that preparation is not timed), with the same vocabulary and settings (seq 128, 20
predictions, dupe_factor 5, seed 12345), on one core. Each measurement runs in a fresh process so that its peak
RSS is its own. Without the bench extra, the reference is skipped and said so.
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

from common import BUNDLED_VOCAB as VOCAB
from common import add_shared_data_flag, shared_path
ONE_CORE_ENV = {"RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def measure(argv: list[str]) -> None:
    """Child mode: run the job once and print its figures as JSON."""
    from data_prep.run import run
    started = time.perf_counter()
    manifest = run(argv)
    wall = time.perf_counter() - started
    print(json.dumps({
        "wall_s": wall,
        "instances": manifest["totals"]["instances"],
        "tokens": manifest["totals"]["tokens"],
        "totals": manifest["totals"],
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


def write_reference_input(corpus: Path, target: Path) -> None:
    """The reference's input format: one sentence per line, a blank line between documents (our reader's books,
    cut into sentences by our segmenter), so both sides start from the same documents and sentences."""
    from data_prep.documents import Document
    from data_prep.readers import read_documents
    from data_prep.segmentation import split_paragraphs_into_sentences

    with open(target, "w", encoding="utf-8") as out:
        for path in sorted(corpus.glob("*.txt")):
            for item in read_documents(str(path), "books", path.name):
                if isinstance(item, Document):
                    out.write("\n".join(split_paragraphs_into_sentences(item.paragraphs)) + "\n\n")


def reference_available(python: str) -> bool:
    probe = "import tensorflow, bert.create_pretraining_data"
    return subprocess.run([python, "-c", probe], capture_output=True, env={**os.environ, **ONE_CORE_ENV},
                          check=False).returncode == 0


def run_reference(python: str, corpus: Path, root: Path) -> dict:
    sentences, output = root / f"{corpus.name}.sentences.txt", root / f"{corpus.name}.tfrecord"
    write_reference_input(corpus, sentences)
    spec = {"input": str(sentences), "output": str(output)}
    result = subprocess.run([python, __file__, "--measure-reference", json.dumps(spec)], capture_output=True,
                            text=True, env={**os.environ, **ONE_CORE_ENV}, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    env = {**os.environ, **ONE_CORE_ENV}   # one tokenizer thread per process: per-core figures
    result = subprocess.run([sys.executable, __file__, "--measure", json.dumps(argv)], capture_output=True,
                            text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare_dask_with_direct(books: Path, copies: int) -> None:
    """The same job on the DaskRunner (LocalCluster, 2 workers) and on the DirectRunner (2 worker processes)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = replicate(books, root, copies)
        direct = run_job(corpus, root / "out_direct", copies, [
            "--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
        dask = run_job(corpus, root / "out_dask", copies, ["dask.cluster=local", "dask.workers=2"])
    print(f"== Dask vs DirectRunner: {copies}x the six books, 2 workers each, start-up included")
    for name, r in (("DirectRunner, multi_processing, 2 workers", direct), ("DaskRunner, LocalCluster of 2", dask)):
        print(f"{name}: {r['wall_s']:.1f} s, {r['instances']:,} instances, {r['tokens'] / r['wall_s']:,.0f} tokens/s")
    same_shards = direct["shard_sha256"] == dask["shard_sha256"]
    print(f"Dask / Direct wall time: {dask['wall_s'] / direct['wall_s']:.2f}x; shards byte-identical: {same_shards} "
          f"({len(dask['shard_sha256'])} shards); manifest totals equal: {direct['totals'] == dask['totals']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_data_flag(parser)
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--scaling-copies", type=int, default=16,
                        help="corpus copies for the 1 vs 2 worker run: large enough that start-up does not dominate")
    parser.add_argument("--reference-python", default=sys.executable,
                        help="interpreter with the bench extra (tensorflow-cpu, bert-tensorflow) for the reference")
    parser.add_argument("--dask-vs-direct", action="store_true",
                        help="only compare the DaskRunner (LocalCluster, 2 workers) with the DirectRunner (2 workers) "
                             "on --scaling-copies copies of the books")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-reference", help=argparse.SUPPRESS)
    args = parser.parse_args()
    books = None if args.measure or args.measure_reference else shared_path(args, "corpora", "books")
    if args.measure:
        measure(json.loads(args.measure))
        return
    if args.measure_reference:
        measure_reference(json.loads(args.measure_reference))
        return
    if args.dask_vs_direct:
        compare_dask_with_direct(books, args.scaling_copies)
        return

    with_reference = reference_available(args.reference_python)
    if not with_reference:
        print(f"reference not installed for {args.reference_python} (pip install -e '.[bench]'): "
              "our figures only, no ratios")
    in_process = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        throughput = {}
        for copies in (1, 4):
            corpus = replicate(books, root, copies)
            ours = run_job(corpus, root / f"out{copies}", copies, in_process)
            throughput[copies] = ours
            ours_rate = ours["tokens"] / ours["wall_s"]
            print(f"== throughput, {copies}x the six books: one process, one core (in-process DirectRunner, "
                  "1 tokenizer thread, Beam start-up included)")
            print(f"ours: {ours['instances']:,} instances, {ours['tokens']:,} output tokens in {ours['wall_s']:.2f} s = "
                  f"{ours_rate:,.0f} tokens/s; random-next share {ours['statistics']['random_next_share']:.4f}; "
                  f"peak RSS {ours['peak_rss_mb_self']:.0f} MB")
            if with_reference:
                ref = run_reference(args.reference_python, corpus, root)
                ref_rate = ref["tokens"] / ref["wall_s"]
                print(f"reference (same run): {ref['instances']:,} instances, {ref['tokens']:,} output tokens in "
                      f"{ref['wall_s']:.2f} s = {ref_rate:,.0f} tokens/s; random-next share "
                      f"{ref['random_next_share']:.4f}; peak RSS {ref['peak_rss_mb_self']:.0f} MB")
                print(f"ratio ours / reference, per core: {ours_rate / ref_rate:.2f}x")

        one, four = throughput[1], throughput[4]
        print("== memory: 4x the corpus (4 shards of the same size as the 1x run's one)")
        print(f"peak RSS 1x {one['peak_rss_mb_self']:.0f} MB, 4x {four['peak_rss_mb_self']:.0f} MB: "
              f"ratio {four['peak_rss_mb_self'] / one['peak_rss_mb_self']:.3f} (goal <= 1.20)")

        if not args.skip_scaling:
            copies = args.scaling_copies
            corpus = replicate(books, root, copies)
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
