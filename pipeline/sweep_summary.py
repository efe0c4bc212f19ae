"""Entry point: the best dev score per task of fine-tuning sweeps, as the paper chooses it.

    python pipeline/sweep_summary.py outputs/finetune/multirun/2026-11-22/10-00-00 [more dirs] [--csv table.csv]

The summary itself: pipeline/finetuning/sweeps.py.
"""
import sys

from pipeline.finetuning.sweeps import main

if __name__ == "__main__":
    sys.exit(main())
