"""The export stage: a pre-training run's final weights as a Hugging Face BERT directory, for transformers and for
pipeline/finetune.py (init=DIR); see pipeline/pretraining/export.py."""
from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from pipeline.pretraining.export import export_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="the pre-training run directory")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="vocab.txt or a directory with it (a shard set); default: the run's hf_export/")
    args = parser.parse_args(argv)
    print(f"exported {args.run} -> {export_run(args.run.resolve(), args.output.resolve(), args.tokenizer)}")


if __name__ == "__main__":
    main()
