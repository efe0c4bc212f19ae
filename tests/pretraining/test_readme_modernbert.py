"""The README's ModernBERT demo runs exactly as written, from the repository root: data prep of the bundled sample,
ModernBERT-tiny pre-trained on it and exported, then fine-tuned on the bundled SST-2 sample."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_RUN = REPO_ROOT / "outputs" / "train" / "modern_demo"


def readme_demo() -> str:
    """The README's command that starts with the sample_modern data prep (continued lines joined)."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    (command,) = [line.strip() for line in text.splitlines()
                  if line.startswith("python data_prep/run.py preset=sample_modern &&")]
    return command


@pytest.mark.slow
def test_the_modernbert_demo_runs_as_written():
    command = readme_demo()
    assert "model=modernbert_tiny" in command and "pipeline/finetune.py task=sst2" in command
    # The demo's own run directory: a run already there would be resumed or refused, not made anew.
    shutil.rmtree(DEMO_RUN, ignore_errors=True)
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    result = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    config = json.loads((DEMO_RUN / "hf_export" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    assert re.search(r"step 150: loss [0-9.]+, mlm_acc [0-9.]+", result.stdout)
    accuracy = float(re.search(r"sst2 after \d+ steps: dev: acc ([0-9.]+)", result.stdout).group(1))
    assert 0.0 < accuracy <= 1.0
