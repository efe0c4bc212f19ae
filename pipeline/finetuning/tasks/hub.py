"""Reading a task in Hugging Face hub layout: a hub dataset name (``nyu-mll/glue``) or a local directory laid out
like one (``<config>/<split>-00000-of-00001.parquet``, with or without the hub's README.md that declares configs).

Hub columns are typed already (labels are ids, -1 in test splits), so the checks are fewer than for the TSVs:
a null in a needed column, or a label id outside the task's label set, is a ``ValueError`` naming the row.
"""
from __future__ import annotations

import math
from pathlib import Path

import datasets

from pipeline.finetuning.fingerprint import code_digest
from pipeline.finetuning.tasks import schema
from pipeline.finetuning.tasks.layouts import TaskFormat

_CODE_DIGEST = code_digest(__file__, schema.__file__)


def looks_like_hub_directory(directory: Path, config: str) -> bool:
    """A local copy of a hub dataset: its README.md (which declares the configs), a ``<config>/`` folder, or
    parquet files of one config right here."""
    return ((directory / "README.md").is_file() or (directory / config).is_dir()
            or any(directory.glob("*.parquet")))


def read_hub(task: TaskFormat, split: str, path: str, cache_dir: str | None) -> datasets.Dataset:
    """``load_dataset(path, name=<config>, split=<hub split>)``, then the columns of
    :mod:`pipeline.finetuning.tasks.schema`."""
    layout = task.hub
    config, hub_split = layout.splits[split]
    where = f"{task.name} {split}: {path} (config {config!r}, split {hub_split!r})"
    local = Path(path)
    if local.is_dir() and not (local / "README.md").is_file():
        # Without the README's config list, datasets sees one "default" config: point it at the config's folder.
        selection = {"data_dir": config} if (local / config).is_dir() else {}
    else:
        selection = {"name": config}
    try:
        raw = datasets.load_dataset(path, split=hub_split, cache_dir=cache_dir, **selection)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{where}: not found ({error}). {task.expected_files()}") from error
    except ConnectionError as error:   # offline (HF_DATASETS_OFFLINE=1) or no network, and not in HF's cache
        raise FileNotFoundError(f"{where}: no such local path, and the hub cannot be reached ({error}). "
                                f"{task.expected_files()}") from error
    except ValueError as error:
        if "split" in str(error).lower() or "config" in str(error).lower():
            raise FileNotFoundError(f"{where}: no such config or split ({error}). {task.expected_files()}") from error
        raise
    if len(raw) == 0:
        raise ValueError(f"{where}: no rows (an empty {task.name} split)")
    needed = [c for c in (layout.text_a, layout.text_b, *layout.endings, layout.index) if c is not None]
    missing = [c for c in needed if c not in raw.column_names]
    if missing:
        raise ValueError(f"{where}: no column(s) {missing} (columns: {', '.join(raw.column_names)}); "
                         f"is this {layout.dataset} ({config})?")
    labelled = layout.label in raw.column_names
    if not labelled and split not in task.test_splits:
        raise ValueError(f"{where}: no {layout.label!r} column; the {split} split needs labels")
    normalise = _HubRowNormaliser(task, split, labelled, where)
    return raw.map(normalise, batched=True, with_indices=True, remove_columns=raw.column_names,
                   features=schema.features(task.kind), desc=f"{task.name} {split}")


class _HubRowNormaliser:
    def __init__(self, task: TaskFormat, split: str, labelled: bool, where: str):
        layout = task.hub
        self.kind = task.kind
        self.task_name = task.name
        self.num_labels = None if task.label_names is None else len(task.label_names)
        self.unlabelled_ok = split in task.test_splits    # hub test splits carry label -1
        self.text_columns = [layout.text_a, layout.text_b]
        self.endings = list(layout.endings)
        self.label = layout.label if labelled else None
        self.index = layout.index
        self.where = where
        self.code = _CODE_DIGEST

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out = schema.empty_columns(self.kind)
        for i, row in enumerate(indices):
            texts = [None if c is None else self._value(batch, c, i, row) for c in self.text_columns]
            endings = [self._value(batch, c, i, row) for c in self.endings]
            idx = row if self.index is None else int(self._value(batch, self.index, i, row))
            label = self._label(batch, i, row)
            schema.append_row(out, self.kind, idx, texts, endings, label)
        return out

    def _value(self, batch: dict[str, list], column: str, i: int, row: int):
        value = batch[column][i]
        if value is None:
            self._fail(batch, i, row, f"column {column!r} is missing (null)")
        return value

    def _label(self, batch: dict[str, list], i: int, row: int):
        if self.label is None:
            return schema.NO_SCORE if self.kind == "regression" else schema.NO_LABEL
        value = self._value(batch, self.label, i, row)
        if self.kind == "regression":
            score = float(value)
            if score == -1 and self.unlabelled_ok:
                return schema.NO_SCORE
            low, high = schema.STSB_SCORE_RANGE
            if not (math.isfinite(score) and low <= score <= high):
                self._fail(batch, i, row, f"score {value!r} is not in [{low:g}, {high:g}]")
            return score
        label = int(value)
        if label == schema.NO_LABEL and self.unlabelled_ok:
            return label
        if not 0 <= label < self.num_labels:
            self._fail(batch, i, row, f"label {value!r} is not a {self.task_name} label id "
                                      f"(0..{self.num_labels - 1})")
        return label

    def _fail(self, batch: dict[str, list], i: int, row: int, problem: str):
        shown = {column: values[i] for column, values in batch.items()}
        raise ValueError(f"{self.where}, row {row + 1}: {problem}: {shown!r}. Fix or remove that row.")
