"""What every entry point needs before its own work: harmless library noise silenced, the config resolvers registered,
and its config composed from its own root.

Each program reads one config root, so its --help lists only its own groups:

    conf/training/   pipeline/train.py (train.yaml) and pipeline/finetune.py (finetune.yaml), with their groups
    conf/features/   pipeline/extract_features.py and pipeline/probe.py (no groups)
    conf/data_prep/  data_prep/run.py (one file per preset; see data_prep/presets.py)
    conf/workflow/   pipeline/workflow.py (one file per workflow)

Entry points import this module first: it silences the known noise before Lightning or Beam is imported. The repository
is installed editable (`pip install -e .`), so no entry point edits sys.path.

A run refused before it starts (its config, its run directory, its files: refused()) prints its reason alone, without
a traceback under Hydra's "Error executing job", and exits with REFUSED_EXIT_CODE (2), which restarts.py and the
workflow never start again (exit_refused). Any other error keeps its traceback.
"""
from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NoReturn

from data_prep.known_noise import silence_known_noise

silence_known_noise()

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from data_prep.presets import REPO_ROOT, compose_config, register_repo_root_resolver  # noqa: E402
from pipeline.core.run.output_dir import output_dir  # noqa: E402, F401  (app.output_dir: every program's)

CONFIG_ROOT = REPO_ROOT / "conf"
TRAINING_CONFIGS = CONFIG_ROOT / "training"
FEATURES_CONFIGS = CONFIG_ROOT / "features"
# The config root and primary config of each Hydra program.
PROGRAMS = {
    "train": TRAINING_CONFIGS,
    "finetune": TRAINING_CONFIGS,
    "extract_features": FEATURES_CONFIGS,
    "probe": FEATURES_CONFIGS,
}
FINETUNE_SAMPLE_DATA = REPO_ROOT / "pipeline" / "finetuning" / "sample_data"


def task_data_dir(env_var: str, subdir: str = "", sample: str | None = None) -> str | None:
    """${task_data_dir:GLUE_DIR,SST-2}: $GLUE_DIR/SST-2 where GLUE_DIR is set, else the bundled sample of that task
    (pipeline/finetuning/sample_data/<sample or subdir>) if there is one, else null (fine-tuning then says what to
    pass)."""
    root = os.environ.get(env_var)
    if root:
        return str(Path(root) / subdir)
    bundled = FINETUNE_SAMPLE_DATA / (sample or subdir) if (sample or subdir) else None
    return str(bundled) if bundled is not None and bundled.is_dir() else None


def register_resolvers() -> None:
    """The resolvers the configs use: ${repo_root:} and ${task_data_dir:VAR,subdir}."""
    register_repo_root_resolver()
    if not OmegaConf.has_resolver("task_data_dir"):
        OmegaConf.register_new_resolver("task_data_dir", task_data_dir)


register_resolvers()


def compose_resolved(config_dir: Path, config_name: str | None, overrides: Sequence[str],
                     unset_hint: str) -> DictConfig:
    """compose_config, resolved; ValueError on a wrong override, or a mandatory value (???) left unset (`unset_hint`
    says what to do)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from pipeline.core.run.shaping import leaves

    try:
        cfg = compose_config(config_dir, config_name, overrides)
        missing = [key for key, value in leaves(OmegaConf.to_container(cfg, resolve=False))
                   if value == "???" and not key.startswith("hydra.")]
        if missing:
            raise ValueError(f"{', '.join(missing)} is not set: {unset_hint}")
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise ValueError(str(error)) from None
    return cfg


def compose(program: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python pipeline/<program>.py <overrides>` would run, without Hydra's run directory (pass
    output_dir=<directory> to run it)."""
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    return compose_config(PROGRAMS[program], program, overrides)


def refused(error: BaseException, check_modules: Collection[str]) -> bool:
    """Whether `error` refused the run before it started, for a reason its message gives in full: a run directory in
    use or not writable, a checkpoint this user may not read, a resume that changes what shapes the run, a start
    over a run's history or a rollback not asked for (fresh_start.py, rollback.py), or any
    ValueError or OSError raised while the entry point's start checks ran (a frame of its traceback in one of
    `check_modules`, e.g. "pipeline.pretraining.checks"). A failure of another kind, or of the same kinds elsewhere,
    is not one: its traceback is wanted."""
    from pipeline.core.checkpoints.checkpoint_files import UnreadableCheckpoint
    from pipeline.core.cluster.run_dir_lock import RunDirInUse, RunDirNotWritable
    from pipeline.core.run.fresh_start import StartOverRefused
    from pipeline.core.run.rollback import RollbackRefused
    from pipeline.core.run.run_record import ResumeRefused

    if isinstance(error, (RunDirInUse, RunDirNotWritable, UnreadableCheckpoint, ResumeRefused, StartOverRefused,
                          RollbackRefused)):
        return True
    return isinstance(error, (ValueError, OSError)) and any(
        frame.f_globals.get("__name__") in check_modules for frame, _ in traceback.walk_tb(error.__traceback__))


def exit_refused(error: BaseException) -> NoReturn:
    """Prints a refusal's message to stderr, alone (with its traceback under HYDRA_FULL_ERROR=1, Hydra's switch for
    them), and exits with REFUSED_EXIT_CODE."""
    from pipeline.core.cluster.restarts import REFUSED_EXIT_CODE

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exception(error)
    else:
        print(error, file=sys.stderr, flush=True)
    sys.exit(REFUSED_EXIT_CODE)
