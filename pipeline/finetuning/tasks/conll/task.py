"""The CoNLL-2003 named-entity task as the fine-tuning stage uses it (``get_task("conll2003")``).

Its own small class rather than :class:`pipeline.finetuning.tasks.base.Task` (whose reading and scoring are GLUE's),
with the same descriptive attributes and the methods the fine-tuning code calls for per-token tasks: ``read``,
``featurize``, ``evaluate``.

Splits: train (eng.train), dev (eng.testa), test (eng.testb), or train.txt / valid.txt / test.txt in the IOB2
layout. The test set is labelled, so it is an *evaluation* split: ``eval_splits = ("dev", "test")`` - scored after
every epoch like dev, with its own predictions.conll - and ``test_splits = ()`` (those are the unlabelled,
predict-only splits of GLUE). Model selection uses the first evaluation split, dev.

Settings (``conf/training/task/conll2003.yaml`` plus ``max_seq_length``): ``document_context`` (bool, default False);
``scheme`` (auto | iob1 | iob2) is an argument of ``read``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from pipeline.finetuning.tasks.conll.reader import ENTITY_TYPES, LABELS, read_conll

_SPLITS = {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}
_IOB2_NAMES = {"train": ("train.txt",), "dev": ("valid.txt",), "test": ("test.txt",)}


@dataclasses.dataclass(frozen=True, eq=False)
class ConllTask:
    name: str = "conll2003"
    kind: str = "token"
    label_names: tuple[str, ...] = LABELS
    main_metric: str = "f1"
    splits: dict[str, str] = dataclasses.field(default_factory=lambda: dict(_SPLITS))
    eval_splits: tuple[str, ...] = ("dev", "test")
    test_splits: tuple[str, ...] = ()
    other_file_names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: dict(_IOB2_NAMES))
    entity_types: tuple[str, ...] = ENTITY_TYPES

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    # -- files ----------------------------------------------------------------------------------------------------

    def split_file(self, split: str, directory: Path) -> Path | None:
        """The split's file in a directory of CoNLL-2003 files (original or IOB2 names)."""
        self._check_split(split)
        for name in (self.splits[split], *self.other_file_names.get(split, ())):
            if (Path(directory) / name).is_file():
                return (Path(directory) / name).resolve()
        return None

    def expected_files(self) -> str:
        files = "; ".join(f"{split}: {' or '.join((name, *self.other_file_names.get(split, ())))}"
                          for split, name in self.splits.items())
        return f"Pass the split's file, or a directory with {self.name}'s files ({files})."

    def read(self, split: str, path: str | Path, cache_dir: str | Path | None = None,
             scheme: str = "auto") -> datasets.Dataset:
        """The split's sentences: ``idx``, ``doc_index``, ``words``, ``labels`` (IOB2). ``path``: the file, or a
        directory holding it under one of the split's names."""
        self._check_split(split)
        location = Path(path).expanduser()
        if location.is_dir():
            found = self.split_file(split, location)
            if found is None:
                raise FileNotFoundError(f"{self.name} {split}: no {' or '.join(self._names(split))} in {location}. "
                                        f"{self.expected_files()}")
            location = found
        elif not location.is_file():
            raise FileNotFoundError(f"{self.name} {split}: {path} does not exist. {self.expected_files()}")
        return read_conll(location, scheme=scheme, cache_dir=cache_dir, entity_types=self.entity_types)

    # -- features and evaluation ----------------------------------------------------------------------------------

    def featurize(self, rows: datasets.Dataset, tokenizer, settings: dict[str, Any],
                  training: bool = False) -> tuple[datasets.Dataset, dict[str, Any]]:
        """Features as :func:`pipeline.finetuning.tasks.conll.features.ner_features` (the same for training and
        evaluation); settings: ``max_seq_length`` (default 128), ``document_context`` (default False)."""
        from pipeline.finetuning.tasks.conll.features import ner_features

        return ner_features(rows, tokenizer, self.label_names, max_seq_length=int(settings.get("max_seq_length", 128)),
                            document_context=bool(settings.get("document_context", False)))

    def evaluate(self, rows: datasets.Dataset, features: datasets.Dataset, outputs: Sequence[np.ndarray],
                 settings: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, {"predictions.conll": text}) from one (T_i, 9) logits array per feature row; see
        :func:`pipeline.finetuning.tasks.conll.evaluate.evaluate`. Metrics: precision, recall, f1 overall and per type
        (``PER/f1`` ...; every type present, 0.0 where it has no gold or predicted entity), ``words_cut``."""
        from pipeline.finetuning.tasks.conll.evaluate import evaluate

        return evaluate(rows, features, outputs, self.label_names, self.entity_types)

    # -- helpers --------------------------------------------------------------------------------------------------

    def _names(self, split: str) -> tuple[str, ...]:
        return (self.splits[split], *self.other_file_names.get(split, ()))

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"task {self.name} has no split {split!r}; its splits: {', '.join(self.splits)}")


CONLL2003 = ConllTask()
