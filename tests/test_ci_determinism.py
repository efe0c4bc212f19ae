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
