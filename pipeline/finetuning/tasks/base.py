"""A fine-tuning task: its labels, splits and files, how to read them, how to score predictions and how the GLUE
leaderboard wants them written.  The ten tasks themselves are in :mod:`pipeline.finetuning.tasks.registry`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import datasets

from pipeline.finetuning.tasks import metrics as task_metrics
from pipeline.finetuning.tasks.layouts import FileLayout, HubLayout

KINDS = ("classification", "regression", "multiple_choice")

# "owner/name" with no such local path: a dataset on the hub (the network, or HF's cache when offline).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclasses.dataclass(frozen=True, eq=False)   # eq=False: tasks are singletons; identity equality, hashable
class Task:
    name: str
    kind: str                                  # one of KINDS
    label_names: tuple[str, ...] | None         # in label-id order (the hub's ClassLabel names); None: regression
    main_metric: str                           # the key of metrics() that model selection uses
    splits: dict[str, str]                     # split -> default file name in the task's GLUE directory
    eval_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    layouts: tuple[FileLayout, ...]            # the task's file formats, tried in order on the first line
    file_labels: tuple[str, ...] | None = None  # the labels as files and the leaderboard write them, in id order
    # which metrics() computes: see pipeline.finetuning.tasks.metrics.METRIC_SETS
    metric_set: str = "acc"
    submission_files: dict[str, str] = dataclasses.field(default_factory=dict)  # test split -> leaderboard file
    other_file_names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # e.g. CoLA's raw release
    hub: HubLayout | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if (self.label_names is None) != (self.kind == "regression"):
            raise ValueError(f"task {self.name}: label_names must be None exactly for regression")
        if self.label_names is not None and len(self.file_labels or ()) != len(self.label_names):
            raise ValueError(f"task {self.name}: file_labels must list the {len(self.label_names)} labels")
        unknown = set(self.eval_splits) | set(self.test_splits) | set(self.submission_files)
        if unknown - set(self.splits):
            raise ValueError(f"task {self.name}: splits {sorted(unknown - set(self.splits))} are not in splits")

    # -- labels ---------------------------------------------------------------------------------------------------

    @property
    def num_labels(self) -> int:
        """Outputs of a sequence-classification head (1 for regression); SWAG: the number of choices."""
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def id2label(self) -> dict[int, str] | None:
        return None if self.label_names is None else dict(enumerate(self.label_names))

    # -- reading --------------------------------------------------------------------------------------------------

    def read(self, split: str, path: str | Path, cache_dir: str | Path | None = None) -> datasets.Dataset:
        """One split as a ``datasets.Dataset`` with the columns of :mod:`pipeline.finetuning.tasks.schema`.

        ``path``: the split's file itself; a directory holding the task's files (GLUE layout, e.g. ``glue_data/SST-2``,
        CoLA's raw release, STS-B's original csv files); a local copy of a hub dataset (``<config>/<split>-*.parquet``);
        or a hub dataset name such as ``nyu-mll/glue``.
        """
        from pipeline.finetuning.tasks.delimited import read_delimited
        from pipeline.finetuning.tasks.hub import looks_like_hub_directory, read_hub

        if split not in self.splits:
            raise ValueError(f"task {self.name} has no split {split!r}; its splits: {', '.join(self.splits)}")
        cache = None if cache_dir is None else str(cache_dir)
        location = Path(path).expanduser()
        if location.is_file():
            return read_delimited(self, split, location, cache)
        if location.is_dir():
            found = self.split_file(split, location)
            if found is not None:
                return read_delimited(self, split, found, cache)
            if self.hub is not None and looks_like_hub_directory(location, self.hub.splits[split][0]):
                return read_hub(self, split, str(location), cache)
            raise FileNotFoundError(f"{self.name} {split}: no {self._split_candidates(split)[0]} in {location}. "
                                    f"{self.expected_files()}")
        if self.hub is not None and _HUB_ID.fullmatch(str(path)):
            return read_hub(self, split, str(path), cache)
        raise FileNotFoundError(f"{self.name} {split}: {path} does not exist. {self.expected_files()}")

    def _split_candidates(self, split: str) -> tuple[str, ...]:
        return (self.splits[split], *self.other_file_names.get(split, ()))

    def split_file(self, split: str, directory: Path) -> Path | None:
        """The file of `split` in a directory of the task's files (any of the names it is distributed under)."""
        for name in self._split_candidates(split):
            if (directory / name).is_file():
                return (directory / name).resolve()
        return None

    def expected_files(self) -> str:
        """What a directory for this task holds, for error messages."""
        files = "; ".join(f"{split}: {' or '.join(self._split_candidates(split))}" for split in self.splits)
        text = f"Pass the split's file, or a directory with {self.name}'s files ({files})"
        if self.hub is not None:
            configs = sorted({config for config, _ in self.hub.splits.values()})
            text += f", or {self.hub.dataset} (config {'/'.join(configs)}) in hub layout"
        return text + "."

    # -- scoring and submission -----------------------------------------------------------------------------------

    def metrics(self, predictions, labels) -> dict[str, float]:
        """Scores of label ids (floats for STS-B) against gold labels; keys per task: see ``metric_set``."""
        return task_metrics.compute(self.metric_set, predictions, labels,
                                    num_labels=None if self.kind == "regression" else self.num_labels)

    def submission_file(self, split: str) -> str | None:
        """The GLUE leaderboard's file name for a test split (``MNLI-m.tsv``, ``AX.tsv``); None if it has none."""
        if split not in self.splits:
            raise ValueError(f"task {self.name} has no split {split!r}; its splits: {', '.join(self.splits)}")
        return self.submission_files.get(split)

    def prediction_name(self, pred) -> str:
        """A prediction as the leaderboard expects it: label text for MNLI/AX/QNLI/RTE, 0/1 for the other
        classification tasks, STS-B's score as %.3f."""
        if self.kind == "regression":
            score = float(pred)
            if not math.isfinite(score):
                raise ValueError(f"{self.name}: prediction {pred!r} is not a finite score")
            return f"{score:.3f}"
        label = int(pred)
        if label != pred or not 0 <= label < len(self.file_labels):
            raise ValueError(f"{self.name}: prediction {pred!r} is not a label id in 0..{len(self.file_labels) - 1}")
        return self.file_labels[label]
