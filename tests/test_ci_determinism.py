"""CI runs Hypothesis derandomised (the same examples every run); local runs keep exploring."""
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_PROBE = "import tests.conftest; from hypothesis import settings; print(settings.default.derandomize)"


def _derandomized(environ: dict[str, str]) -> bool:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    result = subprocess.run([sys.executable, "-c", _PROBE], env={**env, **environ}, cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True)
    return result.stdout.strip() == "True"


def test_hypothesis_is_derandomized_when_ci_is_set():
    assert _derandomized({"CI": "true"})


def test_hypothesis_explores_locally():
    assert not _derandomized({})


def _collected(marker_expression: str, *paths: str) -> set[str]:
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", marker_expression, *paths], cwd=REPO_ROOT, capture_output=True, text=True)
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_ci_runs_the_readme_tests_in_two_parts_that_cover_them_once():
    """.ci/run runs the README's `-m "slow or not slow"` as the tests needing the real SLURM (directly or through a
    fixture) beside the others: together exactly the README's tests, each once."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert 'python -m pytest -m "slow or not slow"' in readme
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    parts = ['(slow or not slow) and slurm', '(slow or not slow) and not slurm']
    assert all(f'python -m pytest -m "{part}"' in ci for part in parts)
    files = ("tests/pretraining/test_slurm_requeue.py", "tests/orchestration/test_lock.py")
    everything = _collected("slow or not slow", *files)
    on_slurm, others = (_collected(part, *files) for part in parts)
    # test_both_ranks_losses_... needs SLURM only through its module fixture (the requeued job)
    assert any("test_both_ranks_losses_equal_an_uninterrupted_run_bitwise" in test for test in on_slurm)
    assert on_slurm and others and not on_slurm & others and on_slurm | others == everything
