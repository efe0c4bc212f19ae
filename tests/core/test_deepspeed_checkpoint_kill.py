"""A DeepSpeed checkpoint counts as complete only once every rank's shards are written: 2 CPU processes under ZeRO-2
(the real pre-training), killed inside a save, and separately a shard of the newest checkpoint cut short; each time
the resume (ckpt_path=auto, what every SLURM start passes) takes the previous complete checkpoint and logs which one
and why it passed over the newer."""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

# The pre-training on 2 CPU processes (Lightning's launcher re-runs this script for rank 1), printing the step each
# fit starts and ends at. With KILL_IN=<checkpoint name>, rank 1 dies inside that checkpoint's save, with rank 0:
# torch.save of its ZeRO shard waits until rank 0 has written its own files (and DeepSpeed's `latest`, where rank 0
# writes one without waiting for the others, up to 5 s), writes half of its bytes, then kills rank 0 and itself, as a
# node failure or the time limit's SIGKILL would.
SCRIPT = """
import io, logging, os, signal, sys, time, zipfile
from pathlib import Path
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
kill_in, rank = os.environ.get("KILL_IN"), int(os.environ.get("LOCAL_RANK", "0"))
real_save = torch.save


def whole(path):
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def save_then_die_half_way(obj, f, *args, **kwargs):
    path = Path(str(f))
    if not (kill_in in path.parts and path.name.startswith("zero_pp_rank_1_")):
        return real_save(obj, f, *args, **kwargs)
    rank0_shard = path.with_name(path.name.replace("zero_pp_rank_1_", "zero_pp_rank_0_"))
    while not whole(rank0_shard):
        time.sleep(0.05)
    latest = next(p for p in path.parents if p.name == kill_in) / "latest"
    for _ in range(100):
        if latest.exists():
            break
        time.sleep(0.05)
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    with open(path, "wb") as out:
        out.write(buffer.getvalue()[: buffer.tell() // 2])
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if kill_in and rank == 1:
    torch.save = save_then_die_half_way


class Steps(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        print(f"RANK {trainer.global_rank} START_STEP {trainer.global_step}", flush=True)


result = train(compose("train", sys.argv[1:]), extra_callbacks=[Steps()])
print(f"RANK {result['rank']} FINAL_STEP {result['global_step']}", flush=True)
"""


def run(tmp_path: Path, output_dir: Path, max_steps: int, torch_extensions_dir: str, shards: Path,
        kill_in: str | None = None, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    script = tmp_path / "deepspeed_training.py"
    script.write_text(SCRIPT)
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    if kill_in:
        env["KILL_IN"] = kill_in
    overrides = [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=deepspeed_stage_2",
                 "data.global_batch_size=4", "data.micro_batch_size=2", "data.num_workers=0",
                 f"trainer.max_steps={max_steps}", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "scheduler.warmup_steps=2",
                 "callbacks.checkpoint.every_n_train_steps=2", "callbacks.checkpoint.save_last=false",
                 "ckpt_path=auto", "export.hf=false", "export.plot=false", "data.verify_checksums=false", *extra]
    return run_rank_group([sys.executable, str(script), *overrides], env, timeout_s=600)


def steps(output: str, kind: str) -> set[int]:
    return {int(m) for m in re.findall(rf"RANK [01] {kind} (\d+)", output)}


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory, small_shards, torch_extensions_dir):
    """A 6-step run (checkpoints at steps 2, 4, 6) killed inside the save of step 4, then started again."""
    tmp = tmp_path_factory.mktemp("deepspeed_kill")
    run_dir = tmp / "run"
    killed = run(tmp, run_dir, 6, torch_extensions_dir, small_shards, kill_in="step0000004.ckpt")
    resumed = run(tmp, run_dir, 6, torch_extensions_dir, small_shards)
    return tmp, run_dir, killed, resumed


@pytest.mark.slow
def test_a_kill_inside_a_save_resumes_from_the_previous_complete_checkpoint(killed_then_resumed):
    _, run_dir, killed, resumed = killed_then_resumed
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-6000:]
    assert (run_dir / "checkpoints" / "step0000004.ckpt").is_dir()          # the save was under way
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    half_written = run_dir / "checkpoints" / "step0000004.ckpt"
    assert f"not resuming from {half_written}: no `latest` file: its save never finished" in log
    assert f"resuming from {run_dir / 'checkpoints' / 'step0000002.ckpt'}, the newest complete checkpoint" in log
    assert steps(log, "START_STEP") == {2} and steps(log, "FINAL_STEP") == {6}


@pytest.mark.slow
def test_a_truncated_shard_of_the_newest_checkpoint_resumes_from_the_previous(killed_then_resumed,
                                                                             torch_extensions_dir, small_shards):
    tmp, finished, _, resumed = killed_then_resumed
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    run_dir = shutil.copytree(finished, tmp / "truncated")
    newest = run_dir / "checkpoints" / "step0000006.ckpt"
    tag = (newest / "latest").read_text().strip()
    shard = newest / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:       # cut short in place, as a full disk or a bad copy would
        handle.truncate(size // 2)

    # A longer run than the one checkpointed: a change of what shapes it, accepted as meant
    again = run(tmp, run_dir, 8, torch_extensions_dir, small_shards,
                extra=("resume.accept_changes=[trainer.max_steps]",))
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-6000:]
    assert (f"not resuming from {newest}: {tag}/{shard.name} has {size // 2} bytes, its completion record says "
            f"{size}") in log
    assert f"resuming from {run_dir / 'checkpoints' / 'step0000004.ckpt'}, the newest complete checkpoint" in log
    assert steps(log, "START_STEP") == {4} and steps(log, "FINAL_STEP") == {8}
