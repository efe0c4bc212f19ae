"""When DeepSpeed ZeRO reduces the gradients under accumulation, counted in the real pre-training run (train() on a real
shard set) on 2 CPU processes, with accumulation 2 and bf16-mixed (autocast over fp32 weights, as on the GPU):

- ZeRO-1 (deepspeed_stage_1.yaml) reduces nothing on the micro-batch before the boundary and every gradient element
  once on the boundary micro-batch, as DDP does under accumulation; with buckets smaller than the model, in several
  all-reduces, still all on the boundary micro-batch.
- ZeRO-2 (deepspeed_stage_2.yaml) reduces every gradient element on every micro-batch: its gradients are partitioned,
  and DeepSpeed 0.19.8 has no setting that defers the reduction to the boundary.
- Every reduction is fp32 (the parameters stay fp32; pipeline/core/speed/strategies.py marks none for bf16), as DDP's.

The child script counts the reduction collectives (torch.distributed's, which DeepSpeed's comm layer calls) made inside
each DeepSpeedEngine.backward and DeepSpeedEngine.step, and records whether DeepSpeed took that micro-batch for the
accumulation boundary.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

MAX_STEPS = 3                      # optimizer steps; 2 micro-batches each
REDUCTIONS = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced"}

# Lightning's subprocess launcher re-runs this file for rank 1, so it is a file, not `python -c`.
RUN_SCRIPT = textwrap.dedent('''
    import functools, json, sys
    import torch
    import torch.distributed as torch_dist

    torch.set_num_threads(1)
    out = sys.argv[1]
    CALLS = []        # one record per DeepSpeedEngine.backward / .step call, in order
    OPEN = []         # the record of the engine call in progress

    # Before DeepSpeed is imported: its comm layer binds some of these functions when it starts.
    def counted(name, collective):
        @functools.wraps(collective)
        def wrapper(*args, **kwargs):
            if OPEN:     # the first tensor argument: the one reduced, or the all-gather's output
                tensor = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
                OPEN[-1]["collectives"].append([name, int(tensor.numel()), str(tensor.dtype).removeprefix("torch.")])
            return collective(*args, **kwargs)
        return wrapper

    for name in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced",
                 "all_gather_into_tensor"):
        if hasattr(torch_dist, name):
            setattr(torch_dist, name, counted(name, getattr(torch_dist, name)))

    from deepspeed.runtime.engine import DeepSpeedEngine

    def recorded(where, method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            OPEN.append({"where": where, "boundary": bool(self.is_gradient_accumulation_boundary()), "collectives": []})
            try:
                return method(self, *args, **kwargs)
            finally:
                CALLS.append(OPEN.pop())
        return wrapper

    DeepSpeedEngine.backward = recorded("backward", DeepSpeedEngine.backward)
    DeepSpeedEngine.step = recorded("step", DeepSpeedEngine.step)

    import pytorch_lightning as pl
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train


    class Record(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            engine = trainer.strategy.deepspeed_engine
            record = {"rank": trainer.global_rank, "world_size": trainer.world_size,
                      "zero_stage": int(engine.zero_optimization_stage()),
                      "accumulation": engine.gradient_accumulation_steps(),
                      "zero_optimization": trainer.strategy.config["zero_optimization"],
                      "parameters": sum(p.numel() for p in pl_module.parameters()),   # whole on each rank (ZeRO 1/2)
                      "groups": len(engine.optimizer.optimizer.param_groups), "calls": CALLS}
            with open(f"{out}/rank{trainer.global_rank}.json", "w") as handle:
                json.dump(record, handle)


    train(compose("train", sys.argv[2:]), extra_callbacks=[Record()])
''')


def run_counted(strategy: str, extra: tuple[str, ...], shards: Path, tmp_path: Path, tiny_overrides,
                extensions_dir: str) -> list[dict]:
    script, out = tmp_path / "run.py", tmp_path / "out"
    script.write_text(RUN_SCRIPT)
    out.mkdir()
    # 2 ranks x micro-batch 2 x accumulation 2 = the global batch of 8
    overrides = tiny_overrides(shards, out / "run", MAX_STEPS, "trainer.devices=2", "data.micro_batch_size=2",
                               "trainer.precision=bf16-mixed", f"strategy={strategy}", "export.hf=false",
                               "export.plot=false", *extra)
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=extensions_dir)
    proc = run_rank_group([sys.executable, str(script), str(out), *overrides], env, timeout_s=600)
    assert proc.returncode == 0, f"{strategy}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def reductions(call: dict) -> list[list]:
    return [c for c in call["collectives"] if c[0] in REDUCTIONS]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [
    ("deepspeed_stage_1", ()),
    ("deepspeed_stage_1", ("strategy.zero_optimization.reduce_bucket_size=1000000",)),   # buckets < the model
    ("deepspeed_stage_2", ()),
], ids=["zero1", "zero1-small-buckets", "zero2"])
def test_zero_reduces_the_gradients_once_a_step_or_every_micro_batch(strategy, extra, small_shards, tmp_path,
                                                                      tiny_overrides, torch_extensions_dir):
    ranks = run_counted(strategy, extra, small_shards, tmp_path, tiny_overrides, torch_extensions_dir)
    stage = int(strategy.rsplit("_", 1)[1])
    for record in ranks:
        assert (record["world_size"], record["zero_stage"], record["accumulation"]) == (2, stage, 2)
        if extra:
            assert record["zero_optimization"]["reduce_bucket_size"] == 1_000_000
        backwards = [c for c in record["calls"] if c["where"] == "backward"]
        steps = [c for c in record["calls"] if c["where"] == "step"]
        assert [c["boundary"] for c in backwards] == [False, True] * MAX_STEPS      # DeepSpeed's own count
        for call in backwards:
            reduced = reductions(call)
            assert {dtype for _, _, dtype in reduced} <= {"float32"}, call        # fp32, as DDP's under bf16-mixed
            if stage == 1 and not call["boundary"]:
                assert reduced == [], call                  # the micro-batch before the boundary only accumulates
                continue
            # ZeRO-1 on the boundary, ZeRO-2 on every micro-batch: each gradient element reduced exactly once
            assert {op for op, _, _ in reduced} == {"all_reduce"}, call
            assert sum(numel for _, numel, _ in reduced) == record["parameters"], call
            if extra:
                assert len(reduced) > 1, call               # several buckets, every one on the boundary micro-batch
        for call in steps:
            # the optimizer step reduces no gradient (its 1-element all-reduces are the clipping norm's) and
            # all-gathers the updated parameters once a group: allgather_bucket_size is not read
            assert all(numel < 10 for _, numel, _ in reductions(call)), call
            gathers = [c for c in call["collectives"] if c[0] == "all_gather_into_tensor"]
            assert len(gathers) == (record["groups"] if call["boundary"] else 0), call
    assert ranks[0]["calls"] == ranks[1]["calls"]
