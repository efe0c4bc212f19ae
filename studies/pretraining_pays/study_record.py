"""The study's record in the repository (studies/pretraining_pays/record/): every finished result that a later stage or
the report reads, copied out of <out> as it is made, so that the study outlives the machine that ran a stage.

The study runs for many hours, in sittings, and a sitting's machine can be replaced: on 2026-11-26 one was, and
outputs/study/ went with it (the search, the calibration and a finished 120-minute arm). The repository is what
carries over. So each stage first restores what the record holds and it lacks, and keeps what it finished:

    restore(out, record)   copies into <out> every recorded file that <out> lacks (before a stage)
    keep(out, record)      copies into the record every finished result of <out> (after each arm and stage)

Kept: the calibration, the search's DONE records and choices, the corpora's counts, each finished pre-training arm's
DONE, metrics.csv and Hugging Face export (the fine-tuning starts from it), and every downstream result file. Not
kept: shards, corpora text and checkpoints, which the stages make again from ../shared/data (data_prep is
byte-identical run to run), and an unfinished arm (it starts again).

The export's weights (model.safetensors, about 10 MB an arm at BERT-tiny) are kept as a pointer, not a copy:
model.safetensors.json holds their git blob id, sha256 and size. The working tree must stay small enough to travel
to a lent GPU machine (64 MiB with what it carries: issue 48), and 73.5 MB of weights did not. Weights committed
before 2026-11-29 live on in git's history, and restore() takes them from there (`git cat-file blob <id>`),
checked against the sha256; weights of later runs are in no commit, so a machine replaced between an arm's
pre-training and its fine-tuning trains the arm again (restore says so).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from benchmarks_common import STUDY
from study_report import HELDOUT_FILE
from study_results import NOT_ARMS

from pipeline.core.checkpoints.atomic_files import atomic_file

RECORD = STUDY / "record"
# Relative to <out>. The pre-training and search patterns are read only in runs that have a DONE.
KEPT = ("calibration.json", "corpora/*/stats.json", "search/*/choice.json", str(HELDOUT_FILE),
        "finetune/*/*/*/seed*.json", "finetune/*/zeroshot/*.json", "finetune/*/rates/*.json",
        "finetune/*/rates/*/*.json")
FINISHED_RUN_FILES = ("DONE", "csv/metrics.csv", "hf_export/*")
# The second protocol (evidence_protocol.md, section 6): the same, in record/evidence/, and lighter: weights only for
# the arms an endpoint compares (pretrain/*: the replication's runs and the remedy arm); the plateau tries keep their
# DONE and curve, the random encoders nothing (made again from their seeds).
EVIDENCE_RECORD = RECORD / "evidence"
EVIDENCE_KEPT = ("corpora/*/stats.json", "sensitivity/*.json", "sensitivity/finetune/*/*/*/seed*.json",
                 "finetune/*/*/*/seed*.json", "finetune/*/rates/*.json", "finetune/*/rates/*/*.json",
                 "plateau/choice.json", "plateau/*/*/DONE", "plateau/*/*/csv/metrics.csv")


def _finished(out: Path, kept: tuple[str, ...] = KEPT) -> list[Path]:
    """Relative paths of every file of <out> the record keeps."""
    files = [path for pattern in kept for path in out.glob(pattern)]
    for run in [*out.glob("pretrain/*"), *out.glob("search/*/*")]:
        if (run / "DONE").is_file():
            files += [run / "DONE"] if run.parent.parent.name == "search" else [
                path for pattern in FINISHED_RUN_FILES for path in run.glob(pattern)]
    relative = [path.relative_to(out) for path in files if path.is_file() and not path.name.startswith(".")]
    return sorted(path for path in relative
                  if not (path.parts[0] == "finetune" and (path.parts[1] in NOT_ARMS or path.parts[2] == "runs")))


WEIGHTS = "model.safetensors"
POINTER = WEIGHTS + ".json"


def weights_pointer(weights: Path) -> dict[str, int | str]:
    data = weights.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()   # what `git hash-object` names it
    return {"git_blob": blob, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _weights_from_history(pointer: Path, target: Path) -> bool:
    """The weights a pointer names, from the repository's objects into target; False where no commit holds them."""
    wanted = json.loads(pointer.read_text())
    found = subprocess.run(["git", "cat-file", "blob", wanted["git_blob"]], cwd=pointer.parent, capture_output=True)
    if found.returncode != 0 or hashlib.sha256(found.stdout).hexdigest() != wanted["sha256"]:
        return False
    with atomic_file(target) as copy:
        copy.write(found.stdout)
    return True


def _copy(source: Path, target: Path) -> None:
    """Whole or not at all: a copy cut short must not pass for a finished result on either side."""
    with atomic_file(target) as copy, open(source, "rb") as original:
        shutil.copyfileobj(original, copy)


def keep(out: Path, record: Path = RECORD, kept: tuple[str, ...] = KEPT) -> list[Path]:
    """Copies the finished results of <out> that the record lacks or holds in another version; returns them."""
    copied = []
    for relative in _finished(out, kept):
        source, target = out / relative, record / relative
        if relative.name == WEIGHTS:   # a pointer, not the weights (see above)
            target, pointer = target.with_name(POINTER), json.dumps(weights_pointer(source), indent=1) + "\n"
            if target.is_file() and target.read_text() == pointer:
                continue
            with atomic_file(target) as handle:
                handle.write(pointer.encode())
            copied.append(relative.with_name(POINTER))
            continue
        if target.is_file() and target.read_bytes() == source.read_bytes():
            continue
        _copy(source, target)
        copied.append(relative)
    return copied


def restore_export(recorded: Path, target: Path) -> Path:
    """A recorded Hugging Face export, whole, in target (its weights from git's history): what a stage reads where it
    starts from a recorded arm's export rather than from <out>'s. Refused, naming it, if no commit holds them."""
    for source in recorded.iterdir():
        if source.is_file() and source.name != POINTER and not (target / source.name).exists():
            _copy(source, target / source.name)
    if (recorded / POINTER).is_file() and not (target / WEIGHTS).exists():
        if not _weights_from_history(recorded / POINTER, target / WEIGHTS):
            raise FileNotFoundError(f"no commit holds the weights {recorded / POINTER} names")
    return target


def restore(out: Path, record: Path = RECORD) -> list[Path]:
    """Copies into <out> every recorded file it lacks (never over one it has), the weights a pointer names from git's
    history; returns them. Weights no commit holds are not restored, and said."""
    restored = []
    if not record.is_dir():
        return restored
    for source in sorted(path for path in record.rglob("*") if path.is_file() and not path.name.startswith(".")):
        relative = source.relative_to(record)
        if relative.name == "README.md" and len(relative.parts) == 1:
            continue
        if relative.name == POINTER:
            target = out / relative.with_name(WEIGHTS)
            if target.exists():
                continue
            if _weights_from_history(source, target):
                restored.append(relative.with_name(WEIGHTS))
            else:
                print(f"not restored: {relative.with_name(WEIGHTS)} (no commit holds the weights {source} names: "
                      "the arm trains again before it is fine-tuned)", flush=True)
            continue
        target = out / relative
        if not target.exists():
            _copy(source, target)
            restored.append(relative)
    return restored
