"""A benchmark's child program (pipeline/train.py, data_prep/run.py) runs the checkout the benchmark runs from, not
whichever one pip's editable install or $PYTHONPATH names first (the study's pretrain stage once failed at once with
"No module named 'pipeline'": the install named a CI clone since deleted)."""
from __future__ import annotations

import subprocess
import sys


def test_a_child_imports_this_checkout_before_any_other(benchmarks_importable, tmp_path, monkeypatch):
    other = tmp_path / "other_checkout"
    (other / "pipeline").mkdir(parents=True)
    (other / "pipeline" / "__init__.py").write_text("raise ImportError('the other checkout was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(other))
    from common import REPO_ROOT, checkout_env

    env = checkout_env(OMP_NUM_THREADS="3")
    done = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.__file__)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(REPO_ROOT / "pipeline" / "__init__.py")
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["PYTHONPATH"].endswith(str(other))       # what was on the path stays, after the checkout

    # the same child without it finds the other checkout first: the test above is not passing by accident
    shadowed = subprocess.run([sys.executable, "-c", "import pipeline"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
    assert "the other checkout was imported" in shadowed.stderr
