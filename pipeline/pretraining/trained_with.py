"""What a pre-training checkpoint was trained with, against what a resume would train with.

Every checkpoint carries the module's hyper-parameters (BertPretrainingModule's save_hyperparameters: the encoder
config, the optimizer, the schedule, max_steps, the seed, the objective). A resume compares them with its config, as
config keys, whatever the run's record says (pipeline/core/run/run_record.py): a record deleted, or a checkpoint of
another run given as ckpt_path, otherwise lets any change through.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.core.checkpoints.checkpoint_files import UnreadableCheckpoint
from pipeline.core.checkpoints.checkpoint_steps import recorded_hyper_parameters
from pipeline.core.devices import is_first_process
from pipeline.core.run.shaping import OPERATIONAL, leaves, names

log = logging.getLogger("pipeline.pretraining")
# A hyper-parameter's name -> the config key it comes from (the rest keep their names: optimizer.*, scheduler.*)
_CONFIG_KEYS = {"model_config": "model", "max_steps": "trainer.max_steps",
                "next_sentence_prediction": "objective (the shard set's: next_sentence_prediction)"}


def module_hyper_parameters(cfg: DictConfig, model_config: Mapping[str, Any], schedule_steps: int, max_steps: int,
                            next_sentence_prediction: bool) -> dict[str, Any]:
    """BertPretrainingModule's arguments for this config (what its checkpoints will carry)."""
    return {"model_config": dict(model_config), "optimizer": OmegaConf.to_container(cfg.optimizer, resolve=True),
            "scheduler": {**OmegaConf.to_container(cfg.scheduler, resolve=True), "total_steps": schedule_steps},
            "max_steps": max_steps, "overfit_batches": int(cfg.get("overfit_batches") or 0), "seed": int(cfg.seed),
            "next_sentence_prediction": next_sentence_prediction}


def checkpoint_changes(checkpoint: str, cfg: DictConfig, now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{config key: (as the checkpoint was trained, as this config would train)} where they differ; now: this
    config's module_hyper_parameters. A checkpoint without hyper-parameters (not Lightning's) compares nothing."""
    try:
        trained = recorded_hyper_parameters(checkpoint)
    except PermissionError as error:
        raise UnreadableCheckpoint(Path(error.filename or checkpoint)) from None
    if trained is None:
        if is_first_process():
            log.warning("%s carries no hyper-parameters of the run that wrote it: they cannot be compared with this "
                        "config", checkpoint)
        return {}
    # The schedule's length follows trainer.max_steps unless the config sets it: compared there, not twice
    follows_max_steps = cfg.scheduler.get("total_steps") is None
    a, b = _as_config_keys(trained, follows_max_steps), _as_config_keys(now, follows_max_steps)
    return {key: (a.get(key, "(absent)"), b.get(key, "(absent)")) for key in sorted(set(a) | set(b))
            if a.get(key, "(absent)") != b.get(key, "(absent)")}


def _as_config_keys(hyper_parameters: Mapping[str, Any], follows_max_steps: bool) -> dict[str, Any]:
    plain = json.loads(json.dumps(hyper_parameters, default=str))
    flat = {}
    for name, value in leaves(plain):
        head, _, rest = name.partition(".")
        key = f"{_CONFIG_KEYS.get(head, head)}{'.' + rest if rest else ''}"
        if names(key, OPERATIONAL["train"]) or (follows_max_steps and key == "scheduler.total_steps"):
            continue
        flat[key] = value
    return flat
