"""Per-token logits -> one tag per word (the argmax at the word's first piece) -> entity scores and a prediction
file that conlleval.pl reads.

The file: one word per line, ``word gold predicted`` separated by single spaces (conlleval's default delimiter; the
last two fields are the gold and the guessed tag, as it expects); a blank line after each sentence; each document
begins with a ``-DOCSTART- O O`` line and a blank line, the way the CoNLL-2003 files begin theirs (conlleval has no
rule for ``-DOCSTART-``: it reads that line as one token tagged O by both, which adds one to its token count and
nothing to its chunk counts, as in the shared task's own output files). Gold tags are the IOB2 labels as read;
predicted tags are written as the model gave them (conlleval and seqeval read an ``I-X`` that starts a chunk alike).
"""
from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np

from pipeline.finetuning.tasks.conll.features import CUT, column
from pipeline.finetuning.tasks.conll.metrics import entity_metrics
from pipeline.finetuning.tasks.conll.reader import DOCSTART

PREDICTIONS_FILE = "predictions.conll"


def predict_tags(sentences: datasets.Dataset, features: datasets.Dataset, outputs: Sequence[np.ndarray],
                 label_list: Sequence[str]) -> tuple[list[list[str]], int]:
    """(per sentence, per word, the predicted tag; words cut by max_seq_length, predicted "O").

    ``outputs``: one (T_i, L) array of logits per feature row, in the features' order (T_i at least the feature's
    tokens; padding beyond is ignored). Sentences and features are matched by ``idx``."""
    if len(outputs) != len(features):
        raise ValueError(f"{len(outputs)} outputs for {len(features)} feature rows")
    row_of = {int(idx): row for row, idx in enumerate(column(features, "idx"))}
    word_starts = column(features, "word_starts")
    names = np.asarray(list(label_list), dtype=object)
    predictions, cut = [], 0
    for idx, words in zip(column(sentences, "idx"), column(sentences, "words")):
        row = row_of.get(int(idx))
        if row is None:
            raise ValueError(f"sentence {idx} has no feature row")
        starts = np.asarray(word_starts[row], dtype=np.int64)
        if len(starts) != len(words):
            raise ValueError(f"sentence {idx}: {len(words)} words but {len(starts)} word starts in its features")
        logits = np.asarray(outputs[row])
        if logits.ndim != 2 or logits.shape[1] != len(names):
            raise ValueError(f"sentence {idx}: logits of shape {logits.shape}, expected (tokens, {len(names)})")
        kept = starts != CUT
        if kept.any() and starts[kept].max() >= len(logits):
            raise ValueError(f"sentence {idx}: {len(logits)} logits but a word starts at token {starts[kept].max()}")
        tags = np.full(len(starts), "O", dtype=object)
        tags[kept] = names[logits[starts[kept]].argmax(axis=-1)]
        cut += int((~kept).sum())
        predictions.append(tags.tolist())
    return predictions, cut


def conll_text(words: Sequence[Sequence[str]], gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
               doc_index: Sequence[int] | None = None) -> str:
    """The conlleval input: ``word gold predicted`` lines, a blank line after each sentence, a ``-DOCSTART- O O``
    line (and a blank one) where a document begins (none when ``doc_index`` is None)."""
    lines: list[str] = []
    previous = None
    for s, (sentence, g, p) in enumerate(zip(words, gold, pred)):
        if doc_index is not None and (s == 0 or doc_index[s] != previous):
            lines += [f"{DOCSTART} O O", ""]
            previous = doc_index[s]
        for word, gold_tag, pred_tag in zip(sentence, g, p):
            if not word or any(c in word for c in " \t\r\n"):
                raise ValueError(f"sentence {s}: word {word!r} cannot be written as one CoNLL field")
            lines.append(f"{word} {gold_tag} {pred_tag}")
        lines.append("")
    return "\n".join(lines) + ("\n" if lines else "")


def evaluate(sentences: datasets.Dataset, features: datasets.Dataset, outputs: Sequence[np.ndarray],
             label_list: Sequence[str], entity_types: tuple[str, ...] | None = None
             ) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, {"predictions.conll": text}): :func:`entity_metrics` of the predicted against the gold tags, plus
    ``words_cut`` (words predicted O because max_seq_length cut them, as a float like every logged metric)."""
    pred, cut = predict_tags(sentences, features, outputs, label_list)
    gold = column(sentences, "labels")
    metrics = entity_metrics(gold, pred, entity_types)
    metrics["words_cut"] = float(cut)
    text = conll_text(column(sentences, "words"), gold, pred, column(sentences, "doc_index"))
    return metrics, {PREDICTIONS_FILE: text}
