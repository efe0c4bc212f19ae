"""Real 2-process CPU runs of the strategies build_strategy makes: DDP over gloo, and DeepSpeed ZeRO 2 and 3 through
CPUDeepSpeedStrategy (sharded checkpoints that consolidate exactly, the pipeline's schedule and parameter groups)."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.core.app import compose
from pipeline.core.checkpoints.checkpoint_files import is_complete
from pipeline.core.speed.strategies import deepspeed_config
from tests.helpers.ranks import local_launch_env, run_rank_group

# ---------------------------------------------------------------------------------------------- 2-process runs

# One script for both runs: a tiny regression LightningModule trained by 2 CPU processes (Lightning's subprocess
# launcher re-runs this file for rank 1), with the strategy from build_strategy and a conf/strategy file.
RUN_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import pytorch_lightning as pl
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader, TensorDataset
    from pipeline.core.speed.strategies import build_strategy

    out_dir, strategy_name = sys.argv[1], sys.argv[2]
    MAX_STEPS, ACCUMULATE, MICRO_BATCH = 5, 2, 4
    OPTIMIZER = dict(name="adamw", lr=0.01, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01)
    SCHEDULE = dict(name="linear_warmup", warmup_steps=2, total_steps=4)


    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                           torch.nn.Linear(32, 1))
            self.lrs = []

        def training_step(self, batch, batch_idx):
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):   # as BertPretrainingModule's: the pipeline's groups and schedule
            from pipeline.core.optim.optimizers import build_optimizer, build_scheduler
            from pipeline.core.speed.strategies import offloads_optimizer
            optimizer = build_optimizer(self.net, OPTIMIZER, offload=offloads_optimizer(self.trainer.strategy))
            scheduler = build_scheduler(optimizer, SCHEDULE, MAX_STEPS)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


    def data(seed):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=MICRO_BATCH)


    from pipeline.core.app import compose
    strategy_cfg = compose("train", [f"strategy={strategy_name}"]).strategy
    deepspeed = strategy_cfg.name == "deepspeed"


    def trainer():
        strategy = build_strategy(strategy_cfg, precision="32", gradient_clip_val=1.0, micro_batch_size=MICRO_BATCH,
                                  accumulate_grad_batches=ACCUMULATE, accelerator="cpu")
        return pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, precision="32", max_steps=MAX_STEPS,
                          accumulate_grad_batches=ACCUMULATE, gradient_clip_val=1.0, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          num_sanity_val_steps=0, default_root_dir=out_dir)


    pl.seed_everything(0)
    model = Tiny()
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    fit = trainer()
    fit.fit(model, train_dataloaders=data(1))
    rank = fit.global_rank
    report = {"rank": rank, "world_size": fit.world_size, "backend": torch.distributed.get_backend(),
              "strategy": type(fit.strategy).__name__, "global_step": fit.global_step, "lrs": model.lrs}
    if deepspeed:
        import deepspeed as ds
        engine = fit.strategy.deepspeed_engine
        report.update(zero_stage=engine.zero_optimization_stage(), ds_config=fit.strategy.config,
                      optimizer=type(engine.optimizer.optimizer).__name__,
                      ds_optimizer=type(engine.optimizer).__name__,
                      gradient_accumulation_steps=engine.gradient_accumulation_steps(),
                      gradient_clipping=engine.gradient_clipping())
        with ds.zero.GatheredParameters(list(model.parameters()), enabled=report["zero_stage"] == 3):
            weights = {k: v.detach().clone() for k, v in model.named_parameters()}
        ckpt = os.path.join(out_dir, "sharded.ckpt")
        fit.save_checkpoint(ckpt)                           # one shard per rank
        fit.strategy.barrier()
        if rank == 0:
            from pytorch_lightning.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict
            convert_zero_checkpoint_to_fp32_state_dict(ckpt, os.path.join(out_dir, "consolidated.pt"))
        # The evaluation set-up (DeepSpeed engine without optimizer). ZeRO 2: a fresh model loads the sharded
        # checkpoint. ZeRO 3: DeepSpeed 0.19.8 cannot load a ZeRO-3 checkpoint into an engine without optimizer
        # (DeepSpeedZeRoOffload has no _restore_from_bit16_weights), so the trained model is evaluated as it is.
        pl.seed_everything(123)
        if report["zero_stage"] == 3:
            metrics = trainer().validate(model, dataloaders=data(2), verbose=False)
        else:
            metrics = trainer().validate(Tiny(), dataloaders=data(2), ckpt_path=ckpt, verbose=False)
        report["val_loss"] = metrics[0]["val_loss"]
    else:
        weights = {k: v.detach().clone() for k, v in model.named_parameters()}
        report["ddp_kwargs"] = fit.strategy._ddp_kwargs
    report["groups"] = [(g.get("name"), g["weight_decay"]) for g in fit.optimizers[0].param_groups]
    torch.save({"initial": initial, "final": weights}, os.path.join(out_dir, f"weights-rank{rank}.pt"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
''')


def run_two_processes(tmp_path: Path, strategy_name: str, torch_extensions_dir: str, timeout_s: int
                      ) -> tuple[list[dict], Path]:
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    proc = run_rank_group([sys.executable, str(script), str(out), strategy_name], env, timeout_s)
    log = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, log
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], out


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path, torch_extensions_dir):
    ranks, out = run_two_processes(tmp_path, "ddp", torch_extensions_dir, timeout_s=300)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["world_size"], r["backend"], r["strategy"], r["global_step"]) == (2, "gloo", "DDPStrategy", 5)
        assert r["ddp_kwargs"]["find_unused_parameters"] is False
        assert r["groups"] == [["decay", 0.01], ["no_decay", 0.0]]
        assert r["lrs"] == pytest.approx(reference_lrs(0.01, warmup=2, total=4, steps=5, accumulate=2))
    w0, w1 = (torch.load(out / f"weights-rank{r}.pt") for r in (0, 1))
    assert_same_weights(w0["final"], w1["final"])                      # gradients were all-reduced
    assert not torch.equal(w0["final"]["net.0.weight"], w0["initial"]["net.0.weight"])


def reference_lrs(lr: float, warmup: int, total: int, steps: int, accumulate: int) -> list[float]:
    """The rate of each micro-batch: optimizer step k at lr * k / warmup, then lr * (total - k) / (total - warmup),
    as google-research/bert and pipeline/core/optim/optimizers.py; the same for all micro-batches of one optimizer
    step."""
    def at(k: int) -> float:
        return lr * (k / warmup if k < warmup else max(0.0, (total - k) / (total - warmup)))
    return [at(k) for k in range(steps) for _ in range(accumulate)]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_two_cpu_processes_checkpoint_consolidates_exactly(stage, tmp_path, torch_extensions_dir):
    ranks, out = run_two_processes(tmp_path, f"deepspeed_stage_{stage}", torch_extensions_dir, timeout_s=540)
    expected_config = deepspeed_config(compose("train", [f"strategy=deepspeed_stage_{stage}"]).strategy, precision="32",
                                       gradient_clip_val=1.0, micro_batch_size=4, accumulate_grad_batches=2)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["world_size"], r["backend"], r["strategy"]) == (2, "gloo", "CPUDeepSpeedStrategy")
        assert (r["zero_stage"], r["global_step"], r["gradient_accumulation_steps"]) == (stage, 5, 2)
        assert r["gradient_clipping"] == 1.0
        assert r["ds_config"] == expected_config       # what DeepSpeed got: ours, Lightning added only accumulation
        # the LightningModule's optimizer (torch's AdamW over the pipeline's two groups), wrapped by ZeRO
        assert r["optimizer"] == "AdamW"
        assert r["ds_optimizer"] == {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}[stage]
        assert r["groups"] == [["decay", 0.01], ["no_decay", 0.0]]
        # the pipeline's schedule, stepped once per optimizer step under DeepSpeed too, runs the reference schedule
        assert r["lrs"] == pytest.approx(reference_lrs(0.01, warmup=2, total=4, steps=5, accumulate=2))

    w0, w1 = (torch.load(out / f"weights-rank{r}.pt") for r in (0, 1))
    assert_same_weights(w0["final"], w1["final"])
    assert not torch.equal(w0["final"]["net.0.weight"], w0["initial"]["net.0.weight"])
    tag = (out / "sharded.ckpt" / "latest").read_text().strip()     # pipeline/core/checkpoints/deepspeed_checkpoints.py
    assert sorted(p.name for p in (out / "sharded.ckpt" / tag).iterdir() if "optim_states" in p.name) == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert is_complete(out / "sharded.ckpt")
    consolidated = torch.load(out / "consolidated.pt", weights_only=False)
    assert consolidated["global_step"] == 5
    assert_same_weights(consolidated["state_dict"], w0["final"])        # bit for bit

    # The evaluation engine on both ranks (override 3's second call site) computes the loss of these weights.
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    net.load_state_dict({k.removeprefix("net."): v for k, v in consolidated["state_dict"].items()})
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected_loss = torch.nn.functional.mse_loss(net(x), x.sum(1, keepdim=True).sin()).item()
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"] == pytest.approx(expected_loss, rel=1e-5)
