"""The command each stage runs: an entry point of this repository (data_prep/run.py, pipeline/train.py,
pipeline/finetune.py) or a workflow step (export, report), with the stage's own overrides followed by the ones the
workflow derives from its inputs and outputs (paths, the phase-2 init checkpoint, the W&B group).

`check_entry_configs` composes each entry point's own config with those overrides, so that a misspelt key or
group fails here, before anything runs or is submitted.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from data_prep.presets import PRESET_DIR, split_preset
from pipeline.core.app import REPO_ROOT, TRAINING_CONFIGS
from pipeline.orchestration.spec import Stage, Workflow, WorkflowError

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
# The keys the workflow sets from a stage's inputs and outputs; a stage's own overrides must leave them alone.
WIRED_KEYS = {
    "data_prep": ("output_dir",),
    "train": ("data.path", "hydra.run.dir", "init_from_checkpoint", "ckpt_path", "output_dir"),
    "finetune": ("init", "hydra.run.dir", "output_dir"),
}


@dataclasses.dataclass(frozen=True)
class StageCommand:
    """What a stage runs and what it leaves when it is complete (paths relative to its output directory)."""
    argv: tuple[str, ...]               # argv[0] is the interpreter; the rest is what the hash covers
    output_dir: Path
    complete_when: tuple[str, ...]      # files that exist once the stage has finished
    parallel_ranks: bool = False        # train/finetune: under SLURM, started by srun (one task per GPU)


def stage_command(workflow: Workflow, stage: Stage, python: str) -> StageCommand:
    out = workflow.output_dir(stage)
    inputs = {role: workflow.output_dir(source) for role, source in stage.inputs.items()}
    _refuse_wired_keys(stage)
    if stage.entry == "data_prep":
        return StageCommand((python, "data_prep/run.py", *stage.overrides, f"output_dir={out}",
                             *data_prep_runner_args(workflow)), out, ("manifest.json",))
    if stage.entry == "train":
        wired = [f"data.path={inputs['shards']}", f"hydra.run.dir={out}"]
        if "init" in inputs:
            wired.append(f"init_from_checkpoint={inputs['init'] / LAST_CHECKPOINT}")
        return StageCommand((python, "pipeline/train.py", *stage.overrides, *wired, *_logger_args(workflow),
                             *_device_args(stage)), out, (str(LAST_CHECKPOINT),), parallel_ranks=True)
    if stage.entry == "export":
        tokenizer = inputs.get("tokenizer")
        argv = [python, "-m", "pipeline.orchestration.export_stage", f"--run={inputs['checkpoint']}", f"--output={out}"]
        if tokenizer is not None:
            argv.append(f"--tokenizer={tokenizer}")
        return StageCommand(tuple(argv), out, ("config.json", "model.safetensors", "vocab.txt"))
    if stage.entry == "finetune":
        wired = [f"init={inputs['init']}", f"hydra.run.dir={out}"]
        if not any(o.startswith("data.cache_dir=") for o in stage.overrides):
            wired.append(f"data.cache_dir={workflow.state_dir / 'datasets_cache'}")   # kept with the workflow
        return StageCommand((python, "pipeline/finetune.py", *stage.overrides, *wired, *_logger_args(workflow),
                             *_device_args(stage)), out, ("metrics.json",), parallel_ranks=True)
    if stage.entry == "report":
        return StageCommand((python, "-m", "pipeline.orchestration.report", f"--plan={workflow.state_dir / 'plan.json'}"),
                            out, ("report.md", "stages.csv", "scores.csv"))
    raise WorkflowError(f"stage {stage.name}: unknown entry {stage.entry!r}")


def _refuse_wired_keys(stage: Stage) -> None:
    for override in stage.overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in WIRED_KEYS.get(stage.entry, ()):
            raise WorkflowError(f"stage {stage.name}: {key} is set by the workflow (from the stage's inputs and "
                                f"outputs under workflow.root); remove {override!r} from its overrides")


def data_prep_runner_args(workflow: Workflow) -> list[str]:
    """direct: Beam pipeline options as given. dask: data prep's own keys, with which the job starts and stops its
    own Dask cluster (a LocalCluster, or SLURM workers through dask-jobqueue)."""
    settings = workflow.data_prep
    runner = settings.get("runner", "direct")
    if runner == "direct":
        return [str(a) for a in settings.get("beam_args") or ()]
    if runner == "dask":
        dask = settings.get("dask") or {}
        if dask.get("cluster", "local") not in ("local", "slurm"):
            raise WorkflowError(f"workflow.data_prep.dask.cluster={dask.get('cluster')!r}: choose local or slurm")
        return [f"dask.cluster={dask.get('cluster', 'local')}", f"dask.workers={int(dask.get('workers', 2))}"]
    raise WorkflowError(f"workflow.data_prep.runner={runner!r}: choose direct or dask")


def _logger_args(workflow: Workflow) -> list[str]:
    args = []
    if workflow.wandb_group:
        args.append(f"logger.group={workflow.wandb_group}")
    if workflow.wandb_mode:
        args.append(f"logger.mode={workflow.wandb_mode}")
    return args


def _device_args(stage: Stage) -> list[str]:
    """GPU stages: the trainer takes its geometry from the stage's resources, as infra/slurm/train.sbatch does from
    SLURM's (one process per GPU)."""
    if stage.resources.gpus_per_node <= 0:
        return []
    return ["trainer.accelerator=gpu", f"trainer.devices={stage.resources.gpus_per_node}",
            f"trainer.num_nodes={stage.resources.nodes}"]


# ----------------------------------------------------------------------------------------------------------
# checking the entry points' configs before anything runs

def check_entry_configs(workflow: Workflow, commands: dict[str, StageCommand]) -> None:
    """Compose each stage's entry-point config with its overrides (no run, no import of torch or Beam)."""
    for stage in workflow.stages:
        if stage.entry not in ("data_prep", "train", "finetune"):
            continue
        overrides = [a for a in commands[stage.name].argv[2:] if not a.startswith("-")]
        try:
            if stage.entry == "data_prep":
                _compose_data_prep(overrides)
            else:
                _compose(TRAINING_CONFIGS, stage.entry if stage.entry == "train" else "finetune", overrides)
        except WorkflowError as error:
            raise WorkflowError(f"stage {stage.name} ({stage.entry}): {error}") from None


def _compose(config_dir: Path, config_name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as error:
        message = str(error)
        if any(o.startswith("dask.") for o in overrides) and "dask" in message:
            message += (" -- workflow.data_prep.runner=dask passes dask.cluster and dask.workers to data prep, "
                        "whose config does not have them here: it needs data prep's Dask runner")
        raise WorkflowError(message) from None
    missing = _missing_keys(OmegaConf.to_container(cfg, resolve=False))
    if missing:
        raise WorkflowError(f"{', '.join(missing)} not set (add it to the stage's overrides)")
    return cfg


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Mandatory values left unset (???), found without resolving interpolations (their resolvers live in the
    entry points)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() if key != "hydra"
                for k in _missing_keys(value, f"{prefix}{key}.")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _missing_keys(value, f"{prefix}{i}.")]
    return [prefix.rstrip(".")] if node == "???" else []


def _compose_data_prep(overrides: list[str]):
    try:
        preset, rest = split_preset(overrides)
    except ValueError as error:
        raise WorkflowError(f"data prep: {error}") from error
    return _compose(PRESET_DIR, preset, rest)


def relative_to_repo(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
