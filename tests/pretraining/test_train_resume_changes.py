"""A resume with a changed config (issue 36, item 1): refused before anything trains, naming each change, unless the
change is accepted (resume.accept_changes); then the schedule and the optimizer's rates are the new config's from the
resumed step, and the run's record (run_config.json) keeps the first start and each accepted change. The real train()
on real shards, tiny runs of a few steps; the schedule's restore on its own, without training."""
from __future__ import annotations

import csv
import json
import logging

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from pipeline.core.optim.optimizers import _Factor, build_optimizer, build_scheduler, lr_factor
from pipeline.pretraining.run import train

FIRST_STEPS, NEW_STEPS, NEW_LR, WARMUP = 4, 6, 5e-2, 2
# ++: the key is new in this version (the same spelling then runs the old version, which shows what it did)
ACCEPT = "++resume.accept_changes=[trainer.max_steps,optimizer]"


def run(shards, output_dir, tiny_overrides, max_steps, *extra, callbacks=()):
    overrides = tiny_overrides(shards, output_dir, max_steps, "trainer.log_every_n_steps=1", "export.hf=false",
                               "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0", *extra)
    return train(compose("train", overrides), extra_callbacks=list(callbacks))


def logged_lrs(output_dir) -> dict[int, float]:
    with open(output_dir / "csv" / "metrics.csv", newline="") as handle:
        return {int(row["step"]): float(row["train/lr"]) for row in csv.DictReader(handle) if row.get("train/lr")}


class RecordGroups(pl.Callback):
    """Each optimizer step's parameter groups as the step is taken (rate, peak, weight decay)."""

    def __init__(self):
        self.groups: dict[int, list[dict]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.groups[trainer.global_step] = [{key: group[key] for key in ("lr", "initial_lr", "weight_decay")}
                                            for group in trainer.optimizers[0].param_groups]


def test_a_resume_that_changes_what_shapes_the_run_is_refused_naming_each_change(small_shards, tiny_overrides,
                                                                                 tmp_path):
    run(small_shards, tmp_path, tiny_overrides, FIRST_STEPS)
    record_path = tmp_path / "run_config.json"
    record = record_path.read_text() if record_path.exists() else None
    before = logged_lrs(tmp_path)
    with pytest.raises(ValueError) as refused:
        run(small_shards, tmp_path, tiny_overrides, NEW_STEPS, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
            "data.num_workers=1", "trainer.enable_progress_bar=true")   # the last: operational, no change
    message = str(refused.value)
    assert "trainer.max_steps: 4 -> 6" in message and "optimizer.lr: 0.001 -> 0.05" in message
    assert "data.num_workers: 0 -> 1" in message           # the loader workers shape the data stream
    assert "enable_progress_bar" not in message
    # each at its value: a job script that keeps the list for its requeues accepts nothing else later
    assert "resume.accept_changes=[data.num_workers:1,optimizer.lr:0.05,trainer.max_steps:6]" in message
    assert logged_lrs(tmp_path) == before and record is not None and record_path.read_text() == record


def test_an_accepted_change_trains_the_new_schedule_from_the_resumed_step(small_shards, tiny_overrides, tmp_path,
                                                                          caplog):
    run(small_shards, tmp_path, tiny_overrides, FIRST_STEPS)
    groups = RecordGroups()
    with caplog.at_level(logging.WARNING, logger="pipeline.core.run.run_record"):
        run(small_shards, tmp_path, tiny_overrides, NEW_STEPS, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
            "optimizer.weight_decay=0.05", ACCEPT, callbacks=[groups])
    # Steps 4 and 5 at the new schedule (warmup 2, decay to 0 at step 6, peak 5e-2), not the saved one's 0.0
    expected = {step: NEW_LR * lr_factor(step, WARMUP, NEW_STEPS) for step in (4, 5)}
    lrs = logged_lrs(tmp_path)
    assert {step: lrs[step] for step in (4, 5)} == pytest.approx(expected, rel=1e-6)
    assert sorted(groups.groups) == [4, 5]
    for step, (decay, no_decay) in groups.groups.items():
        assert decay["lr"] == no_decay["lr"] == pytest.approx(expected[step], rel=1e-12)
        assert decay["initial_lr"] == no_decay["initial_lr"] == NEW_LR
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "trainer.max_steps: 4 -> 6" in warning and "optimizer.lr: 0.001 -> 0.05" in warning
    assert "optimizer.weight_decay: 0.01 -> 0.05" in warning and "schedule" in warning

    # Requeued with the same command: nothing changed, nothing to accept; then extended again. The list that
    # accepted the first change accepts no other (a job script keeps it for its requeues); named at its value, it does
    run(small_shards, tmp_path, tiny_overrides, NEW_STEPS, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
        "optimizer.weight_decay=0.05", ACCEPT)
    with pytest.raises(ValueError, match=r"trainer.max_steps: 6 -> 8\. .*accept no other: trainer.max_steps "
                                         r"\(by trainer.max_steps\).*resume.accept_changes=\[trainer.max_steps:8\]"):
        run(small_shards, tmp_path, tiny_overrides, 8, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
            "optimizer.weight_decay=0.05", ACCEPT)
    run(small_shards, tmp_path, tiny_overrides, 8, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
        "optimizer.weight_decay=0.05", "++resume.accept_changes=[trainer.max_steps:8,optimizer]")
    record = json.loads((tmp_path / "run_config.json").read_text())
    assert record["first_start"]["config"]["trainer"]["max_steps"] == FIRST_STEPS and record["first_start"]["step"] == 0
    assert record["in_effect"]["config"]["trainer"]["max_steps"] == 8
    assert [(c["step"], c["changes"]) for c in record["accepted_changes"]] == [
        (4, {"optimizer.lr": ["0.001", "0.05"], "optimizer.weight_decay": ["0.01", "0.05"],
             "trainer.max_steps": ["4", "6"]}),
        (6, {"trainer.max_steps": ["6", "8"]})]
    assert all(c["time"] and c["checkpoint"].endswith(".ckpt") for c in record["accepted_changes"])


def test_a_run_begun_before_records_resumes_with_a_warning(small_shards, tiny_overrides, tmp_path, caplog):
    """Without a record (deleted, or a run of an earlier version) the checkpoint's own hyper-parameters are compared
    (issue 49, item 5): on ca8c0b7 a changed trainer.max_steps went through with the warning."""
    run(small_shards, tmp_path, tiny_overrides, FIRST_STEPS)
    (tmp_path / "run_config.json").unlink(missing_ok=True)         # as a run of an earlier version left it
    with pytest.raises(ValueError, match=r"since its checkpoint was trained: trainer.max_steps: 4 -> 6\. "):
        run(small_shards, tmp_path, tiny_overrides, NEW_STEPS, "ckpt_path=auto")
    with caplog.at_level(logging.WARNING, logger="pipeline.core.run.run_record"):
        result = run(small_shards, tmp_path, tiny_overrides, NEW_STEPS, "ckpt_path=auto",
                     "++resume.accept_changes=[trainer.max_steps:6]")
    assert result["global_step"] == NEW_STEPS
    assert any("only the checkpoint's own hyper-parameters can be compared" in r.getMessage() for r in caplog.records)
    record = json.loads((tmp_path / "run_config.json").read_text())
    assert "before its config was recorded" in record["first_start"]["note"]
    assert [(c["step"], c["changes"]) for c in record["accepted_changes"]] == [(4, {"trainer.max_steps": ["4", "6"]})]
    with pytest.raises(ValueError, match="trainer.max_steps: 6 -> 8"):      # from now on, compared
        run(small_shards, tmp_path, tiny_overrides, 8, "ckpt_path=auto")


def test_another_runs_checkpoint_is_compared_with_its_own_hyper_parameters(small_shards, tiny_overrides, tmp_path):
    """ckpt_path=<another run's checkpoint> into a run directory whose record matches this config: the checkpoint was
    trained at another rate and seed, and says so (issue 49, item 5: on ca8c0b7 it trained on at the new ones)."""
    other = tmp_path / "other"
    run(small_shards, other, tiny_overrides, FIRST_STEPS, "optimizer.lr=0.002", "seed=7")
    ours = tmp_path / "ours"
    run(small_shards, ours, tiny_overrides, FIRST_STEPS)
    with pytest.raises(ValueError, match=r"optimizer.lr: 0.002 \(as the checkpoint was trained\) -> 0.001; "
                                         r"seed: 7 \(as the checkpoint was trained\) -> 1234\. "):
        run(small_shards, ours, tiny_overrides, FIRST_STEPS, f"ckpt_path={other / 'checkpoints' / 'last.ckpt'}")


def trained_states(make_scheduler):
    """(optimizer state, schedule state) after FIRST_STEPS steps at lr 1e-3, the schedule ending at FIRST_STEPS."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, {"name": "adamw", "lr": 1e-3, "weight_decay": 0.01, "fused": False})
    scheduler = make_scheduler(optimizer)
    for _ in range(FIRST_STEPS):
        optimizer.step()
        scheduler.step()
    return model, optimizer.state_dict(), scheduler.state_dict()


@pytest.mark.parametrize("written_by", ["this version", "ec81dd5"])
def test_the_schedule_restored_from_a_checkpoint_is_the_configs(written_by):
    """A checkpoint's schedule state, an ec81dd5 checkpoint's too (torch's LambdaLR: the factor's fields and the old
    peak rates), gives only the position: the rates are the new config's at that step."""
    make = ((lambda optimizer: build_scheduler(optimizer, {"warmup_steps": WARMUP}, FIRST_STEPS))
            if written_by == "this version" else
            (lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, _Factor(WARMUP, FIRST_STEPS, 1.0))))
    model, optimizer_state, scheduler_state = trained_states(make)
    assert set(scheduler_state) == ({"last_epoch", "_step_count"} if written_by == "this version" else
                                    set(scheduler_state) | {"lr_lambdas", "base_lrs"})
    new = build_optimizer(model, {"name": "adamw", "lr": NEW_LR, "weight_decay": 0.05, "fused": False})
    scheduler = build_scheduler(new, {"warmup_steps": WARMUP}, NEW_STEPS)
    new.load_state_dict(optimizer_state)          # Lightning: the optimizer first, then the schedule
    scheduler.load_state_dict(scheduler_state)
    expected = NEW_LR * lr_factor(FIRST_STEPS, WARMUP, NEW_STEPS)
    assert [g["lr"] for g in new.param_groups] == [expected, expected]
    assert [g["initial_lr"] for g in new.param_groups] == [NEW_LR, NEW_LR]
    assert [g["weight_decay"] for g in new.param_groups] == [0.05, 0.0]
    new.step()
    scheduler.step()
    assert [g["lr"] for g in new.param_groups] == [NEW_LR * lr_factor(FIRST_STEPS + 1, WARMUP, NEW_STEPS)] * 2
