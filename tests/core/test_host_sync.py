"""No host-device round trip in a pre-training step outside the steps that log (issue 21, item 6): the real train()
under tests/helpers/host_sync.py's guard. The 2-rank runs (DDP and DeepSpeed) carry the same guard:
tests/core/test_bf16_numerics.py."""
from __future__ import annotations

import torch

from tests.helpers.host_sync import REPO_ROOT, HostSyncGuard


def test_the_guard_records_a_round_trip_made_by_the_pipelines_code_only():
    guard = HostSyncGuard(log_every_n_steps=2)
    patches = guard._patch_cpu()
    try:
        code = "x = torch.ones(3)\nt = torch.tensor(1.0)\nv = x.sum().item()\nif x.any(): pass"
        exec(compile(code, str(REPO_ROOT / "pipeline" / "core" / "somewhere.py"), "exec"), {"torch": torch})
        exec(compile(code, str(REPO_ROOT / "tests" / "elsewhere.py"), "exec"), {"torch": torch})   # not ours
        torch.tensor(2.0).item()                                                                       # nor this
    finally:
        patches.close()
    assert [(v["call"], v["at"]) for v in guard.violations] == [
        ("torch.tensor", f"{REPO_ROOT}/pipeline/core/somewhere.py:2"),
        ("Tensor.item", f"{REPO_ROOT}/pipeline/core/somewhere.py:3"),
        ("Tensor.__bool__", f"{REPO_ROOT}/pipeline/core/somewhere.py:4")]
    assert torch.tensor(3.0).item() == 3.0 and "item" not in vars(torch.Tensor)   # all undone


def test_a_pretraining_step_makes_no_host_round_trip_outside_the_logging_steps(small_shards, tmp_path,
                                                                              tiny_overrides):
    """4 optimizer steps of 2 micro-batches, logging (metrics, throughput, progress bar) every 2nd step: the 6
    micro-batches that do not end a logging step run under the guard. On the old code it records the cross-entropy
    backward's torch.tensor(-1.0, device=...) (model/bert.py), the throughput callback's two torch.tensor(...,
    device=...) per micro-batch and the progress bar's reading of the logged loss at every step."""
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    guard = HostSyncGuard(log_every_n_steps=2)
    overrides = [o for o in tiny_overrides(small_shards, tmp_path / "run", 4) if "enable_progress_bar" not in o]
    train(compose("train", [*overrides, "trainer.enable_progress_bar=true", "callbacks.throughput.log_every_n_steps=2",
                            "callbacks.checkpoint.every_n_train_steps=0", "export.hf=false", "export.plot=false"]),
          extra_callbacks=[guard])
    assert guard.guarded_batches == 6
    assert guard.violations == []
