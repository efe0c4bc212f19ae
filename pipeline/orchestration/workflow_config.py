"""The workflow config: conf/workflow/<name>.yaml with the command line, checked against workflow.schema.yaml, then
for what a schema cannot say (each input comes from an earlier stage that produces it); its Stages, the entry tables."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.app import CONFIG_ROOT, TRAINING_CONFIGS, compose_resolved

WORKFLOW_CONFIGS = CONFIG_ROOT / "workflow"
SCHEMA = Path(__file__).with_name("workflow.schema.yaml")
STATE_DIR = "_workflow"          # <root>/_workflow/: launches, the code snapshots, the lock, logs
REPORT_STAGE = "report"
# What each entry produces, and the inputs it takes (role -> what it must be given).
PRODUCES = {"data_prep": "shards", "train": "checkpoint", "export": "model", "finetune": "scores"}
# A train stage's init: the weights of an earlier run (phase 2 from phase 1); its resume: that run's final checkpoint
# resumed whole, optimizer and position with it (a warmup-stable-decay decay from its stable phase).
INPUT_ROLES = {"data_prep": {}, "train": {"shards": ("shards",), "init": ("checkpoint",), "resume": ("checkpoint",)},
               "export": {"checkpoint": ("checkpoint",), "tokenizer": ("shards",)},
               "finetune": {"init": ("model", "checkpoint")}, "report": {}}
REQUIRED_INPUTS = {"train": ("shards",), "export": ("checkpoint",), "finetune": ("init",)}
# The program each entry point runs (its command; its code version is of what it imports)
ENTRY_SCRIPTS = {"data_prep": "data_prep/run.py", "train": "pipeline/train.py", "finetune": "pipeline/finetune.py",
                 "export": "pipeline/orchestration/export_stage.py"}
OPEN_MAPS = ("workflow.env.", ".resources.", "workflow.downstream.per_task.")


class WorkflowError(ValueError):
    """A workflow that cannot run as configured; raised before anything runs or is submitted."""


def ranks_per_node(resources: dict) -> int:
    """One process per GPU (Lightning's SLURM contract), one on a CPU node, unless tasks_per_node says."""
    return resources.get("tasks_per_node") or max(1, resources.get("gpus_per_node") or 0)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: as the workflow config gives it, then composed, checked and given its identity (stage_config.py); it
    travels as JSON in the launch's config file to the Snakefile and the stage runner."""
    name: str
    entry: str                               # data_prep | train | export | finetune | report
    inputs: dict[str, str]                   # role -> the stage that produces it
    overrides: list[str]                     # the stage's own overrides of its entry point's config
    resources: dict[str, Any]
    upstream: list[str] | None = None        # the stages it reads (default: from its inputs)
    operational: list[str] = dataclasses.field(default_factory=list)    # the workflow's: W&B, devices, runner options
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    identity: str | None = None              # hash of `document`: the rule's parameter
    document: dict[str, Any] | None = None   # what shapes the result: the config (external inputs by content)
    code_version: str | None = None          # of the modules the entry point imports: recorded and shown, not compared
    rerun: str | None = None                 # workflow.rerun_code_changed asked for a new run with this code version

    def __post_init__(self):
        if self.upstream is None:
            object.__setattr__(self, "upstream", list(dict.fromkeys(self.inputs.values())))

    @property
    def world_size(self) -> int:
        return self.resources["nodes"] * ranks_per_node(self.resources)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Stage:
        return cls(**{field.name: raw[field.name] for field in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Workflow:
    config: dict[str, Any]                   # validated, defaults filled, root absolute and resolved
    stages: tuple[Stage, ...]

    def __getattr__(self, key: str) -> Any:  # name, root, launcher, action, retries, slurm, env ...
        if key in ("config", "stages"):
            raise AttributeError(key)
        return Path(self.config["root"]) if key == "root" else self.config.get(key)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def available_workflows() -> list[str]:
    return sorted(p.stem for p in WORKFLOW_CONFIGS.glob("*.yaml") if p.stem != "base")


def load_workflow(overrides: Sequence[str] = ()) -> Workflow:
    """conf/workflow/<name>.yaml (picked by +workflow=NAME) with the overrides."""
    from omegaconf import OmegaConf

    # `workflow=NAME` reads naturally but there is no primary config to override: accept it as +workflow=NAME. Open
    # maps (the environment, a stage's resources, per-task overrides) take any key without Hydra's `+`/`++`.
    overrides = [f"+{o}" if o.startswith("workflow=") else o for o in overrides]
    overrides = [f"++{o}" if o.startswith("workflow.") and any(m in o.split("=", 1)[0] for m in OPEN_MAPS) else o
                 for o in overrides]
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("+workflow=")]
    known = ", ".join(available_workflows())
    if not chosen or chosen[-1] not in available_workflows():
        raise WorkflowError(f"unknown workflow {chosen[-1]!r}; available: {known} (conf/workflow/)" if chosen else
                            f"which workflow? pass +workflow=NAME; available: {known} (conf/workflow/)")
    try:
        cfg = compose_resolved(CONFIG_ROOT, None, overrides,
                               f"pass it on the command line (conf/workflow/{chosen[-1]}.yaml leaves it to you)")
    except ValueError as error:
        raise WorkflowError(f"workflow config: {error}") from None
    return workflow_from_dict(OmegaConf.to_container(cfg.workflow))


def validate(raw: dict[str, Any]) -> dict[str, Any]:
    """The config checked against the schema, defaults filled in (Snakemake's own config validation); the error in
    the schema's own words where it has them (its `errorMessage`), else in jsonschema's."""
    from jsonschema import ValidationError
    from snakemake.utils import validate as snakemake_validate

    raw = json.loads(json.dumps(raw))
    try:
        snakemake_validate(raw, str(SCHEMA))
    except Exception as error:                       # Snakemake's WorkflowError, raised while handling jsonschema's
        cause = error.__context__
        if not isinstance(cause, ValidationError):
            raise
        where = "workflow" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in cause.absolute_path)
        ours = cause.schema.get("errorMessage", {}).get(cause.validator) if isinstance(cause.schema, dict) else None
        message = ours.format(value=cause.instance) if ours else cause.message
        raise WorkflowError(f"{where}: {message} (pipeline/orchestration/{SCHEMA.name})") from None
    return json.loads(json.dumps(raw))               # the schema's default objects are shared: copy them


def workflow_from_dict(raw: dict[str, Any]) -> Workflow:
    raw = validate(raw)
    # Resolved once, here: every rule and job runs in another working directory, and job names hash it.
    raw["root"] = str(Path(raw["root"]).expanduser().resolve())
    stages = [Stage(name, s["entry"], s["inputs"], s["overrides"], s["resources"])
              for name, s in raw["stages"].items()]
    stages += _downstream_stages(raw["downstream"], {s.name for s in stages})
    if raw["report"]:
        stages.append(Stage(REPORT_STAGE, "report", {}, [], {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1,
                                                               "runtime": 10}))
    check_stages(stages)
    return Workflow(raw, tuple(stages))


def _downstream_stages(spec: dict[str, Any], existing: set[str]) -> list[Stage]:
    known = sorted(p.stem for p in (TRAINING_CONFIGS / "task").glob("*.yaml"))
    if unknown := [t for t in spec["tasks"] if t not in known]:
        raise WorkflowError(f"workflow.downstream.tasks: unknown task(s) {', '.join(unknown)}; known tasks: "
                            f"{', '.join(known)} (conf/training/task/)")
    if stray := sorted(set(spec["per_task"]) - set(spec["tasks"])):
        raise WorkflowError(f"workflow.downstream.per_task names {', '.join(stray)}, which "
                            f"workflow.downstream.tasks does not list ({', '.join(spec['tasks']) or 'none'})")
    stages = []
    for task in spec["tasks"]:
        if f"finetune_{task}" in existing:
            raise WorkflowError(f"stage finetune_{task} is both in workflow.stages and made from "
                                "workflow.downstream.tasks")
        overrides = [f"task={task}", *spec["overrides"], *spec["per_task"].get(task, ())]
        stages.append(Stage(f"finetune_{task}", "finetune", {"init": spec["init"]}, overrides, spec["resources"]))
    return stages


def check_stages(stages: Sequence[Stage]) -> None:
    """Every input names an earlier stage that produces what the role needs; every required input is given."""
    seen: dict[str, Stage] = {}
    names = [s.name for s in stages]
    for stage in stages:
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
            if PRODUCES[seen[source].entry] not in roles[role]:
                raise WorkflowError(f"stage {stage.name}: input {role} needs {' or '.join(roles[role])}, but stage "
                                    f"{source} ({seen[source].entry}) produces {PRODUCES[seen[source].entry]}")
        for role in REQUIRED_INPUTS.get(stage.entry, ()):
            if role not in stage.inputs:
                raise WorkflowError(f"stage {stage.name} ({stage.entry}) needs input {role}: name the earlier stage "
                                    f"that produces its {' or '.join(roles[role])} (inputs: {{{role}: STAGE}})")
        seen[stage.name] = stage
