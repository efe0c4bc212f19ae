"""Where a task's data keeps its fields: the columns of its delimited files, and of its Hugging Face hub layout.

These are plain descriptions; :mod:`pipeline.finetuning.tasks.delimited` and :mod:`pipeline.finetuning.tasks.hub` do the
reading, of a task as the readers see it (:class:`TaskFormat`: :class:`pipeline.finetuning.tasks.base.Task` is one).
"""
from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class FileLayout:
    """One way a task's file can look.

    ``names is None``: the first line is a header and columns are found by name; a header without the ``label``
    column is an unlabelled (test) file, one without the ``index`` column numbers its rows.  ``names`` given: a
    headerless file whose columns are named here by position; a row needs the first ``required`` of them (STS-B's
    original csv has 7 fields, a few rows 9).
    """

    text_a: str                     # first text; SWAG: the context (sent1)
    text_b: str | None = None       # second text; SWAG: the start of the ending (sent2)
    label: str | None = None
    index: str | None = None        # the example id; absent: the 0-based row number
    endings: tuple[str, ...] = ()   # SWAG: the candidate endings
    names: tuple[str, ...] | None = None
    required: int | None = None     # headerless: fields every row must have (default: all of ``names``)
    delimiter: str = "\t"
    quoted: bool = False            # GLUE's TSVs must be read with quoting off: their text has unbalanced quotes

    @property
    def has_header(self) -> bool:
        return self.names is None

    def text_columns(self) -> tuple[str, ...]:
        """Columns that must be there for this layout to apply (and in every row)."""
        return tuple(c for c in (self.text_a, self.text_b, *self.endings) if c is not None)


@dataclasses.dataclass(frozen=True)
class HubLayout:
    """A task in Hugging Face hub layout (``load_dataset("nyu-mll/glue", "sst2")``): parquet files per config
    and split.  ``splits`` maps our split names to (config, hub split): MNLI's diagnostic set is config ``ax``."""

    dataset: str                             # the public hub dataset, for messages
    splits: dict[str, tuple[str, str]]
    text_a: str
    text_b: str | None = None
    label: str = "label"
    index: str | None = "idx"
    endings: tuple[str, ...] = ()


class TaskFormat(Protocol):
    """What the readers need to know of a task: its name, kind, labels, test splits and layouts."""

    name: str
    kind: str                               # classification | regression | multiple_choice
    label_names: tuple[str, ...] | None
    file_labels: tuple[str, ...] | None
    test_splits: tuple[str, ...]
    layouts: tuple[FileLayout, ...]
    hub: HubLayout | None
