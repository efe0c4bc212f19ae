"""pipeline/core/cluster/restarts.py as train.sbatch runs it (`python -m pipeline.core.cluster.restarts <run dir> --
<command>`), on a stand-in training: a small program that writes a checkpoint (a whole zip file, what
checkpoint_files.py takes for a complete torch file) or not, and exits as told. The real training under SLURM:
tests/pretraining/ test_slurm_restarts.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# argv: <run dir> <write a checkpoint: 0/1> <exit status> [ckpt_path=...]; each try appends its argv to tries.txt.
TRAINING = """
import signal, sys, time, zipfile
from pathlib import Path
run, write, status = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
with open(run / "tries.txt", "a") as tries:
    tries.write(" ".join(sys.argv[4:]) + "\\n")
if write:
    (run / "checkpoints").mkdir(exist_ok=True)
    time.sleep(0.01)      # a newer completion time than the previous try's
    with zipfile.ZipFile(run / "checkpoints" / "last.ckpt", "w") as checkpoint:
        checkpoint.writestr("data.pkl", "weights")
if status == -1:          # wait for the requeue signal, then exit as a requeued training does
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))
    (run / "waiting").touch()
    time.sleep(60)
sys.exit(status)
"""


def supervise(tmp_path: Path, write: bool, status: int, **env: str) -> subprocess.Popen:
    program = tmp_path / "training.py"
    program.write_text(TRAINING)
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.core.cluster.restarts", str(tmp_path), "--", sys.executable, str(program),
         str(tmp_path), str(int(write)), str(status), "ckpt_path=/elsewhere/last.ckpt"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=60)
    return proc.returncode, output


def test_a_try_that_keeps_failing_after_new_checkpoints_stops_when_the_restarts_are_spent(tmp_path):
    code, output = finished(supervise(tmp_path, True, 3, MAX_RESTARTS="1"))
    assert code == 3
    # the first try as given; the restart resumes from the run's own newest checkpoint
    assert (tmp_path / "tries.txt").read_text().splitlines() == ["ckpt_path=/elsewhere/last.ckpt", "ckpt_path=auto"]
    assert "try 1 failed (exit status 3) after writing" in output and "starting try 2 from it" in output
    assert "try 2 failed (exit status 3) after writing" in output
    assert "but the restarts allowed are spent (MAX_RESTARTS=1): the run stops here" in output


def test_a_finished_or_requeued_try_is_never_started_again(tmp_path):
    for status in (0, 75):
        (tmp_path / "tries.txt").unlink(missing_ok=True)
        code, output = finished(supervise(tmp_path, True, status))
        assert code == status and "try" not in output
        assert len((tmp_path / "tries.txt").read_text().splitlines()) == 1


def test_a_try_stopped_on_purpose_is_never_started_again(tmp_path):
    """Ctrl-C or a kill after a new checkpoint: 130 and 143 (pipeline/train.py exits 130 on SIGINT, not Lightning's
    1), or killed by the signal itself."""
    for status, name in ((130, "SIGINT"), (143, "SIGTERM")):
        (tmp_path / "tries.txt").unlink(missing_ok=True)
        code, output = finished(supervise(tmp_path, True, status))
        assert code == status and f"try 1 was stopped ({name}): not started again" in output, output
        assert len((tmp_path / "tries.txt").read_text().splitlines()) == 1


def test_a_try_refused_before_it_started_is_never_started_again(tmp_path):
    """pipeline/train.py exits 2 on a refusal (pipeline.core.app.refused): the next try would meet it again, even
    where a checkpoint newer than at the try's start is there."""
    code, output = finished(supervise(tmp_path, True, 2))
    assert code == 2 and "try 1 refused to start (exit status 2, the reason above): not started again" in output
    assert len((tmp_path / "tries.txt").read_text().splitlines()) == 1


def test_the_requeue_signal_sent_to_the_supervisor_reaches_the_try(tmp_path):
    """`scancel --batch --signal=USR1`, `--signal=B:USR1@N`: the batch shell is the supervisor (train.sbatch
    execs it)."""
    proc = supervise(tmp_path, False, -1)
    deadline = time.monotonic() + 30
    while not (tmp_path / "waiting").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    code, output = finished(proc)
    assert code == 75, output


def test_a_wrong_max_restarts_is_refused_before_anything_runs(tmp_path):
    code, output = finished(supervise(tmp_path, True, 0, MAX_RESTARTS="three"))
    assert code == 2 and "MAX_RESTARTS must be a whole number >= 0" in output
    assert not (tmp_path / "tries.txt").exists()
