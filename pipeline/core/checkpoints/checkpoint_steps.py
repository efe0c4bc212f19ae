"""The optimizer step a checkpoint holds, read cheaply and without torch: what "newest" means for a run's checkpoints.
And the hyper-parameters it was trained with (Lightning's `hyper_parameters`), which a resume compares with its
config (pipeline/core/run/run_record.py), read the same way.

A file's mtime says when it was last touched, not what it holds: `touch` (users dodge scratch purges with it), `cp -r`
without -p and an rsync of a run directory reorder checkpoints by mtime. The step does not change with any of them.
Where a checkpoint says its step, from the cheapest source that does:
- a periodic checkpoint's name, `step<N>.ckpt` (checkpoint_retention.STEP_FILENAME), a file or a DeepSpeed directory;
- a DeepSpeed directory's completion record (`<tag>/complete.json`, deepspeed_checkpoints.publish: its global_step);
- else the checkpoint's own dict: Lightning saves `global_step` in it, and in a DeepSpeed directory it is in the
  model-states file's client state. A torch file is a zip whose `<name>/data.pkl` holds the dict's pickle, the tensors
  stored beside it: that pickle is read with every class and tensor replaced by a stand-in, so a 4 GB last.ckpt costs
  a read of its zip directory and a pickle of some kilobytes, and nothing in it is run.
"""
from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path

from pipeline.core.checkpoints.checkpoint_retention import step_of_name

LATEST = "latest"                     # checkpoint_files.LATEST (not imported: checkpoint_files imports this module)
COMPLETION_RECORD = "complete.json"   # checkpoint_files.COMPLETION_RECORD
_MODEL_STATES = re.compile(r"^(zero_pp_rank_0_)?mp_rank_0+_model_states\.pt$")   # DeepSpeed's rank-0 client state


def recorded_step(path: Path) -> int | None:
    """The global step checkpoint `path` (a torch file or a DeepSpeed directory) holds; None where it says none (or is
    cut short: its completeness check, checkpoint_files.checkpoint_problem, says why). Raises PermissionError for a
    file this process may not read: which checkpoint is the newest cannot be told then."""
    path = Path(path)
    named = step_of_name(path.name)
    if named is not None:
        return named
    if path.is_dir():
        return _directory_step(path)
    return _pickled_step(path)


def _directory_step(path: Path) -> int | None:
    try:
        tag_dir = path / (path / LATEST).read_text(encoding="utf-8").strip()
    except PermissionError:
        raise
    except OSError:
        return None
    try:
        step = json.loads((tag_dir / COMPLETION_RECORD).read_text(encoding="utf-8")).get("global_step")
    except PermissionError:
        raise
    except (OSError, ValueError, AttributeError):
        step = None   # an older directory, without a record: its client state says it
    if isinstance(step, int):
        return step
    states = sorted(f for f in tag_dir.iterdir() if _MODEL_STATES.match(f.name)) if tag_dir.is_dir() else []
    return _pickled_step(states[0]) if states else None


def recorded_hyper_parameters(path: Path) -> dict | None:
    """The `hyper_parameters` that checkpoint `path` (a torch file or a DeepSpeed directory) was saved with, as plain
    values; None where it has none (a checkpoint not written by Lightning) or cannot be read."""
    path = Path(path)
    if path.is_dir():
        try:
            tag_dir = path / (path / LATEST).read_text(encoding="utf-8").strip()
            states = sorted(f for f in tag_dir.iterdir() if _MODEL_STATES.match(f.name))
        except OSError:
            return None
        path = states[0] if states else None
    checkpoint = _pickled_dict(path) if path is not None else None
    values = (checkpoint or {}).get("hyper_parameters")
    return dict(values) if isinstance(values, dict) else None


def _pickled_step(path: Path) -> int | None:
    checkpoint = _pickled_dict(path)
    step = checkpoint.get("global_step") if checkpoint is not None else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _pickled_dict(path: Path) -> dict | None:
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.count("/") == 1 and name.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None
            with archive.open(pickles[0]) as stream:
                checkpoint = _StandInUnpickler(stream).load()
    except PermissionError:
        raise
    except Exception:   # a file cut short, or a pickle of another shape (its completeness check says why)
        return None
    return checkpoint if isinstance(checkpoint, dict) else None


class _StandIn(dict):
    """Whatever object a checkpoint's pickle builds (a tensor, an OrderedDict, numpy's RNG state, a config): only
    plain values (dicts, lists, numbers, strings) are read, so every class becomes this. It keeps the items a dict
    subclass is given (Lightning's AttributeDict of hyper-parameters) and drops everything else."""

    __hash__ = object.__hash__    # hashable as any object (a stand-in may be a key), not as a dict

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass

    def add(self, value):
        pass


class _StandInUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        return _StandIn        # never the named class: nothing of the file's is imported or run

    def persistent_load(self, pid) -> None:
        return None            # torch's reference to a tensor's storage, stored beside the pickle
