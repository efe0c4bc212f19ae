"""Zero-shot SST-2 by the MLM head (study_protocol.md, section 4): no labels used to decide.

    zero_shot_sst2(init, texts, labels) -> {"accuracy", "median", "words": {word: {"pieces", "split"}}, ...}

Each sentence becomes `[CLS] <sentence> it was [MASK] . [SEP]`; its score is the mean log-probability (softmax over
the whole vocabulary) at [MASK] of "great", "good", "excellent" minus that of "terrible", "bad", "awful", a word the
vocabulary splits being scored by its first piece. A sentence is called positive when its score is above the median
of all the scores; the labels only grade those calls. The model is the export's pre-training model (its MLM head,
pipeline/core/checkpoints/weights.py load_pretraining_model; an MLM-only export has no next-sentence head), its
tokenizer the one beside it.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

POSITIVE = ("great", "good", "excellent")
NEGATIVE = ("terrible", "bad", "awful")
PROMPT_BEFORE_MASK = "it was"
PROMPT_AFTER_MASK = "."
MAX_SEQ_LENGTH = 128
BATCH_SIZE = 64


def word_pieces(tokenizer, words: Sequence[str]) -> dict[str, dict]:
    """How the vocabulary writes each scored word: its pieces, its first piece's id, whether it is split."""
    found = {}
    for word, ids in zip(words, tokenizer.encode(list(words))):
        if not ids:
            raise ValueError(f"the tokenizer gives no token for {word!r}")
        pieces = [tokenizer.tokenizer.id_to_token(i) for i in ids]
        found[word] = {"pieces": pieces, "split": len(ids) > 1, "first_id": int(ids[0]),
                       "unknown": pieces[0] == "[UNK]"}
    return found


def prompt_ids(tokenizer, texts: Sequence[str], mask_id: int) -> list[list[int]]:
    """[CLS] sentence it was [MASK] . [SEP]; a sentence too long for MAX_SEQ_LENGTH loses its end."""
    sentences = tokenizer.encode(list(texts))
    before, after = tokenizer.encode([PROMPT_BEFORE_MASK, PROMPT_AFTER_MASK])
    room = MAX_SEQ_LENGTH - len(before) - len(after) - 3
    return [[tokenizer.cls_id, *ids[:room], *before, mask_id, *after, tokenizer.sep_id] for ids in sentences]


@torch.inference_mode()
def mask_log_probs(model, sequences: list[list[int]], pad_id: int, mask_id: int) -> torch.Tensor:
    """(N, V) log-probabilities at each sequence's [MASK]."""
    out = []
    for start in range(0, len(sequences), BATCH_SIZE):
        batch = sequences[start:start + BATCH_SIZE]
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(ids)
        attention_mask = (torch.arange(width)[None, :] < torch.tensor([len(ids) for ids in batch])[:, None]).long()
        positions = torch.tensor([[ids.index(mask_id)] for ids in batch])        # (B, 1)
        logits = model(input_ids, torch.zeros_like(input_ids), attention_mask, masked_positions=positions).mlm_logits
        out.append(torch.log_softmax(logits[:, 0].float(), dim=-1))            # (B, V)
    return torch.cat(out)


def scores(log_probs: torch.Tensor, positive_ids: Sequence[int], negative_ids: Sequence[int]) -> np.ndarray:
    """Mean log-probability of the positive words minus that of the negative words, per sentence."""
    return (log_probs[:, list(positive_ids)].mean(dim=1) - log_probs[:, list(negative_ids)].mean(dim=1)).numpy()


def median_calls(values: np.ndarray) -> np.ndarray:
    """1 (positive) where the score is above the median of all scores, else 0."""
    return (values > np.median(values)).astype(np.int64)


def zero_shot_sst2(init: Path, texts: Sequence[str], labels: Sequence[int]) -> dict:
    from pipeline.core.checkpoints.weights import load_pretrained, load_pretraining_model
    from pipeline.finetuning.tokenizer import load_tokenizer

    pretrained = load_pretrained(init)
    tokenizer = load_tokenizer(pretrained.tokenizer_source, pretrained.config.vocab_size)
    mask_id = tokenizer.tokenizer.token_to_id("[MASK]")
    if mask_id is None:
        raise ValueError(f"the tokenizer of {init} has no [MASK] token: no MLM prompt can be written")
    model = load_pretraining_model(init).eval()
    words = word_pieces(tokenizer, [*POSITIVE, *NEGATIVE])
    log_probs = mask_log_probs(model, prompt_ids(tokenizer, texts, mask_id), tokenizer.pad_id, mask_id)
    values = scores(log_probs, [words[w]["first_id"] for w in POSITIVE], [words[w]["first_id"] for w in NEGATIVE])
    calls = median_calls(values)
    return {"accuracy": float(np.mean(calls == np.asarray(labels))), "median": float(np.median(values)),
            "sentences": len(texts), "called_positive": int(calls.sum()), "words": words,
            "split_words": [w for w, found in words.items() if found["split"]],
            "objective": "mlm_nsp" if model.next_sentence_prediction else "mlm"}
