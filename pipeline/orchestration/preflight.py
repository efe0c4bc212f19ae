"""Every stage checked at the shape it declares, before anything runs: its composed config goes through its entry
point's own pre-flight checks, at the number of processes its resources give (nodes x processes per node).

- data prep: the settings (data_prep.config), the runner choice, and that every input path matches files;
- pre-training: pipeline.pretraining.checks.preflight at the stage's world size: the global batch over the
  processes, the schedule, strategy x optimizer x precision, the phase-2 init, the W&B mode and key;
- fine-tuning: the task, its split files (from data.dir, data.<split> or the environment variable its config
  reads, e.g. GLUE_DIR), the batch over the processes, the W&B mode and key.

What needs an upstream stage's output (the shard set's manifest, the weights to fine-tune) is checked by the entry
point itself when the stage starts.
"""
from __future__ import annotations

from typing import Any

from pipeline.orchestration.spec import Stage, WorkflowError, ranks_per_node


def check_stage(stage: Stage, cfg: Any, data_prep_args: tuple[str, ...] = ()) -> None:
    """Raises WorkflowError naming the stage and what to change."""
    try:
        if stage.entry == "data_prep":
            _check_data_prep(cfg, data_prep_args)
        elif stage.entry == "train":
            from omegaconf import OmegaConf

            from pipeline.pretraining.checks import preflight
            # without the workflow's ckpt_path=auto, which would stand in for a phase-2 init that is missing
            preflight(OmegaConf.merge(cfg, {"ckpt_path": None}), world_size=stage.world_size)
        elif stage.entry == "finetune":
            from pipeline.finetuning.checks import preflight
            preflight(cfg, world_size=stage.world_size)
    except (ValueError, FileNotFoundError) as error:
        shape = (f"{stage.resources['nodes']} node(s) x {ranks_per_node(stage.resources)} process(es)"
                 if stage.entry in ("train", "finetune") else "its settings")
        raise WorkflowError(f"stage {stage.name} ({stage.entry}) refused at {shape}: {error}") from None


def _check_data_prep(cfg: Any, beam_args: tuple[str, ...]) -> None:
    from omegaconf import OmegaConf

    from data_prep.config import PrepConfig
    from data_prep.dask_cluster import DaskSettings, check_runner_choice
    from data_prep.plan import expand_inputs

    raw = OmegaConf.to_container(cfg, resolve=True)
    dask = DaskSettings.from_dict(raw.pop("dask", None))
    config = PrepConfig.from_dict(raw)
    check_runner_choice(dask, [a for a in beam_args if a.startswith("-")])
    expand_inputs(config.inputs)

