"""A checkpoint that does not fit (full disk, quota, file-size limit) fails naming the file, the free space and the
cause, and leaves the checkpoint before it whole and no partial file: the write really fails, in a process whose
file-size limit (RLIMIT_FSIZE) is below the checkpoint's size."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from pipeline.core.checkpoints.checkpoint_files import PARTIAL_PREFIX

REPO_ROOT = Path(__file__).resolve().parents[2]

# The first checkpoint (4 KiB) fits under the 1 MiB limit, the second (4 MiB) does not.
SAVE_UNDER_A_SIZE_LIMIT = """
import resource, signal, sys
sys.path.insert(0, {repo!r})
import torch
from pipeline.core.checkpoints.lightning_checkpoints import AtomicCheckpointIO

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit then fails with EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
io = AtomicCheckpointIO()
io.save_checkpoint({{"step": 1, "w": torch.ones(1024)}}, {target!r})
io.save_checkpoint({{"step": 2, "w": torch.ones(1 << 20)}}, {target!r})
"""


def test_a_checkpoint_that_does_not_fit_fails_clearly_and_keeps_the_previous(tmp_path):
    target = tmp_path / "checkpoints" / "last.ckpt"
    script = SAVE_UNDER_A_SIZE_LIMIT.format(repo=str(REPO_ROOT), target=str(target))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"OSError: checkpoint {target} not written (")
    assert "unexpected pos" in error and "GiB free on its filesystem" in error and "untouched" in error
    assert torch.load(target, weights_only=True)["step"] == 1
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(PARTIAL_PREFIX)] == []


def test_a_checkpoint_whose_folder_cannot_be_made_fails_naming_it(tmp_path):
    """The error reports the free space of the nearest folder that exists (the checkpoint's own was never made)."""
    import pytest

    from pipeline.core.checkpoints.lightning_checkpoints import AtomicCheckpointIO

    (tmp_path / "runs").write_text("a file where the run's folder should be")
    target = tmp_path / "runs" / "checkpoints" / "last.ckpt"
    with pytest.raises(OSError, match=f"checkpoint {target} not written .* GiB free on its filesystem"):
        AtomicCheckpointIO().save_checkpoint({"step": 1}, str(target))
