"""data.micro_batch_size=auto (issue 35, item 2): the largest pass that fits the card, chosen at the start, the same on
every rank, kept by a resume; never another global batch. The search runs here with injected peaks (no GPU); the real
train() runs its probe path on the CPU with the real forward and backward and injected peaks, and must then train
exactly as the same run given the size it chose."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import TRAINING_CONFIGS, compose
from pipeline.core.speed import micro_batch
from pipeline.core.speed.micro_batch import GIB, NoPassFits, candidates, largest_that_fits, plan_micro_batch

STEPS = 4


def data(micro, global_batch=8, **extra) -> dict:
    return {"global_batch_size": global_batch, "micro_batch_size": micro, "max_seq_length": 128, **extra}


GPU, CPU = {"accelerator": "gpu", "precision": "bf16-mixed"}, {"accelerator": "cpu"}


# -- the search ----------------------------------------------------------------------------------------------------

def test_the_candidates_are_the_divisors_of_the_per_process_batch_largest_first():
    assert candidates(24) == [24, 12, 8, 6, 4, 3, 2, 1]
    assert candidates(1) == [1]


def test_the_largest_size_that_fits_is_chosen_trying_from_the_largest():
    tried = []

    def peak(size):   # 2 GiB of model, 1 GiB a sequence
        tried.append(size)
        return (2 + size) * GIB

    fit = largest_that_fits(64, peak, total_bytes=40 * GIB, margin=0.1)   # 36 GiB allowed
    assert (fit.size, tried) == (32, [64, 32])
    assert fit.peak_bytes == 34 * GIB and fit.budget_bytes == pytest.approx(36 * GIB)


def test_a_size_that_runs_out_of_memory_is_passed_over():
    fit = largest_that_fits(48, lambda size: None if size > 16 else size * GIB, total_bytes=80 * GIB, margin=0.1)
    assert fit.size == 16


def test_the_margin_is_honoured():
    peaks = {16: 30 * GIB, 8: 20 * GIB}
    assert largest_that_fits(16, peaks.get, total_bytes=32 * GIB, margin=0.1).size == 8    # 30 > 28.8 allowed
    assert largest_that_fits(16, peaks.get, total_bytes=32 * GIB, margin=0.0).size == 16
    with pytest.raises(NoPassFits):
        largest_that_fits(16, {16: 30 * GIB, 8: 20 * GIB, 4: 17 * GIB, 2: 16.5 * GIB, 1: 16.1 * GIB}.get,
                          total_bytes=32 * GIB, margin=0.5)


def test_nothing_fits_names_the_smallest_size_tried_and_its_memory():
    with pytest.raises(NoPassFits, match=r"smallest, 1 sequence\(s\), peaked at 50.00 GiB.* 36.00 GiB are allowed "
                                         r"\(90% of 40.00 GiB"):
        largest_that_fits(8, lambda size: (49 + size) * GIB, total_bytes=40 * GIB, margin=0.1)
    with pytest.raises(NoPassFits, match=r"smallest, 1 sequence\(s\), ran out of memory"):
        largest_that_fits(8, lambda size: None, total_bytes=40 * GIB, margin=0.1)


@pytest.mark.parametrize("global_batch, world, fits_up_to", [(256, 8, 64), (256, 32, 64), (65536, 64, 256),
                                                             (32768, 64, 100), (96, 3, 7), (12, 12, 1)])
def test_the_global_batch_never_changes(global_batch, world, fits_up_to, tmp_path):
    fit = largest_that_fits(global_batch // world, lambda size: size if size <= fits_up_to else None,
                            total_bytes=10**9, margin=0.1)
    for plan in (plan_micro_batch(data(fit.size, global_batch), GPU, world, tmp_path, resume_from=None),
                 plan_micro_batch(data("auto", global_batch), CPU, world, tmp_path, resume_from=None),
                 plan_micro_batch(data("auto", global_batch), GPU, world, tmp_path, resume_from=None)):
        assert plan.size * plan.accumulation * world == global_batch
    assert fit.size <= fits_up_to and (global_batch // world) % fit.size == 0


def test_ranks_agree_on_the_smallest_size(tmp_path):
    """Two processes over gloo: 8 and 4 agree on 4; a rank that found none (0) makes every rank find none."""
    import torch.multiprocessing as mp

    mp.spawn(_agree_on_two_ranks, args=(str(tmp_path),), nprocs=2, join=True)
    assert json.loads((tmp_path / "rank0.json").read_text()) == json.loads((tmp_path / "rank1.json").read_text()) \
        == [4, 0]


def _agree_on_two_ranks(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        cpu = torch.device("cpu")
        agreed = [micro_batch.agree_on_size((8, 4)[rank], cpu), micro_batch.agree_on_size((8, 0)[rank], cpu)]
    finally:
        dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(agreed))


# -- the plan before the Trainer -----------------------------------------------------------------------------------

def test_the_gpu_recipes_size_their_pass_to_the_card():
    recipes = sorted(p.stem for p in (TRAINING_CONFIGS / "experiment").glob("bert_*.yaml"))
    assert recipes == ["bert_base", "bert_base_phase2", "bert_large", "bert_large_phase2"]
    for name in recipes:
        cfg = compose("train", [f"+experiment={name}"])
        assert cfg.data.micro_batch_size == "auto" and cfg.data.micro_batch_margin == 0.1, name
    assert compose("train", ["+experiment=cpu_hour"]).data.micro_batch_size == 32   # the CPU recipe keeps its number


def test_on_the_gpu_auto_waits_for_the_probe_with_the_whole_per_process_batch(tmp_path):
    plan = plan_micro_batch(data("auto", 65536), GPU, 64, tmp_path, resume_from=None)
    assert (plan.source, plan.size, plan.accumulation, plan.per_process) == ("probe", 1024, 1, 1024)
    assert plan.precision == "bf16-mixed" and plan.margin == 0.1


@pytest.mark.parametrize("global_batch, world, expected", [(256, 1, (8, 32)), (12, 1, (6, 2)), (4, 1, (4, 1)),
                                                           (256, 8, (8, 4)), (256, 64, (4, 1))])
def test_without_cuda_auto_takes_at_most_the_cpu_size_and_probes_nothing(global_batch, world, expected, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(micro_batch, "PassProbe", None)    # never built
    plan = plan_micro_batch(data("auto", global_batch), CPU, world, tmp_path, resume_from=None)
    assert (plan.source, (plan.size, plan.accumulation)) == ("cpu", expected)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plan_micro_batch(data("auto", global_batch), {"accelerator": "auto"}, world, tmp_path,
                            resume_from=None).source == "cpu"


def test_a_number_wins_also_over_a_resumes_record(tmp_path):
    micro_batch.write_record(tmp_path, {"micro_batch_size": 8, "source": "probe"})
    checkpoint = str(tmp_path / "checkpoints" / "last.ckpt")
    plan = plan_micro_batch(data(2), GPU, 1, tmp_path, resume_from=checkpoint)
    assert (plan.source, plan.size, plan.accumulation, plan.recorded) == ("config", 2, 4, 8)
    plan = plan_micro_batch(data("auto"), GPU, 1, tmp_path, resume_from=checkpoint)
    assert (plan.source, plan.size, plan.accumulation) == ("record", 8, 1)
    # resumed into another output_dir: the record beside the checkpoint's run
    plan = plan_micro_batch(data("auto"), GPU, 1, tmp_path / "elsewhere", resume_from=checkpoint)
    assert (plan.source, plan.size) == ("record", 8)
    # at another world size, the recorded size stays the most a pass takes
    plan = plan_micro_batch(data("auto", 16), GPU, 4, tmp_path, resume_from=checkpoint)
    assert (plan.size, plan.accumulation) == (4, 1)
    assert plan_micro_batch(data("auto"), GPU, 1, tmp_path, resume_from=None).source == "probe"   # a new run probes


def test_preflight_checks_auto_at_the_per_process_batch_and_refuses_a_bad_value(monkeypatch):
    from pipeline.pretraining.checks import preflight

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    shape = preflight(compose("train", ["+experiment=bert_large", "trainer.devices=8"]), world_size=64)
    assert (shape.micro_batch_size, shape.accumulation) == (1024, 1)
    with pytest.raises(ValueError, match="data.micro_batch_margin=1.5"):
        preflight(compose("train", ["+experiment=bert_large", "data.micro_batch_margin=1.5"]), world_size=8)
    with pytest.raises(ValueError, match="data.micro_batch_size='most'"):
        preflight(compose("train", ["data.micro_batch_size=most"]), world_size=1)


def test_a_probe_pass_runs_the_widest_batch_and_leaves_no_trace():
    from model import BertConfig, BertForPreTraining

    model = BertForPreTraining(BertConfig.from_preset("tiny")).eval()
    probe = micro_batch.PassProbe(model, max_seq_length=32, max_predictions=5, precision="bf16-mixed",
                                  device=torch.device("cpu"))
    batch = probe.batch(3)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, 32) and bool(batch["attention_mask"].all())
    assert batch["masked_positions"].shape == (3, 5) and batch["next_sentence_labels"].shape == (3,)
    assert probe.optimizer_state_bytes == 8 * sum(p.numel() for p in model.parameters())
    rng = torch.get_rng_state()
    probe.run_pass(3)
    assert torch.equal(torch.get_rng_state(), rng)      # dropout's draws undone
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_the_size_reaches_the_loop_the_loaders_validation_and_deepspeed(monkeypatch):
    from types import SimpleNamespace

    from pipeline.core.speed.strategies import build_strategy

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")        # what build_strategy sets on the CPU, undone after the test
    strategy = build_strategy({"name": "deepspeed", "zero_optimization": {"stage": 2}}, precision="32-true",
                              gradient_clip_val=1.0, micro_batch_size=8, accumulate_grad_batches=1, accelerator="cpu")
    trainer = SimpleNamespace(accumulate_grad_batches=1, val_check_interval=3, strategy=strategy,
                              datamodule=SimpleNamespace(micro_batch_size=8))
    setup = plan_micro_batch(data("auto"), GPU, 1, Path("/nonexistent"), resume_from=None).callback()
    setup.size, setup.accumulation = 2, 4
    setup._apply(trainer)
    assert (trainer.accumulate_grad_batches, trainer.datamodule.micro_batch_size) == (4, 2)
    assert trainer.val_check_interval == 12            # validation.every_n_steps=3, counted in passes
    assert strategy.config["train_micro_batch_size_per_gpu"] == 2


# -- the real train() on the CPU, through the probe's path -----------------------------------------------------------

class RecordPasses(pl.Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.shape: tuple[int, int] | None = None
        self.validate_every: int | None = None     # in passes

    def on_train_start(self, trainer, pl_module):
        self.shape = (trainer.datamodule.micro_batch_size, trainer.accumulate_grad_batches)
        self.validate_every = trainer.val_check_batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        assert batch["input_ids"].shape[0] == self.shape[0]
        self.losses.append(float(outputs["loss"]))


class InjectedPeaks:
    """PassProbe on the CPU: the real forward and backward (its RNG and gradient handling included), these peaks."""

    def __init__(self, peaks: dict[int, float]):
        self.peaks, self.sizes = peaks, []

    def install(self, monkeypatch) -> InjectedPeaks:
        outer = self

        class Probe(micro_batch.PassProbe):
            def __call__(self, size):
                outer.sizes.append(size)
                self.run_pass(size)
                return outer.peaks[size]

        monkeypatch.setattr(micro_batch, "sizes_on_cuda", lambda trainer_cfg: True)
        monkeypatch.setattr(micro_batch, "device_memory_bytes", lambda device: 100 * GIB)
        monkeypatch.setattr(micro_batch, "PassProbe", Probe)
        return self


def _train(shards, out, tiny_overrides, *extra, steps=STEPS) -> tuple[RecordPasses, dict]:
    from pipeline.pretraining.run import train

    record = RecordPasses()
    result = train(compose("train", [*tiny_overrides(shards, out, steps), "export.hf=false", "export.plot=false",
                                     *extra]), extra_callbacks=[record])
    return record, result


@pytest.fixture(scope="module")
def auto_run(small_shards, tmp_path_factory, tiny_overrides):
    """global 8 on one process; 8 a pass peaks over the 90 GiB allowed, 4 fits: 4 x 2."""
    out = tmp_path_factory.mktemp("auto") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        probe = InjectedPeaks({8: 95 * GIB, 4: 50 * GIB, 2: 30 * GIB, 1: 20 * GIB}).install(monkeypatch)
        record, result = _train(small_shards, out, tiny_overrides, "data.micro_batch_size=auto",
                                *validated_every_2_steps(small_shards))
    return out, probe, record, result


def validated_every_2_steps(shards) -> list[str]:
    return [f"validation.path={shards}", "validation.every_n_steps=2", "validation.max_batches=1"]


def test_auto_trains_exactly_as_the_size_it_chose(auto_run, small_shards, tmp_path, tiny_overrides):
    out, probe, record, result = auto_run
    assert probe.sizes == [8, 4] and record.shape == (4, 2) and result["global_step"] == STEPS
    written = json.loads((out / micro_batch.RECORD_NAME).read_text())
    assert (written["micro_batch_size"], written["accumulation"], written["source"]) == (4, 2, "probe")
    assert (written["peak_bytes"], written["total_bytes"], written["margin"]) == (50 * GIB, 100 * GIB, 0.1)
    given, _ = _train(small_shards, tmp_path / "given", tiny_overrides, "data.micro_batch_size=4",
                      *validated_every_2_steps(small_shards))
    assert given.shape == (4, 2) and record.validate_every == given.validate_every == 4
    assert record.losses == given.losses     # bit for bit: the probe's passes left no trace (RNG, gradients)


def test_a_resume_keeps_the_recorded_size_where_a_new_probe_would_choose_another(auto_run, small_shards, tmp_path,
                                                                                  tiny_overrides, monkeypatch):
    source, _, _, _ = auto_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    probe = InjectedPeaks({size: 1 * GIB for size in (8, 4, 2, 1)}).install(monkeypatch)   # 8 would fit now
    record, result = _train(small_shards, out, tiny_overrides, "data.micro_batch_size=auto", "ckpt_path=last",
                            "resume.accept_changes=[trainer.max_steps]", steps=STEPS + 2)
    assert probe.sizes == [] and record.shape == (4, 2) and result["global_step"] == STEPS + 2
    written = json.loads((out / micro_batch.RECORD_NAME).read_text())
    assert (written["micro_batch_size"], written["source"]) == (4, "probe")    # how it was chosen, kept


def test_a_resume_with_another_number_runs_with_it_and_logs_the_change(auto_run, small_shards, tmp_path,
                                                                       tiny_overrides, caplog):
    source, _, _, _ = auto_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    with caplog.at_level(logging.WARNING, logger="pipeline.pretraining"):
        record, result = _train(small_shards, out, tiny_overrides, "data.micro_batch_size=8", "ckpt_path=last",
                                "resume.accept_changes=[trainer.max_steps,data.micro_batch_size]", steps=STEPS + 2)
    assert record.shape == (8, 1) and result["global_step"] == STEPS + 2
    assert "micro_batch.json records 4 sequences per pass" in caplog.text
    assert json.loads((out / micro_batch.RECORD_NAME).read_text())["micro_batch_size"] == 8
