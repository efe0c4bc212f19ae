"""No host-device round trip in a training step outside the steps that log (issue 21, item 6; issue 35, item 1): the
real train() and finetune() under tests/helpers/host_sync.py's guard, which watches each micro-batch up to the next
one's start (Lightning's own batch end included) and records a read of any value that would live on the GPU, whoever
reads it. The 2-rank runs (DDP and DeepSpeed) carry the same guard: tests/core/test_bf16_numerics.py."""
from __future__ import annotations

import csv
import os

import pytorch_lightning as pl
import torch

from tests.helpers.host_sync import REPO_ROOT, DeviceModel, HostSyncGuard

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def test_the_device_model_records_reads_of_device_values_only_whoever_reads_them():
    weight = torch.ones(3)                      # made outside the model: a parameter or a batch, on the device
    model = DeviceModel()
    with model:
        model.watching = {"step": 0}
        host = torch.tensor([1.0, 2.0])         # no device: the host, as on a GPU machine
        assert host.sum().item() == 3.0 and host.tolist() == [1.0, 2.0]       # host reads: nothing to wait for
        loss = (weight * 2).sum()
        copy = torch.empty(())
        copy.copy_(loss, non_blocking=True)                                    # the pinned, asynchronous copy
        assert float(copy.clone().detach()) == 6.0                             # a host copy, cloned: still the host
        on_device = torch.tensor(1.0, device=torch.device("cpu"))              # a Python value sent to "the" device
        code = "v = loss.item()\nif weight.any(): pass"
        exec(compile(code, str(REPO_ROOT / "pipeline" / "core" / "somewhere.py"), "exec"), {"loss": loss,
                                                                                           "weight": weight})
        float(loss.detach().clone())             # a library (here: this test) reading a device value
        model.watching = None
        loss.item()                              # outside the window: allowed
    assert [(v["call"], v["at"].rsplit("/", 1)[-1]) for v in model.violations] == [
        ("torch.tensor", f"{os.path.basename(__file__)}:{_line_of('on_device = torch.tensor')}"),
        ("Tensor.item", "somewhere.py:1"), ("Tensor.__bool__", "somewhere.py:2"),
        ("Tensor.__float__", f"{os.path.basename(__file__)}:{_line_of('float(loss.detach().clone())')}")]
    assert not model.lives_on_host(on_device) and model.lives_on_host(copy)


def test_the_device_model_records_what_waits_without_reading_a_value():
    """The gaps a review of the guard found (issue 48): data-dependent sizes, boolean masks, a blocking host-to-device
    copy by our code, and the waits that are no tensor operation (torch.cuda / events / streams synchronize, the
    process group's barrier, DeepSpeed's accelerator synchronize). Each made in a window, once; none outside it."""
    import deepspeed  # noqa: F401  (imported by the strategy in a run: its accelerator's wait is watched)
    from deepspeed.accelerator import get_accelerator

    from tests.helpers.host_sync import WaitCalls

    weight = torch.arange(6.0)                  # a device tensor (made outside the model)
    model, waits = DeviceModel(), []
    code = ("weight.nonzero()\nweight.masked_select(weight > 2)\nweight[weight > 2]\nweight[weight > 4] = 0.0\n"
            "torch.ones(2).to(weight.device)\ntorch.ones(2).to(weight.device, non_blocking=True)\n"
            "weight[torch.tensor([0, 1])]\nweight[1:3]\n")
    with model, WaitCalls(lambda: model.watching is not None, waits.append):
        model.watching = {"step": 0}
        exec(compile(code, str(REPO_ROOT / "pipeline" / "core" / "somewhere.py"), "exec"),
             {"weight": weight, "torch": torch})
        get_accelerator().synchronize()          # a no-op on the CPU; a device-wide wait on a GPU
        assert torch.distributed.barrier is not torch.distributed.distributed_c10d.barrier     # watched too
        model.watching = None
        weight.nonzero()
        get_accelerator().synchronize()
    assert [(v["call"], v["at"].rsplit("/", 1)[-1]) for v in model.violations] == [
        ("torch.nonzero", "somewhere.py:1"), ("torch.masked_select", "somewhere.py:2"),
        ("Tensor.__getitem__ (boolean mask)", "somewhere.py:3"),
        ("Tensor.__setitem__ (boolean mask)", "somewhere.py:4"), ("Tensor.to (host to device)", "somewhere.py:5")]
    assert waits == ["deepspeed accelerator.synchronize"]
    assert torch.distributed.barrier is torch.distributed.distributed_c10d.barrier    # put back


def _line_of(text: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


class _LogsTheLossOnce(pl.LightningModule):
    """A device value logged once with prog_bar=True, as pipeline/pretraining/module.py did at ec81dd5."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if batch_idx == 1:
            self.log("loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_guard_sees_lightning_read_a_logged_device_value_at_every_later_batch_end(tmp_path):
    """Logged at step 1 (a log step), read back by Lightning's logger connector at the end of steps 2 and 3."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)
    guard = HostSyncGuard(log_every_n_steps=2)
    pl.Trainer(max_steps=4, log_every_n_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=tmp_path, callbacks=[guard]
               ).fit(_LogsTheLossOnce(), loader)
    assert guard.guarded_batches == 2                                          # steps 0 and 2
    reads = [(v["step"], v["call"], any("logger_connector/result.py" in f for f in v["stack"]))
             for v in guard.violations]
    assert reads == [(2, "Tensor.item", True)]


def test_a_pretraining_step_makes_no_host_round_trip_outside_the_logging_steps(small_shards, tmp_path,
                                                                              tiny_overrides):
    """4 optimizer steps of 2 micro-batches, logging (metrics, throughput, progress bar) every 2nd step, with 2 loader
    workers: the 6 micro-batches that do not end a logging step run under the guard. At ec81dd5 it records Lightning
    reading the prog-bar loss back (logger_connector/result.py) on every micro-batch after the first log step."""
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    guard = HostSyncGuard(log_every_n_steps=2)
    overrides = [o for o in tiny_overrides(small_shards, tmp_path / "run", 4)
                 if "enable_progress_bar" not in o and "num_workers" not in o]
    result = train(compose("train", [*overrides, "data.num_workers=2", "trainer.enable_progress_bar=true",
                                     "callbacks.throughput.log_every_n_steps=2",
                                     "callbacks.checkpoint.every_n_train_steps=0", "export.hf=false",
                                     "export.plot=false"]),
                   extra_callbacks=[guard])
    assert guard.guarded_batches == 6
    assert guard.violations == [], "\n".join(f"{v['call']} step {v['step']}: {v['stack']}" for v in guard.violations)
    assert {"train/loss", "train/grad_norm", "train/lr", "train/mlm_acc"} <= set(result["metrics"])


def test_a_finetuning_step_makes_no_host_round_trip_outside_the_logging_steps(tiny_bert_dir, tmp_path):
    """At ec81dd5 fine-tuning logged its loss (prog bar) and rate on every step: Lightning made the rate a device
    tensor and read the loss back at every batch end."""
    from pipeline.core.app import FINETUNE_SAMPLE_DATA, compose
    from pipeline.core.run.loggers import csv_metrics_path
    from pipeline.finetuning.run import finetune

    guard = HostSyncGuard(log_every_n_steps=2)
    out = tmp_path / "run"
    finetune(compose("finetune", [
        "task=sst2", f"init={tiny_bert_dir}", f"data.dir={FINETUNE_SAMPLE_DATA / 'SST-2'}", f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'cache'}", "data.batch_size=8", "data.limit_train_examples=48",
        "data.limit_eval_examples=8", "trainer.max_epochs=1", "trainer.log_every_n_steps=2",
        "trainer.enable_progress_bar=true", "export.hf=false", "export.plot=false", "logger=csv"]),
        extra_callbacks=[guard])
    assert guard.guarded_batches == 3            # steps 0, 2 and 4 of 6
    assert guard.violations == [], "\n".join(f"{v['call']} step {v['step']}: {v['stack']}" for v in guard.violations)
    with open(csv_metrics_path(out), newline="") as handle:
        logged = [(int(row["step"]), float(row["train/loss"]), float(row["train/lr"]))
                  for row in csv.DictReader(handle) if row.get("train/loss")]
    assert [step for step, _, _ in logged] == [1, 3, 5]     # the steps that log, each with its window's mean loss
    assert all(0 < loss < 2 and lr > 0 for _, loss, lr in logged), logged
