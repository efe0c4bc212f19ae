"""A workflow as data: its stages in order, what each one reads, and the resources it asks for.

`load_workflow(overrides)` composes conf/workflow/<name>.yaml with the command line's overrides and checks
everything that can be wrong with the stages themselves before anything runs (unknown stages, inputs that no earlier
stage produces, unknown entries or tasks). stages.py composes each stage's entry-point config; the Snakefile turns
the stages into rules.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from pipeline.core.app import CONFIG_ROOT, TRAINING_CONFIGS

CONFIG_DIR = CONFIG_ROOT          # the workflow's own root: +workflow=NAME picks conf/workflow/NAME.yaml
WORKFLOW_CONFIGS = CONFIG_DIR / "workflow"
TASK_CONFIGS = TRAINING_CONFIGS / "task"
STATE_DIR = "_workflow"          # <root>/_workflow/: the launches' stage specs, the controller's record and logs
REPORT_STAGE = "report"

# What each entry produces, and the inputs it takes (role -> what it must be given). A stage's input must name an
# earlier stage whose entry produces that kind of output.
PRODUCES = {"data_prep": "shards", "train": "checkpoint", "export": "model", "finetune": "scores",
            "report": "report"}
INPUT_ROLES = {
    "data_prep": {},
    "train": {"shards": ("shards",), "init": ("checkpoint",)},
    "export": {"checkpoint": ("checkpoint",), "tokenizer": ("shards",)},
    "finetune": {"init": ("model", "checkpoint")},
    "report": {},
}
REQUIRED_INPUTS = {"train": ("shards",), "export": ("checkpoint",), "finetune": ("init",)}
ACTIONS = ("run", "status", "plan", "report")
LAUNCHERS = ("local", "slurm")
OPEN_MAPS = ("workflow.env.", ".resources.", "workflow.downstream.per_task.")
DEFAULT_RESOURCES = {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": None, "cpus_per_task": 1, "mem": None,
                     "time": "01:00:00"}


class WorkflowError(ValueError):
    """A workflow that cannot run as configured; raised before anything runs or is submitted."""


@dataclasses.dataclass(frozen=True)
class Resources:
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None      # processes per node; default one per GPU, or one on a CPU node
    cpus_per_task: int = 1
    mem: str | None = None                 # sbatch --mem (per node): e.g. 64G; "0": all of the node's memory
    time: str = "01:00:00"

    @property
    def ranks_per_node(self) -> int:
        """One process per GPU (Lightning's SLURM contract), one on a CPU node, unless tasks_per_node says."""
        return self.tasks_per_node or max(1, self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    entry: str                               # data_prep | train | export | finetune | report
    inputs: dict[str, str]                   # role -> producing stage
    overrides: tuple[str, ...]               # Hydra overrides of the entry point's own config
    resources: Resources
    task: str | None = None                  # finetune stages: the conf/training/task/ name

    @property
    def upstream(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.inputs.values()))


@dataclasses.dataclass(frozen=True)
class Workflow:
    name: str
    root: Path
    launcher: str
    action: str
    stages: tuple[Stage, ...]
    wandb_group: str | None
    wandb_mode: str | None
    env: dict[str, str]
    data_prep_args: tuple[str, ...]
    retries: int
    slurm: dict[str, Any]
    config: dict[str, Any]                   # the resolved workflow config

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise WorkflowError(f"unknown stage {name!r}; stages of workflow {self.name}: {self.stage_names()}")

    def stage_names(self) -> str:
        return ", ".join(stage.name for stage in self.stages)

    def stage_dir(self, stage: str | Stage) -> Path:
        """<root>/<stage>/: the stage's run directories (one per version), its sentinel and `current`."""
        return self.root / (stage if isinstance(stage, str) else stage.name)


# ----------------------------------------------------------------------------------------------------------
# composing the config

def available_workflows() -> list[str]:
    return sorted(p.stem for p in WORKFLOW_CONFIGS.glob("*.yaml") if p.stem != "base")


def compose_workflow_config(overrides: Sequence[str]) -> DictConfig:
    """conf/workflow/<name>.yaml (picked by +workflow=NAME) with the overrides, under the key `workflow`."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # `workflow=NAME` reads naturally but there is no primary config to override: accept it as +workflow=NAME.
    overrides = [f"+{o}" if o.startswith("workflow=") else o for o in overrides]
    # Open maps (the environment, a stage's resources, per-task overrides) take any key: add or replace them without
    # Hydra's `+`/`++`.
    overrides = [f"++{o}" if o.startswith("workflow.") and any(m in o.split("=", 1)[0] for m in OPEN_MAPS) else o
                 for o in overrides]
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("+workflow=")]
    if not chosen:
        raise WorkflowError(f"which workflow? pass +workflow=NAME; available: {', '.join(available_workflows())} "
                            "(conf/workflow/)")
    if chosen[-1] not in available_workflows():
        raise WorkflowError(f"unknown workflow {chosen[-1]!r}; available: {', '.join(available_workflows())} "
                            "(conf/workflow/)")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name=None, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise WorkflowError(f"workflow config: {error}") from error


def load_workflow(overrides: Sequence[str] = ()) -> Workflow:
    from omegaconf.errors import OmegaConfBaseException

    cfg = compose_workflow_config(overrides)
    try:
        raw = OmegaConf.to_container(cfg.workflow, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        import re
        missing = re.search(r"Missing mandatory value: ([\w.]+)", str(error))
        if missing:
            raise WorkflowError(f"{missing.group(1)} is not set: pass {missing.group(1)}=... (conf/workflow/"
                                f"{cfg.workflow.get('name', '?')}.yaml leaves it to you)") from None
        raise WorkflowError(f"workflow config: {error}") from None
    return workflow_from_dict(raw)


def workflow_from_dict(raw: dict[str, Any]) -> Workflow:
    name = str(raw["name"])
    launcher, action = str(raw.get("launcher", "local")), str(raw.get("action", "run"))
    if launcher not in LAUNCHERS:
        raise WorkflowError(f"workflow.launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if action not in ACTIONS:
        raise WorkflowError(f"workflow.action={action!r}: choose one of {', '.join(ACTIONS)}")
    stages = [_stage_from_dict(stage_name, spec or {}) for stage_name, spec in (raw.get("stages") or {}).items()]
    stages += _downstream_stages(raw.get("downstream") or {}, {s.name for s in stages})
    if raw.get("report", True):
        stages.append(Stage(REPORT_STAGE, "report", {}, (), Resources(**{**DEFAULT_RESOURCES, "time": "00:10:00"})))
    check_stages(stages)
    wandb = raw.get("wandb") or {}
    retries = int(raw.get("retries", 0))
    if retries < 0:
        raise WorkflowError(f"workflow.retries={retries}: give 0 or more")
    return Workflow(
        name=name, root=Path(str(raw["root"])).expanduser().absolute(), launcher=launcher, action=action,
        stages=tuple(stages), wandb_group=wandb.get("group"), wandb_mode=wandb.get("mode"),
        env={k: str(v) for k, v in (raw.get("env") or {}).items() if v is not None},
        data_prep_args=tuple(str(a) for a in (raw.get("data_prep") or {}).get("args") or ()), retries=retries,
        slurm=dict(raw.get("slurm") or {}), config=raw)


def _resources(spec: dict[str, Any] | None, where: str) -> Resources:
    spec = dict(spec or {})
    unknown = sorted(set(spec) - set(DEFAULT_RESOURCES))
    if unknown:
        raise WorkflowError(f"{where}: unknown resources {unknown}; known: {', '.join(DEFAULT_RESOURCES)}")
    values = {**DEFAULT_RESOURCES, **{k: v for k, v in spec.items() if v is not None}}
    for key in ("nodes", "gpus_per_node", "cpus_per_task"):
        values[key] = int(values[key])
        if values[key] < (0 if key == "gpus_per_node" else 1):
            raise WorkflowError(f"{where}: resources.{key}={values[key]} is not a valid count")
    if values["tasks_per_node"] is not None:
        values["tasks_per_node"] = int(values["tasks_per_node"])
    values["mem"] = None if values["mem"] is None else str(values["mem"])
    values["time"] = str(values["time"])
    return Resources(**values)


STAGE_KEYS = ("entry", "inputs", "overrides", "resources")


def _stage_from_dict(name: str, spec: dict[str, Any]) -> Stage:
    unknown = sorted(set(spec) - set(STAGE_KEYS))
    if unknown:
        raise WorkflowError(f"stage {name}: unknown keys {unknown}; a stage has {', '.join(STAGE_KEYS)}")
    entry = spec.get("entry")
    if entry not in INPUT_ROLES or entry == "report":
        known = ", ".join(e for e in INPUT_ROLES if e != "report")
        raise WorkflowError(f"stage {name}: unknown entry {entry!r}; an entry is one of {known}")
    if entry == "finetune" and not any(str(o).startswith("task=") for o in spec.get("overrides") or ()):
        raise WorkflowError(f"stage {name}: a finetune stage needs task=NAME in its overrides "
                            "(or list the task in workflow.downstream.tasks)")
    task = next((str(o).split("=", 1)[1] for o in spec.get("overrides") or () if str(o).startswith("task=")), None)
    return Stage(name=name, entry=entry, inputs={str(k): str(v) for k, v in (spec.get("inputs") or {}).items()},
                 overrides=tuple(str(o) for o in spec.get("overrides") or ()),
                 resources=_resources(spec.get("resources"), f"stage {name}"), task=task)


def known_tasks() -> list[str]:
    return sorted(p.stem for p in TASK_CONFIGS.glob("*.yaml"))


def _downstream_stages(spec: dict[str, Any], existing: set[str]) -> list[Stage]:
    tasks = [str(t) for t in spec.get("tasks") or ()]
    unknown = [t for t in tasks if t not in known_tasks()]
    if unknown:
        raise WorkflowError(f"workflow.downstream.tasks: unknown task(s) {', '.join(unknown)}; known tasks: "
                            f"{', '.join(known_tasks())} (conf/training/task/)")
    per_task = {str(k): list(v or ()) for k, v in (spec.get("per_task") or {}).items()}
    stray = sorted(set(per_task) - set(tasks))
    if stray:
        raise WorkflowError(f"workflow.downstream.per_task names {', '.join(stray)}, which "
                            f"workflow.downstream.tasks does not list ({', '.join(tasks) or 'none'})")
    resources = _resources(spec.get("resources"), "workflow.downstream")
    stages = []
    for task in tasks:
        name = f"finetune_{task}"
        if name in existing:
            raise WorkflowError(f"stage {name} is both in workflow.stages and made from workflow.downstream.tasks")
        overrides = (f"task={task}", *map(str, spec.get("overrides") or ()), *map(str, per_task.get(task, ())))
        stages.append(Stage(name, "finetune", {"init": str(spec.get("init", "export"))}, overrides, resources,
                            task=task))
    return stages


def check_stages(stages: Sequence[Stage]) -> None:
    """Every input names an earlier stage that produces what the role needs; every required input is given."""
    seen: dict[str, Stage] = {}
    names = [s.name for s in stages]
    for stage in stages:
        if stage.name in seen:
            raise WorkflowError(f"stage {stage.name} is defined twice")
        if stage.name.startswith("_") or "/" in stage.name or not stage.name:
            raise WorkflowError(f"stage name {stage.name!r}: use letters, digits and _ (it names a directory)")
        roles = INPUT_ROLES[stage.entry]
        for role, source in stage.inputs.items():
            if role not in roles:
                raise WorkflowError(f"stage {stage.name} ({stage.entry}): unknown input {role!r}; a {stage.entry} "
                                    f"stage takes {', '.join(roles) or 'no inputs'}")
            if source not in names:
                raise WorkflowError(f"stage {stage.name}: input {role} comes from stage {source!r}, which is not in "
                                    f"this workflow (unknown stage; stages: {', '.join(names)})")
            if source not in seen:
                raise WorkflowError(f"stage {stage.name}: input {role} comes from stage {source}, which runs later: "
                                    f"no earlier stage produces it (stages run in the order they are listed)")
            produced = PRODUCES[seen[source].entry]
            if produced not in roles[role]:
                raise WorkflowError(f"stage {stage.name}: input {role} needs {' or '.join(roles[role])}, but stage "
                                    f"{source} ({seen[source].entry}) produces {produced}")
        for role in REQUIRED_INPUTS.get(stage.entry, ()):
            if role not in stage.inputs:
                raise WorkflowError(f"stage {stage.name} ({stage.entry}) needs input {role}: name the earlier stage "
                                    f"that produces its {' or '.join(roles[role])} (inputs: {{{role}: STAGE}})")
        seen[stage.name] = stage
