"""The SQuAD v1.1 task as the fine-tuning stage drives it: read a split, featurize it, evaluate the model's
per-token start/end logits. Not a pipeline.finetuning.tasks.base.Task (that describes GLUE-style sequence tasks), but
with the same descriptive attributes."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from pipeline.finetuning.tasks.squad.evaluate import squad_v1_metrics
from pipeline.finetuning.tasks.squad.features import squad_features
from pipeline.finetuning.tasks.squad.postprocess import postprocess
from pipeline.finetuning.tasks.squad.reader import read_squad

if TYPE_CHECKING:
    from pipeline.finetuning.tokenizer import LoadedTokenizer

# The paper's settings (run_squad.py's defaults); the lead's conf/training/task/ may override any of them.
DEFAULT_SETTINGS = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64, "n_best": 20,
                    "max_answer_length": 30}


@dataclasses.dataclass(frozen=True, eq=False)
class SquadTask:
    name: str = "squad_v1"
    kind: str = "span"
    label_names: tuple[str, ...] | None = None
    main_metric: str = "f1"
    splits: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"train": "train-v1.1.json", "dev": "dev-v1.1.json"})
    eval_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ()

    @property
    def num_labels(self) -> int:
        """Outputs per token of the span head: start and end."""
        return 2

    @property
    def id2label(self) -> None:
        return None

    # -- files ----------------------------------------------------------------------------------------------------

    def split_file(self, split: str, directory: Path) -> Path | None:
        path = Path(directory) / self.splits[split]
        return path.resolve() if path.is_file() else None

    def expected_files(self) -> str:
        files = "; ".join(f"{split}: {name}" for split, name in self.splits.items())
        return f"Pass the split's JSON file, or a directory with SQuAD v1.1's files ({files})."

    def read(self, split: str, path: str | Path, cache_dir: str | Path | None = None) -> datasets.Dataset:
        """The questions of a split: id, title, context, question, answers {text, answer_start}. `path`: the
        split's JSON file, or a directory holding it under its usual name."""
        if split not in self.splits:
            raise ValueError(f"task {self.name} has no split {split!r}; its splits: {', '.join(self.splits)}")
        location = Path(path).expanduser()
        if location.is_dir():
            found = self.split_file(split, location)
            if found is None:
                raise FileNotFoundError(f"{self.name} {split}: no {self.splits[split]} in {location}. "
                                        f"{self.expected_files()}")
            location = found
        return read_squad(location, cache_dir)

    # -- features and evaluation ----------------------------------------------------------------------------------

    def featurize(self, examples: datasets.Dataset, tokenizer: LoadedTokenizer, settings: dict[str, Any],
                  training: bool) -> tuple[datasets.Dataset, dict[str, Any]]:
        """squad_features with settings max_seq_length, doc_stride, max_query_length (defaults: the paper's)."""
        s = {**DEFAULT_SETTINGS, **{k: v for k, v in settings.items() if v is not None}}
        return squad_features(examples, tokenizer, max_seq_length=int(s["max_seq_length"]),
                              doc_stride=int(s["doc_stride"]), max_query_length=int(s["max_query_length"]),
                              training=training)

    def evaluate(self, examples: datasets.Dataset, features: datasets.Dataset, outputs: list[np.ndarray],
                 settings: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
        """(metrics {"exact_match", "f1"} in percent, artefacts {"predictions.json", "nbest_predictions.json"})
        from per-feature outputs (T_i, 2): [:, 0] start logits, [:, 1] end logits, in feature order."""
        s = {**DEFAULT_SETTINGS, **{k: v for k, v in settings.items() if v is not None}}
        arrays = [np.asarray(output) for output in outputs]
        for i, array in enumerate(arrays):
            if array.ndim != 2 or array.shape[1] != 2:
                raise ValueError(f"output {i} has shape {array.shape}; expected (tokens, 2) start/end logits")
        predictions, nbest = postprocess(examples, features, [a[:, 0] for a in arrays], [a[:, 1] for a in arrays],
                                         n_best=int(s["n_best"]), max_answer_length=int(s["max_answer_length"]))
        metrics = squad_v1_metrics(examples, predictions)
        return metrics, {"predictions.json": predictions, "nbest_predictions.json": nbest}


SQUAD_V1 = SquadTask()
