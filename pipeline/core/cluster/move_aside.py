"""A rollback's later checkpoints moved aside before a job is submitted (pipeline/core/run/rollback.py says why and
where they go): under SLURM, train.sbatch resumes from the run's newest complete checkpoint at every start, whatever
ckpt_path was submitted, so the checkpoints later than the one to go back to leave first. Never under a live trainer of
the run: the command holds the run directory while it moves (run_dir_lock.py).

    python -m pipeline.core.cluster.move_aside <run dir> <checkpoint to go back to>   # prints the folder they went to
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from pipeline.core.cluster.run_dir_lock import hold_run_dir
from pipeline.core.run.rollback import find_rollback


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    run_dir, checkpoint = Path(args[0]), Path(args[1])
    if not checkpoint.exists():
        print(f"{checkpoint} does not exist", file=sys.stderr)
        return 2
    with hold_run_dir(run_dir):      # never under a live trainer of the run
        rollback = find_rollback(run_dir, checkpoint)
        if rollback is None:
            print(f"nothing of {run_dir} is later than {checkpoint}: nothing moved", file=sys.stderr)
            return 0
        aside = rollback.move_aside()
    print(aside)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.exit(main())
