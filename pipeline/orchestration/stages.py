"""Each stage as its entry point runs it: the entry point's own config composed with the stage's overrides (so a
misspelt key or group fails here, before anything runs), the stage's identity (identity.py), and the command line,
whose paths the stage runner fills in from the stage's inputs when the stage starts (stage.py).

Three kinds of overrides reach an entry point: the stage's own (conf/workflow/), the workflow's operational ones
(W&B group and mode, devices from the stage's resources, data prep's runner options), and the wired paths (its
inputs' run directories and its own). Only the first kind can shape a result; identity.py keeps the composed config
minus what shapes none, whichever kind set it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from data_prep.presets import PRESET_DIR, split_preset
from pipeline.core.app import TRAINING_CONFIGS
from pipeline.orchestration import identity
from pipeline.orchestration.spec import Stage, Workflow, WorkflowError

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
# The keys the workflow sets from a stage's inputs and outputs; a stage's own overrides must leave them alone.
WIRED_KEYS = {
    "data_prep": ("output_dir",),
    "train": ("data.path", "hydra.run.dir", "init_from_checkpoint", "ckpt_path", "output_dir"),
    "finetune": ("init", "hydra.run.dir", "output_dir"),
}
CURRENT = "current"       # <root>/<stage>/current: the run directory of the stage's latest finished version


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage as the Snakefile and the stage runner see it (it travels as JSON in the launch's spec file)."""
    name: str
    entry: str
    inputs: dict[str, str]            # role -> the stage that produces it
    overrides: list[str]              # the stage's own overrides of its entry point's config
    operational: list[str]            # the workflow's: W&B, devices, runner options
    env: dict[str, str]
    identity: str                     # hash of `document`; a rule parameter of the stage
    document: dict[str, Any]          # the composed config minus what shapes no result, and the code version
    resources: dict[str, Any]
    upstream: list[str]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "StageSpec":
        return cls(**{field.name: raw[field.name] for field in dataclasses.fields(cls)})


def refuse_wired_keys(stage: Stage) -> None:
    for override in stage.overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in WIRED_KEYS.get(stage.entry, ()):
            raise WorkflowError(f"stage {stage.name}: {key} is set by the workflow (from the stage's inputs and "
                                f"outputs under workflow.root); remove {override!r} from its overrides")


def operational_overrides(workflow: Workflow, stage: Stage) -> list[str]:
    """What the workflow adds to a stage that shapes no result: where its W&B run goes, how many processes it
    has, how data prep runs."""
    if stage.entry == "data_prep":
        return list(workflow.data_prep_args)
    if stage.entry not in ("train", "finetune"):
        return []
    args = [f"logger.name={workflow.name}/{stage.name}"]
    if workflow.wandb_group:
        args.append(f"logger.group={workflow.wandb_group}")
    if workflow.wandb_mode:
        args.append(f"logger.mode={workflow.wandb_mode}")
    resources = stage.resources
    if resources.gpus_per_node > 0:
        # One process per GPU, as infra/slurm/train.sbatch starts them
        args += ["trainer.accelerator=gpu", f"trainer.devices={resources.ranks_per_node}",
                 f"trainer.num_nodes={resources.nodes}"]
    elif resources.world_size > 1:
        args += ["trainer.accelerator=cpu", f"trainer.devices={resources.ranks_per_node}",
                 f"trainer.num_nodes={resources.nodes}"]
    if stage.entry == "finetune":
        args.append(f"data.cache_dir={workflow.state_dir / 'datasets_cache'}")   # kept with the workflow
    return args


def wired_overrides(entry: str, inputs: Mapping[str, Path], run_dir: Path) -> list[str]:
    """The paths of a stage's command: its inputs' run directories and its own."""
    if entry == "data_prep":
        return [f"output_dir={run_dir}"]
    if entry == "train":
        wired = [f"data.path={inputs['shards']}", f"hydra.run.dir={run_dir}", "ckpt_path=auto"]
        if "init" in inputs:
            wired.append(f"init_from_checkpoint={inputs['init'] / LAST_CHECKPOINT}")
        return wired
    if entry == "finetune":
        return [f"init={inputs['init']}", f"hydra.run.dir={run_dir}"]
    if entry == "export":
        wired = [f"--run={inputs['checkpoint']}", f"--output={run_dir}"]
        if "tokenizer" in inputs:
            wired.append(f"--tokenizer={inputs['tokenizer']}")
        return wired
    raise WorkflowError(f"no command for entry {entry!r}")


def entry_argv(spec: StageSpec, inputs: Mapping[str, Path], run_dir: Path) -> list[str]:
    """The entry point's command line (after the interpreter)."""
    program = {"data_prep": ["data_prep/run.py"], "train": ["pipeline/train.py"],
               "finetune": ["pipeline/finetune.py"], "export": ["-m", "pipeline.orchestration.export_stage"]}
    return [*program[spec.entry], *spec.overrides, *wired_overrides(spec.entry, inputs, run_dir), *spec.operational]


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """The stage's environment while its config is composed: ${task_data_dir:GLUE_DIR,...} reads it."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compose_stage(workflow: Workflow, stage: Stage):
    """The stage's entry-point config, as it will run (its inputs' paths stand in as <root>/<input>/current); None
    for the stages without one (export, report)."""
    refuse_wired_keys(stage)
    if stage.entry not in ("data_prep", "train", "finetune"):
        return None
    inputs = {role: workflow.stage_dir(source) / CURRENT for role, source in stage.inputs.items()}
    run_dir = workflow.stage_dir(stage) / CURRENT
    overrides = [*stage.overrides, *wired_overrides(stage.entry, inputs, run_dir),
                 *operational_overrides(workflow, stage)]
    # Beam options are not config; Hydra's run directory is output_dir once composed outside a Hydra app
    overrides = [o for o in overrides if not o.startswith(("-", "hydra."))]
    try:
        with environment(workflow.env):
            if stage.entry == "data_prep":
                preset, rest = split_preset(overrides)
                return _compose(PRESET_DIR, preset, rest)
            return _compose(TRAINING_CONFIGS, stage.entry, [*overrides, f"output_dir={run_dir}"])
    except (WorkflowError, ValueError) as error:
        raise WorkflowError(f"stage {stage.name} ({stage.entry}): {error}") from None


def _compose(config_dir: Path, config_name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=overrides)
        missing = _missing_keys(OmegaConf.to_container(cfg, resolve=False))
        if missing:
            raise WorkflowError(f"{', '.join(missing)} not set (add it to the stage's overrides)")
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise WorkflowError(str(error)) from None
    return cfg


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Mandatory values left unset (???)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() if key != "hydra" for k in _missing_keys(value, f"{prefix}{key}.")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _missing_keys(value, f"{prefix}{i}.")]
    return [prefix.rstrip(".")] if node == "???" else []


def stage_specs(workflow: Workflow, check_shapes: bool = True) -> dict[str, StageSpec]:
    """Every stage composed, checked at its declared shape (preflight.py) and given its identity; raises
    WorkflowError on the first stage that does not pass."""
    from omegaconf import OmegaConf

    from pipeline.orchestration.preflight import check_stage

    specs = {}
    for stage in workflow.stages:
        cfg = compose_stage(workflow, stage)
        if check_shapes and cfg is not None:
            with environment(workflow.env):
                check_stage(stage, cfg, workflow.data_prep_args)
        config = OmegaConf.to_container(cfg, resolve=True) if cfg is not None else {}
        document = identity.identity_document(stage.entry, config)
        specs[stage.name] = StageSpec(
            name=stage.name, entry=stage.entry, inputs=dict(stage.inputs), overrides=list(stage.overrides),
            operational=operational_overrides(workflow, stage), env=dict(workflow.env),
            identity=identity.identity_hash(document), document=document,
            resources=dataclasses.asdict(stage.resources), upstream=list(stage.upstream))
    return specs
