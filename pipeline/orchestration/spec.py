"""A workflow as data: conf/workflow/<name>.yaml composed with the command line, checked against
workflow.schema.yaml (snakemake.utils.validate: types, known keys, defaults) and then for what a schema cannot say:
every input names an earlier stage that produces what the role needs."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.core.app import CONFIG_ROOT, TRAINING_CONFIGS

WORKFLOW_CONFIGS = CONFIG_ROOT / "workflow"
SCHEMA = Path(__file__).with_name("workflow.schema.yaml")
STATE_DIR = "_workflow"          # <root>/_workflow/: launches, the code snapshots, the lock, logs
REPORT_STAGE = "report"
# What each entry produces, and the inputs it takes (role -> what it must be given).
PRODUCES = {"data_prep": "shards", "train": "checkpoint", "export": "model", "finetune": "scores"}
INPUT_ROLES = {"data_prep": {}, "train": {"shards": ("shards",), "init": ("checkpoint",)},
               "export": {"checkpoint": ("checkpoint",), "tokenizer": ("shards",)},
               "finetune": {"init": ("model", "checkpoint")}, "report": {}}
REQUIRED_INPUTS = {"train": ("shards",), "export": ("checkpoint",), "finetune": ("init",)}
OPEN_MAPS = ("workflow.env.", ".resources.", "workflow.downstream.per_task.")


class WorkflowError(ValueError):
    """A workflow that cannot run as configured; raised before anything runs or is submitted."""


def ranks_per_node(resources: dict) -> int:
    """One process per GPU (Lightning's SLURM contract), one on a CPU node, unless tasks_per_node says."""
    return resources.get("tasks_per_node") or max(1, resources.get("gpus_per_node") or 0)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: as the workflow config gives it, then composed, checked and given its identity (stages.py); it
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
    def from_dict(cls, raw: Mapping[str, Any]) -> "Stage":
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


def compose(config_dir: Path, config_name: str | None, overrides: Sequence[str], unset_hint: str):
    """A Hydra config composed outside a Hydra app and resolved; raises WorkflowError on a wrong override or a
    mandatory value (???) left unset."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from pipeline.orchestration.identity import leaves

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
        missing = [key for key, value in leaves(OmegaConf.to_container(cfg, resolve=False))
                   if value == "???" and not key.startswith("hydra.")]
        if missing:
            raise WorkflowError(f"{', '.join(missing)} is not set: {unset_hint}")
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise WorkflowError(str(error)) from None
    return cfg


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
        cfg = compose(CONFIG_ROOT, None, overrides,
                      f"pass it on the command line (conf/workflow/{chosen[-1]}.yaml leaves it to you)")
    except WorkflowError as error:
        raise WorkflowError(f"workflow config: {error}") from None
    return workflow_from_dict(OmegaConf.to_container(cfg.workflow))


def validate(raw: dict[str, Any]) -> dict[str, Any]:
    """The config checked against the schema, defaults filled in (Snakemake's own config validation)."""
    from snakemake.utils import validate as snakemake_validate
    from jsonschema import ValidationError

    raw = json.loads(json.dumps(raw))
    try:
        snakemake_validate(raw, str(SCHEMA))
    except Exception as error:                       # Snakemake's WorkflowError, raised while handling jsonschema's
        cause = error.__context__
        if not isinstance(cause, ValidationError):
            raise
        where = ".".join(["workflow", *map(str, cause.absolute_path)])
        raise WorkflowError(f"{where}: {cause.message} (pipeline/orchestration/{SCHEMA.name})") from None
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
                                                               "time": "00:10:00"}))
    check_sbatch_values(raw["slurm"])
    for stage in stages:
        if stage.entry == "finetune" and not any(o.startswith("task=") for o in stage.overrides):
            raise WorkflowError(f"stage {stage.name}: a finetune stage needs task=NAME in its overrides "
                                "(or list the task in workflow.downstream.tasks)")
    check_stages(stages)
    return Workflow(raw, tuple(stages))


def check_sbatch_values(slurm: Mapping[str, Any]) -> None:
    """What reaches sbatch from workflow.slurm can be passed whole (slurm.py quotes it), or is refused here: a control
    character (a line break ends a shell command), and an extra_args item that is not one sbatch option."""
    values = [(f"workflow.slurm.{key}", slurm.get(key)) for key in ("partition", "account", "qos", "constraint",
                                                                     "reservation")]
    values += [(f"workflow.slurm.controller.{key}", (slurm.get("controller") or {}).get(key))
               for key in ("partition", "account")]
    values += [(f"workflow.slurm.extra_args[{i}]", item) for i, item in enumerate(slurm.get("extra_args") or ())]
    for where, value in values:
        if value is not None and not str(value).isprintable():
            raise WorkflowError(f"{where}: {value!r} holds a control character (a line break, a tab ...), which "
                                "sbatch cannot be given safely")
    for i, item in enumerate(slurm.get("extra_args") or ()):
        if not item.startswith("-") or re.search(r"\s-", item):
            raise WorkflowError(f"workflow.slurm.extra_args[{i}]: {item!r} is not one sbatch option; give one option "
                                "per item, its value after = (e.g. ['--exclusive', '--gres=gpu:1'])")


def known_tasks() -> list[str]:
    return sorted(p.stem for p in (TRAINING_CONFIGS / "task").glob("*.yaml"))


def _downstream_stages(spec: dict[str, Any], existing: set[str]) -> list[Stage]:
    unknown = [t for t in spec["tasks"] if t not in known_tasks()]
    if unknown:
        raise WorkflowError(f"workflow.downstream.tasks: unknown task(s) {', '.join(unknown)}; known tasks: "
                            f"{', '.join(known_tasks())} (conf/training/task/)")
    stray = sorted(set(spec["per_task"]) - set(spec["tasks"]))
    if stray:
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
        if stage.name.startswith("_") or not re.fullmatch(r"\w+", stage.name):
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
            if PRODUCES[seen[source].entry] not in roles[role]:
                raise WorkflowError(f"stage {stage.name}: input {role} needs {' or '.join(roles[role])}, but stage "
                                    f"{source} ({seen[source].entry}) produces {PRODUCES[seen[source].entry]}")
        for role in REQUIRED_INPUTS.get(stage.entry, ()):
            if role not in stage.inputs:
                raise WorkflowError(f"stage {stage.name} ({stage.entry}) needs input {role}: name the earlier stage "
                                    f"that produces its {' or '.join(roles[role])} (inputs: {{{role}: STAGE}})")
        seen[stage.name] = stage
