"""Each stage's entry-point config (its own overrides, the workflow's settings, the paths of its inputs and run
directory), checked at its declared shape before anything runs, and given its identity; the stage's command line."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from pipeline.core.app import TRAINING_CONFIGS, compose_resolved
from pipeline.orchestration import identity, runs
from pipeline.orchestration.workflow_config import (
    ENTRY_SCRIPTS,
    INPUT_ROLES,
    Stage,
    Workflow,
    WorkflowError,
    ranks_per_node,
)

STAGE_UNSET = "add it to the stage's overrides"


def operational_overrides(workflow: Workflow, stage: Stage) -> list[str]:
    """What the workflow adds from its own settings: the W&B run, the processes (they shape a training's data
    stream), data prep's runner."""
    if stage.entry == "data_prep":
        return list(workflow.data_prep["args"])
    if stage.entry not in ("train", "finetune"):
        return []
    wandb = workflow.wandb or {}
    args = [f"logger.name={workflow.name}/{stage.name}"]
    args += [f"logger.{key}={wandb[key]}" for key in ("group", "mode") if wandb.get(key)]
    resources = stage.resources
    if resources["gpus_per_node"] > 0 or stage.world_size > 1:
        # One process per GPU, as infra/slurm/train.sbatch starts them
        args += [f"trainer.accelerator={'gpu' if resources['gpus_per_node'] else 'cpu'}",
                 f"trainer.devices={ranks_per_node(resources)}", f"trainer.num_nodes={resources['nodes']}"]
    if stage.entry == "finetune":
        args.append(f"data.cache_dir={workflow.state_dir / 'datasets_cache'}")   # kept with the workflow
    return args


def wired_overrides(entry: str, inputs: Mapping[str, Path], run_dir: Path) -> list[str]:
    """The paths of a stage's command: its inputs' run directories and its own."""
    if entry == "data_prep":
        return [f"output_dir={run_dir}"]
    if entry == "train":
        # save_last: its readers read checkpoints/last.ckpt; ckpt_path=auto: a requeued or relaunched stage resumes
        wired = [f"data.path={inputs['shards']}", f"hydra.run.dir={run_dir}", "ckpt_path=auto",
                 "callbacks.checkpoint.save_last=true"]
        wired += [f"init_from_checkpoint={inputs['init'] / runs.LAST_CHECKPOINT}"] if "init" in inputs else []
        # A run without checkpoints of its own yet starts from its resume input's; a requeue resumes its own
        return wired + ([f"resume.continue_from={inputs['resume'] / runs.LAST_CHECKPOINT}"] if "resume" in inputs
                        else [])
    if entry == "finetune":
        return [f"init={inputs['init']}", f"hydra.run.dir={run_dir}"]
    if entry == "export":
        return [f"--run={inputs['checkpoint']}", f"--output={run_dir}",
                *([f"--tokenizer={inputs['tokenizer']}"] if "tokenizer" in inputs else [])]
    raise WorkflowError(f"no command for entry {entry!r}")


def entry_argv(spec: Stage, inputs: Mapping[str, Path], run_dir: Path) -> list[str]:
    """The entry point's command line (after the interpreter)."""
    return [ENTRY_SCRIPTS[spec.entry], *spec.overrides, *wired_overrides(spec.entry, inputs, run_dir),
            *spec.operational]


def environment(env: Mapping[str, Any]) -> Any:
    """The stage's environment while its config is composed (${task_data_dir:GLUE_DIR,...} reads it), then the old."""
    return mock.patch.dict(os.environ, {key: str(value) for key, value in env.items() if value is not None})


def compose_stage(workflow: Workflow, stage: Stage):
    """The stage's entry-point config, as it will run (its inputs' paths stand in as <root>/<input>/current); None
    for the stages without one (export, report)."""
    if stage.entry not in ("data_prep", "train", "finetune"):
        return None
    inputs = {role: workflow.root / source / runs.CURRENT for role, source in stage.inputs.items()}
    run_dir = workflow.root / stage.name / runs.CURRENT
    # The keys the workflow sets from the stage's inputs and outputs: its own overrides must leave them alone
    wired = {o.split("=", 1)[0] for o in wired_overrides(stage.entry, dict.fromkeys(INPUT_ROLES[stage.entry], run_dir),
                                                         run_dir)}
    for override in stage.overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in wired | {"output_dir"}:
            raise WorkflowError(f"stage {stage.name}: {key} is set by the workflow (from the stage's inputs and "
                                f"outputs under workflow.root); remove {override!r} from its overrides")
    overrides = [*stage.overrides, *wired_overrides(stage.entry, inputs, run_dir),
                 *operational_overrides(workflow, stage)]
    # Beam options are not config; Hydra's run directory is output_dir once composed outside a Hydra app
    overrides = [o for o in overrides if not o.startswith(("-", "hydra."))]
    try:
        with environment(workflow.env):
            if stage.entry == "data_prep":
                from data_prep.presets import PRESET_DIR, split_preset
                preset, rest = split_preset(overrides)
                return compose_resolved(PRESET_DIR, preset, rest, STAGE_UNSET)
            return compose_resolved(TRAINING_CONFIGS, stage.entry, [*overrides, f"output_dir={run_dir}"], STAGE_UNSET)
    except (WorkflowError, ValueError) as error:
        raise WorkflowError(f"stage {stage.name} ({stage.entry}): {error}") from None


def stage_specs(workflow: Workflow, check_shapes: bool = True) -> dict[str, Stage]:
    """Every stage composed, checked at its declared shape (check_stage) and given its identity; raises
    WorkflowError on the first stage that does not pass."""
    from omegaconf import OmegaConf

    checksums = identity.Checksums(workflow.state_dir / "checksums.json", rehash=bool(workflow.rehash_inputs))
    rerun = set(workflow.rerun_code_changed)
    env = {key: str(value) for key, value in workflow.env.items() if value is not None}
    specs = {}
    for stage in workflow.stages:
        cfg = compose_stage(workflow, stage)
        if check_shapes and cfg is not None:
            with environment(workflow.env):
                check_stage(stage, cfg, workflow.data_prep["args"])
        config = OmegaConf.to_container(cfg, resolve=True) if cfg is not None else {}
        document = identity.identity_document(stage.entry, config, checksums)
        code = identity.code_version(stage.entry)
        ran = runs.read_json(workflow.root / stage.name / runs.CURRENT / runs.RECORD) or {}
        asked = stage.name in rerun or "all" in rerun
        specs[stage.name] = dataclasses.replace(
            stage, operational=operational_overrides(workflow, stage), env=env, document=document,
            identity=identity.identity_hash(document), code_version=code,
            rerun=code if asked and ran.get("finished") and ran.get("code_version") != code else None)
    checksums.save()                      # every stage passed: the next launch hashes only what changed
    return specs


def check_stage(stage: Stage, cfg: Any, data_prep_args: tuple[str, ...] = ()) -> None:
    """The stage's composed config through its entry point's own pre-flight checks at the stage's world size (what
    needs an upstream stage's output is checked when it starts); raises WorkflowError naming the stage."""
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
