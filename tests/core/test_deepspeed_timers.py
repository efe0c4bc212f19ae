"""DeepSpeed's throughput timer off in every config we write (issue 48, item 3). On by default, it calls the
accelerator's synchronize() in every engine forward and every engine.step() (DeepSpeed 0.19.8: runtime/engine.py
tput_timer.start() / .stop(), utils/timer.py ThroughputTimer), a host wait for the GPU twice per micro-batch. A real
engine built from our config, on the CPU, steps a few times: its timer never starts."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from pipeline.core.app import compose
from pipeline.core.speed.strategies import deepspeed_config
from tests.helpers.ranks import local_launch_env, run_rank_group

ENGINE_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/process_group", rank=0, world_size=1)
    import deepspeed

    config = json.loads(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                      config=config)
    for _ in range(4):   # past the timer's start_step (2), where it synchronizes
        engine.backward(engine(torch.randn(2, 4)).sum())
        engine.step()
    timer = engine.tput_timer
    print(json.dumps({"enabled": timer.config.enabled, "synchronized": timer.config.synchronized,
                      "started": timer.initialized, "steps_timed": timer.global_step_count,
                      "wall_clock_breakdown": engine.wall_clock_breakdown()}))
    dist.destroy_process_group()
''')

STRATEGIES = ("deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
              "deepspeed_stage_3_offload")


def config_of(name: str, precision: str = "32") -> dict:
    return deepspeed_config(compose("train", [f"strategy={name}"]).strategy, precision=precision,
                            gradient_clip_val=1.0, micro_batch_size=2, accumulate_grad_batches=1)


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_config_turns_the_timers_off(name, precision, monkeypatch):
    """What DeepSpeed's own parser reads from each config we hand it."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(config_of(name, precision))
    assert (parsed.timers_config.enabled, parsed.timers_config.synchronized) == (False, False)
    assert parsed.wall_clock_breakdown is False


def test_a_real_engine_built_from_our_config_never_starts_its_throughput_timer(tmp_path, torch_extensions_dir):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    proc = run_rank_group([sys.executable, str(script), str(tmp_path), json.dumps(config_of("deepspeed_stage_1"))],
                          env, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    timer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert timer == {"enabled": False, "synchronized": False, "started": False, "steps_timed": 0,
                     "wall_clock_breakdown": False}
