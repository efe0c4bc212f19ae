"""Entity scores (seqeval 1.2.2, default mode) against numbers worked out by hand (the arithmetic is in the comments),
and against conlleval.pl's chunk counting (ported below) on random tag sequences."""
from __future__ import annotations

import random

import pytest

from pipeline.finetuning.tasks.conll import ENTITY_TYPES, entity_metrics


def test_hand_computed_scores():
    gold = [["B-PER", "I-PER", "O", "B-LOC"],
            ["B-ORG", "O", "B-MISC", "I-MISC"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"],
            ["B-ORG", "O", "B-MISC", "O"]]
    # gold chunks: PER[0:2], LOC[3] | ORG[0], MISC[2:4]              -> 4
    # predicted:   PER[0:2], ORG[3] | ORG[0], MISC[2:3]              -> 4
    # correct (same type, start and end): PER[0:2], ORG[0] of the second sentence -> 2
    # overall: P = 2/4, R = 2/4, F1 = 1/2
    # PER:  P 1/1, R 1/1, F1 1
    # LOC:  nothing predicted -> P 0 (conlleval prints 0), R 0/1, F1 0
    # ORG:  P 1/2, R 1/1, F1 = 2 * 1/2 * 1 / (1/2 + 1) = 2/3
    # MISC: P 0/1 (MISC[2:3] is not MISC[2:4]), R 0/1, F1 0
    m = entity_metrics(gold, pred)
    assert m["precision"] == pytest.approx(0.5) and m["recall"] == pytest.approx(0.5) and m["f1"] == pytest.approx(0.5)
    assert (m["PER/precision"], m["PER/recall"], m["PER/f1"]) == (1.0, 1.0, 1.0)
    assert (m["LOC/precision"], m["LOC/recall"], m["LOC/f1"]) == (0.0, 0.0, 0.0)
    assert m["ORG/precision"] == pytest.approx(0.5) and m["ORG/recall"] == 1.0
    assert m["ORG/f1"] == pytest.approx(2 / 3)
    assert (m["MISC/precision"], m["MISC/recall"], m["MISC/f1"]) == (0.0, 0.0, 0.0)
    assert set(m) == {"precision", "recall", "f1"} | {f"{t}/{s}" for t in ("PER", "LOC", "ORG", "MISC")
                                                     for s in ("precision", "recall", "f1")}
    assert all(isinstance(v, float) for v in m.values())


def test_unequal_precision_and_recall():
    gold = [["B-PER", "O", "B-PER", "O", "B-LOC", "I-LOC"]]
    pred = [["B-PER", "O", "O", "O", "B-LOC", "I-LOC"]]
    # gold 3 chunks, predicted 2, both correct: P = 2/2 = 1, R = 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 4/5
    # PER: P 1/1, R 1/2, F1 = 2 * 1/2 / (3/2) = 2/3
    m = entity_metrics(gold, pred)
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(0.8)
    assert m["PER/recall"] == pytest.approx(0.5) and m["PER/f1"] == pytest.approx(2 / 3) and m["LOC/f1"] == 1.0


def test_chunks_read_as_conlleval_reads_them():
    # an I- after O starts a chunk: I-PER I-PER is the chunk PER[0:2], correct against B-PER I-PER
    assert entity_metrics([["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]])["f1"] == 1.0
    # B- after B- of the same type: two chunks, neither is PER[0:2] -> P 0/2, R 0/1
    m = entity_metrics([["B-PER", "I-PER"]], [["B-PER", "B-PER"]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)
    # a type change inside a chunk ends it: LOC[0], ORG[1] -> P 0/2, R 0/1
    m = entity_metrics([["B-LOC", "I-LOC"]], [["B-LOC", "I-ORG"]])
    assert (m["precision"], m["recall"]) == (0.0, 0.0) and "ORG/precision" in m
    # IOB1 gold against the same entities in IOB2
    assert entity_metrics([["I-ORG", "B-ORG", "O", "I-PER", "I-PER"]],
                          [["B-ORG", "B-ORG", "O", "B-PER", "I-PER"]])["f1"] == 1.0
    # chunks end at a sentence's end: PER[1] then PER[0] of the next sentence are two chunks, not one
    m = entity_metrics([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["B-PER", "O"]])
    assert m["f1"] == 1.0   # 2 gold chunks (I-PER starts one after the boundary), both predicted


def test_no_entities_and_fixed_types():
    m = entity_metrics([["O", "O"]], [["O", "O"]], types=ENTITY_TYPES)
    assert m["f1"] == 0.0 and m["precision"] == 0.0 and m["PER/f1"] == 0.0 and len(m) == 3 + 3 * 4
    # types fixes the keys: MISC appears though neither side has one
    m = entity_metrics([["B-PER"]], [["B-PER"]], types=ENTITY_TYPES)
    assert m["PER/f1"] == 1.0 and m["MISC/f1"] == 0.0 and len(m) == 15
    assert len(entity_metrics([["B-PER"]], [["B-PER"]])) == 6


def test_shape_mismatches():
    with pytest.raises(ValueError, match="2 gold sentences but 1 predicted"):
        entity_metrics([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        entity_metrics([["O", "O"]], [["O"]])


# -- against conlleval.pl ------------------------------------------------------------------------------------------


def _split(tag: str) -> tuple[str, str]:
    return (tag.split("-", 1)[0], tag.split("-", 1)[1]) if "-" in tag else (tag, "")


def _start_of_chunk(prev_tag, tag, prev_type, type_):
    return ((prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I")}
            or (tag != "O" and prev_type != type_))


def _end_of_chunk(prev_tag, tag, prev_type, type_):
    return ((prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O")}
            or (prev_tag != "O" and prev_type != type_))


def conlleval_counts(gold: list[list[str]], pred: list[list[str]]):
    """conlleval.pl's main loop (B/I/O tags): (correct, found gold, found guessed) overall and per type. A blank line
    between sentences is read as a boundary token tagged O by both."""
    lines = []
    for g, p in zip(gold, pred):
        lines += list(zip(g, p)) + [("O", "O")]
    correct = found_correct = found_guessed = 0
    per_type: dict[str, list[int]] = {}
    in_correct = False
    last_c, last_ct, last_g, last_gt = "O", "", "O", ""
    for c_tag, g_tag in lines:
        c, ct = _split(c_tag)
        g, gt = _split(g_tag)
        if in_correct:
            end_c, end_g = _end_of_chunk(last_c, c, last_ct, ct), _end_of_chunk(last_g, g, last_gt, gt)
            if end_c and end_g and last_gt == last_ct:
                in_correct = False
                correct += 1
                per_type.setdefault(last_ct, [0, 0, 0])[0] += 1
            elif end_c != end_g or gt != ct:
                in_correct = False
        start_c, start_g = _start_of_chunk(last_c, c, last_ct, ct), _start_of_chunk(last_g, g, last_gt, gt)
        if start_c and start_g and gt == ct:
            in_correct = True
        if start_c:
            found_correct += 1
            per_type.setdefault(ct, [0, 0, 0])[1] += 1
        if start_g:
            found_guessed += 1
            per_type.setdefault(gt, [0, 0, 0])[2] += 1
        last_c, last_ct, last_g, last_gt = c, ct, g, gt
    if in_correct:
        correct += 1
        per_type.setdefault(last_ct, [0, 0, 0])[0] += 1
    return (correct, found_correct, found_guessed), per_type


def _prf(correct: int, gold: int, guessed: int) -> tuple[float, float, float]:
    p = correct / guessed if guessed else 0.0
    r = correct / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def test_matches_conlleval_on_random_tags():
    rng = random.Random(7)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "I-MISC"]
    for trial in range(300):
        lengths = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
        gold = [[rng.choice(tags) for _ in range(n)] for n in lengths]
        pred = [[t if rng.random() < 0.6 else rng.choice(tags) for t in g] for g in gold]
        (correct, n_gold, n_guessed), per_type = conlleval_counts(gold, pred)
        m = entity_metrics(gold, pred)
        assert (m["precision"], m["recall"], m["f1"]) == pytest.approx(_prf(correct, n_gold, n_guessed)), \
            (trial, gold, pred)
        for type_, (c, g, p) in per_type.items():
            assert (m[f"{type_}/precision"], m[f"{type_}/recall"], m[f"{type_}/f1"]) == pytest.approx(
                _prf(c, g, p)), (trial, type_, gold, pred)
