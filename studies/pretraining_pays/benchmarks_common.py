"""The benchmarks' shared helpers (benchmarks/common.py: the --shared-data flag, this checkout's environment for a
child program, a training run and its CSV log), for the study's scripts and modules.

A script run as `python studies/pretraining_pays/<script>.py` has only its own folder on its path: this puts
benchmarks/ there too, and common.py the repository root.
"""
from __future__ import annotations

import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parent
_BENCHMARKS = STUDY.parents[1] / "benchmarks"
if str(_BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(_BENCHMARKS))

from common import REPO_ROOT, add_shared_data_flag, checkout_env, metrics_rows, shared_path, train_process  # noqa: E402,F401
