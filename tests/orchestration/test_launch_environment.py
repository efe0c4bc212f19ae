"""The stages' environment (workflow.env: a W&B key beside data paths) is never written to the launch's config, which
any user of the machine may read: it records the names; the values go to Snakemake's process and the controller
job's environment (pipeline/orchestration/launch.py). That a SLURM stage job gets them: test_controller_start.py."""
from __future__ import annotations

import json

from pipeline.orchestration import launch
from pipeline.orchestration.stage_config import stage_specs
from pipeline.orchestration.workflow_config import load_workflow

SECRET = "wandb-key-0123456789abcdef"


def test_a_launch_record_names_the_environment_and_holds_none_of_its_values(tmp_path):
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'wf'}",
                              f"workflow.env.WANDB_API_KEY={SECRET}", f"workflow.env.GLUE_DIR={tmp_path / 'glue'}"])
    specs = stage_specs(workflow, check_shapes=False)
    config = launch.write_launch(workflow, specs, tmp_path / "code")
    text = config.read_text()
    assert SECRET not in text
    record = json.loads(text)
    assert record["environment"] == ["GLUE_DIR", "WANDB_API_KEY"]
    # what the processes get instead: Snakemake's environment here (run_local), the controller job's (submit_controller)
    assert launch.stage_environment(specs) == {"WANDB_API_KEY": SECRET, "GLUE_DIR": str(tmp_path / "glue")}
