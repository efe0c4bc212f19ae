"""The export stage: a pre-training run's final weights as a Hugging Face BERT directory, the workflow's model.

    python -m pipeline.orchestration.export_stage --run=<train stage dir> --output=DIR [--tokenizer=<shards dir>]

See pipeline/pretraining/export.py (export_run): DIR then loads in transformers and in pipeline/finetune.py (init=DIR).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from pipeline.pretraining.export import export_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="the pre-training run directory")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="vocab.txt or a directory with it (a shard set); default: the run's hf_export/")
    args = parser.parse_args(argv)
    out = export_run(args.run.resolve(), args.output.resolve(), args.tokenizer)
    print(f"exported {args.run} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
