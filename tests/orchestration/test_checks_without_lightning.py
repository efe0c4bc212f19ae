"""The pre-flight checks, and the workflow's plan, which runs them for every stage before it launches any, work
without importing Lightning: `import pytorch_lightning` costs about 4.5 CPU-seconds beyond torch's, paid by every
`workflow.py` command (a plan answered in 6 s instead of 9) and every refusal of a stage's settings."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Lightning made unimportable in this process: whatever imports it fails with ImportError.
NO_LIGHTNING = ("import sys\n"
                "for name in ('pytorch_lightning', 'lightning_fabric', 'lightning', 'deepspeed'):\n"
                "    sys.modules[name] = None\n")


def test_the_checks_import_no_lightning():
    code = NO_LIGHTNING + ("import pipeline.pretraining.checks, pipeline.finetuning.checks\n"
                           "import pipeline.orchestration.stage_config\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)


def test_the_workflow_plan_checks_every_stage_without_lightning(tmp_path):
    code = NO_LIGHTNING + ("import runpy\n"
                           f"sys.argv = ['pipeline/workflow.py', '+workflow=tiny', 'workflow.action=plan',"
                           f" 'workflow.root={tmp_path}']\n"
                           "runpy.run_path('pipeline/workflow.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "7 of 7 stages would run" in done.stdout
