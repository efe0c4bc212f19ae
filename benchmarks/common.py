"""What the benchmark scripts share: where the real data comes from (one flag), and the repository's paths.

Benchmarks read real public data (corpora, GLUE, SQuAD) that the repository does not ship. They take its folder
from --shared-data (or $BERT_SHARED_DATA), never from a path outside the repository on their own:

    python benchmarks/bench_loader.py --shared-data ../shared/data
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def import_test_helpers() -> None:
    """Make tests/helpers importable (the benchmarks build their small shard sets as the tests do)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
