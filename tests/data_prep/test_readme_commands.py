"""The README's data-prep commands on the bundled samples run exactly as written, from the repository root."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def readme_commands(marker: str) -> list[str]:
    """Shell commands of README.md that start with `python data_prep/run.py` and name `marker` (continued lines
    joined)."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.startswith("python data_prep/run.py") and marker in line]


@pytest.mark.slow
@pytest.mark.parametrize("output", ["outputs/shards/wikiextractor", "outputs/shards/sample_mlm"])
def test_readme_data_prep_command_runs_as_written(output):
    (command,) = [c for c in readme_commands("sample_corpus/") if f"output_dir={output}" in c]
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    result = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((REPO_ROOT / output / "manifest.json").read_text())
    assert manifest["totals"]["instances"] > 0
    if output.endswith("wikiextractor"):
        assert [i["format"] for i in manifest["inputs"]] == ["wikiextractor"]
        assert manifest["totals"]["documents"] + sum(manifest["skipped"].values()) == 38   # the sample's articles
    else:
        assert manifest["parameters"]["objective"] == "mlm" and manifest["statistics"]["mean_instance_length"] == 128
        assert sorted({i["format"] for i in manifest["inputs"]}) == ["books", "wikiextractor", "wikipedia"]
        assert re.search(r"objective +MLM only", result.stdout)
