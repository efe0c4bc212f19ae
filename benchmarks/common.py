"""What the benchmark scripts share: where the real data comes from (one flag), and the repository's paths.

Benchmarks read real public data (corpora, GLUE, SQuAD) that the repository does not ship. They take its folder
from --shared-data (or $BERT_SHARED_DATA), never from a path outside the repository on their own:

    python benchmarks/bench_loader.py --shared-data ../shared/data
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# A script run as `python benchmarks/x.py` has benchmarks/ on its path, not the root: the root makes the project
# importable where it is not installed (a GPU machine's run) and tests/helpers, which builds the benchmarks' shard sets.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from data_prep.known_noise import silence_known_noise  # noqa: E402

silence_known_noise()   # as the entry points do, before a benchmark imports Beam or Lightning (the apitools warning)

BUNDLED_VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"


def add_shared_data_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shared-data", type=Path, default=os.environ.get("BERT_SHARED_DATA"),
                        help="the folder of real data (corpora/, downstream/, vocab/); default $BERT_SHARED_DATA")


def shared_path(args: argparse.Namespace, *parts: str) -> Path:
    """<--shared-data>/<parts>; stops with a message saying what to pass where the flag is missing."""
    if args.shared_data is None:
        sys.exit("this benchmark reads real data the repository does not ship: pass --shared-data <folder with "
                 "corpora/ and downstream/> (here: ../shared/data) or set BERT_SHARED_DATA")
    path = Path(args.shared_data).joinpath(*parts)
    if not path.exists():
        sys.exit(f"{path} not found (--shared-data {args.shared_data})")
    return path


def at_least_one(text: str) -> int:
    """argparse type: a whole number of at least 1 (a count of steps, runs or rounds)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def checkout_env(**overrides: str) -> dict[str, str]:
    """The environment for a child program (pipeline/train.py, data_prep/run.py): this checkout first on its path.
    `python pipeline/train.py` imports `pipeline` from wherever pip installed the project, and an editable install
    follows the last `pip install -e` of any clone (a CI clone's, since deleted: the study's pretrain stage once failed
    at once with "No module named 'pipeline'"; with that clone still there it would have trained on other code)."""
    path = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **overrides}


def train_process(run_dir: Path, overrides: list[str], threads: int, append_log: bool = False) -> None:
    """`python pipeline/train.py <overrides> hydra.run.dir=<run_dir>` on `threads` threads, W&B off, its output in
    <run_dir>.log beside the run; stops the benchmark, naming the log, when the run fails."""
    import subprocess

    env = checkout_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), WANDB_MODE="disabled")
    command = [sys.executable, str(REPO_ROOT / "pipeline" / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "a" if append_log else "w") as handle:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}); see {log}")


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a training run's CSV log (<run_dir>/csv/metrics.csv), as train_process's runs write it."""
    with open(run_dir / "csv" / "metrics.csv") as handle:
        return list(csv.DictReader(handle))
