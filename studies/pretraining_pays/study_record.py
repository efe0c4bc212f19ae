"""The study's record in the repository (studies/pretraining_pays/record/): every finished result that a later stage or
the report reads, copied out of <out> as it is made, so that the study outlives the machine that ran a stage.

The study runs for many hours, in sittings, and a sitting's machine can be replaced: on 2026-11-26 one was, and
outputs/study/ went with it (the search, the calibration and a finished 120-minute arm). The repository is what
carries over. So each stage first restores what the record holds and it lacks, and keeps what it finished:

    restore(out, record)   copies into <out> every recorded file that <out> lacks (before a stage)
    keep(out, record)      copies into the record every finished result of <out> (after each arm and stage)

Kept: the calibration, the search's DONE records and choices, the corpora's counts, each finished pre-training arm's
DONE, metrics.csv and Hugging Face export (about 10 MB at BERT-tiny: the fine-tuning starts from it), and every
downstream result file. Not kept: shards, corpora text and checkpoints, which the stages make again from
../shared/data (data_prep is byte-identical run to run), and an unfinished arm (it starts again).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks_common import STUDY
from study_report import HELDOUT_FILE
from study_results import NOT_ARMS

from pipeline.core.atomic_files import atomic_file

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


def _copy(source: Path, target: Path) -> None:
    """Whole or not at all: a copy cut short must not pass for a finished result on either side."""
    with atomic_file(target) as copy, open(source, "rb") as original:
        shutil.copyfileobj(original, copy)


def keep(out: Path, record: Path = RECORD, kept: tuple[str, ...] = KEPT) -> list[Path]:
    """Copies the finished results of <out> that the record lacks or holds in another version; returns them."""
    copied = []
    for relative in _finished(out, kept):
        source, target = out / relative, record / relative
        if target.is_file() and target.read_bytes() == source.read_bytes():
            continue
        _copy(source, target)
        copied.append(relative)
    return copied


def restore(out: Path, record: Path = RECORD) -> list[Path]:
    """Copies into <out> every recorded file it lacks (never over one it has); returns them."""
    restored = []
    if not record.is_dir():
        return restored
    for source in sorted(path for path in record.rglob("*") if path.is_file() and not path.name.startswith(".")):
        relative = source.relative_to(record)
        if relative.name == "README.md" and len(relative.parts) == 1:
            continue
        target = out / relative
        if not target.exists():
            _copy(source, target)
            restored.append(relative)
    return restored
