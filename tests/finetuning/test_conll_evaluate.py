"""CoNLL evaluation from per-token logits: the tag of each word from its first piece, entity scores, words cut by the
sequence length predicted O, and the conlleval-readable prediction file read back."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks import get_task  # noqa: E402
from pipeline.finetuning.tasks.conll import LABELS, conll_text, entity_metrics, evaluate, ner_features, read_conll  # noqa: E402
from pipeline.finetuning.tokenizer import load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "conll2003"
LABEL_ID = {label: i for i, label in enumerate(LABELS)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_datasets_cache")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(REPO / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt", 30522)


@pytest.fixture(scope="module")
def sentences(cache):
    return read_conll(FIXTURES / "eng.train", cache_dir=cache)   # the IOB1 file: labels come back in IOB2


def logits_for(features, tags_per_sentence, pad: int = 0, seed: int = 0) -> list[np.ndarray]:
    """(T_i + pad, 9) logits per feature row whose argmax at each word's first piece is the given tag; noise
    (smaller than the one-hot) everywhere else, so nothing but the first pieces can decide."""
    rng = np.random.default_rng(seed)
    outputs = []
    for row, tags in zip(features, tags_per_sentence):
        logits = rng.uniform(-0.5, 0.5, size=(row["length"] + pad, len(LABELS)))
        for start, tag in zip(row["word_starts"], tags):
            if start >= 0:
                logits[start, LABEL_ID[tag]] = 5.0
        outputs.append(logits)
    return outputs


def read_back(text: str) -> tuple[list[list[str]], list[list[str]], list[list[str]], int]:
    """The conlleval input parsed as conlleval reads it: space-separated fields, blank lines between sentences;
    returns words, gold, predicted per sentence (-DOCSTART- lines counted, not kept)."""
    assert text.endswith("\n")
    words, gold, pred, docstarts, current = [], [], [], 0, None
    for line in text.split("\n")[:-1]:
        if not line:
            if current:
                for column, values in zip((words, gold, pred), current):
                    column.append(values)
            current = None
            continue
        fields = line.split(" ")
        assert len(fields) == 3, line          # conlleval wants the same number of fields on every line
        if fields[0] == "-DOCSTART-":
            assert fields[1:] == ["O", "O"] and current is None
            docstarts += 1
            continue
        current = current or ([], [], [])
        for column, value in zip(current, fields):
            column.append(value)
    assert current is None                     # the last sentence is closed by a blank line too
    return words, gold, pred, docstarts


def test_perfect_predictions_round_trip(tokenizer, sentences):
    features, _ = ner_features(sentences, tokenizer, LABELS)
    metrics, artefacts = evaluate(sentences, features, logits_for(features, sentences["labels"]), LABELS)
    assert metrics["precision"] == metrics["recall"] == metrics["f1"] == 1.0
    assert all(metrics[f"{t}/f1"] == 1.0 for t in ("PER", "ORG", "LOC", "MISC")) and metrics["words_cut"] == 0.0
    assert set(artefacts) == {"predictions.conll"}
    text = artefacts["predictions.conll"]
    words, gold, pred, docstarts = read_back(text)
    assert words == sentences["words"] and gold == sentences["labels"] and pred == gold and docstarts == 2
    assert text.startswith("-DOCSTART- O O\n\nKowalczyk B-PER B-PER\nwins O O\n")
    assert "\n. O O\n\n-DOCSTART- O O\n\nSOCCER O O\n- O O\nAJAX B-ORG B-ORG\nPSV B-ORG B-ORG\n" in text


def test_mistakes_and_cut_words(tokenizer, sentences):
    pred = [list(tags) for tags in sentences["labels"]]
    pred[4][3] = "I-ORG"          # "AJAX PSV" read as one organisation
    pred[7][0] = "B-LOC"          # "Belgian" a place
    features, report = ner_features(sentences, tokenizer, LABELS)
    metrics, artefacts = evaluate(sentences, features, logits_for(features, pred), LABELS)
    # 24 gold entities: PER 6, LOC 7, ORG 6, MISC 5. Predicted: one ORG "AJAX PSV" (wrong) instead of two, and LOC
    # "Belgian" (wrong) instead of MISC: 24 - 2 + 1 = 23 predicted, 24 - 3 = 21 correct -> P = 21/23, R = 21/24
    # ORG: 6 gold, 5 predicted, 4 correct -> P 4/5, R 4/6; MISC: 5 gold, 4 predicted, all correct -> P 1, R 4/5
    # LOC: 7 gold, 8 predicted, 7 correct -> P 7/8, R 1
    assert metrics["precision"] == pytest.approx(21 / 23) and metrics["recall"] == pytest.approx(21 / 24)
    assert (metrics["ORG/precision"], metrics["ORG/recall"]) == pytest.approx((4 / 5, 4 / 6))
    assert (metrics["MISC/precision"], metrics["MISC/recall"]) == pytest.approx((1.0, 4 / 5))
    assert (metrics["LOC/precision"], metrics["LOC/recall"]) == pytest.approx((7 / 8, 1.0))
    words, gold, written, _ = read_back(artefacts["predictions.conll"])
    assert written == pred and gold == sentences["labels"]
    assert entity_metrics(gold, written, ("PER", "ORG", "LOC", "MISC")) == \
        {k: v for k, v in metrics.items() if k != "words_cut"}

    # max_seq_length 8: the cut words are predicted O whatever the logits say, and counted
    short, short_report = ner_features(sentences, tokenizer, LABELS, max_seq_length=8)
    metrics, artefacts = evaluate(sentences, short, logits_for(short, sentences["labels"]), LABELS)
    assert metrics["words_cut"] == short_report["words_cut"] > 0
    _, gold, written, _ = read_back(artefacts["predictions.conll"])
    expected = [[tag if start >= 0 else "O" for tag, start in zip(tags, starts)]
                for tags, starts in zip(sentences["labels"], short["word_starts"])]
    # (precision suffers too: an entity cut in its middle, as "Marek | Kowalczyk", is predicted shorter)
    assert written == expected and metrics["recall"] < metrics["precision"] < 1.0
    assert metrics["f1"] == pytest.approx(entity_metrics(gold, expected)["f1"])


def test_outputs_matched_by_idx_and_padding_ignored(tokenizer, sentences):
    features, _ = ner_features(sentences, tokenizer, LABELS)
    reordered = features.select(list(reversed(range(len(features)))))
    outputs = logits_for(reordered, list(reversed(sentences["labels"])), pad=7)
    metrics, artefacts = evaluate(sentences, reordered, outputs, LABELS)
    assert metrics["f1"] == 1.0
    assert read_back(artefacts["predictions.conll"])[1] == sentences["labels"]   # written in the sentences' order


def test_document_context_features_evaluate_the_same(tokenizer, sentences):
    features, _ = ner_features(sentences, tokenizer, LABELS, max_seq_length=48, document_context=True)
    metrics, _ = evaluate(sentences, features, logits_for(features, sentences["labels"]), LABELS)
    assert metrics["f1"] == 1.0 and metrics["words_cut"] == 0.0


def test_bad_outputs(tokenizer, sentences):
    features, _ = ner_features(sentences, tokenizer, LABELS)
    outputs = logits_for(features, sentences["labels"])
    with pytest.raises(ValueError, match="7 outputs for 8 feature rows"):
        evaluate(sentences, features, outputs[:7], LABELS)
    with pytest.raises(ValueError, match=r"sentence 0: logits of shape \(10, 3\), expected \(tokens, 9\)"):
        evaluate(sentences, features, [outputs[0][:, :3], *outputs[1:]], LABELS)
    with pytest.raises(ValueError, match="sentence 0: 4 logits but a word starts at token 8"):
        evaluate(sentences, features, [outputs[0][:4], *outputs[1:]], LABELS)
    with pytest.raises(ValueError, match="sentence 7 has no feature row"):
        evaluate(sentences, features.select(range(7)), outputs[:7], LABELS)


def test_conll_text_layout():
    text = conll_text([["Bonn", "says"], ["Yes"]], [["B-LOC", "O"], ["O"]], [["I-LOC", "O"], ["B-PER"]], [3, 3])
    assert text == "-DOCSTART- O O\n\nBonn B-LOC I-LOC\nsays O O\n\nYes O B-PER\n\n"
    assert conll_text([["a"]], [["O"]], [["O"]]) == "a O O\n\n"       # no documents given: no -DOCSTART- line
    assert conll_text([], [], []) == ""
    with pytest.raises(ValueError, match="cannot be written as one CoNLL field"):
        conll_text([["a b"]], [["O"]], [["O"]])


def test_task_evaluate(tokenizer, sentences):
    task = get_task("conll2003")
    features, _ = task.featurize(sentences, tokenizer, {"max_seq_length": 128}, training=False)
    only_o = [["O"] * len(tags) for tags in sentences["labels"]]
    metrics, artefacts = task.evaluate(sentences, features, logits_for(features, only_o), {"max_seq_length": 128})
    # nothing predicted: every score 0, and every type's keys present all the same
    assert metrics["f1"] == 0.0 and metrics["recall"] == 0.0
    assert {k for k in metrics if "/" in k} == {f"{t}/{s}" for t in ("PER", "ORG", "LOC", "MISC")
                                                for s in ("precision", "recall", "f1")}
    assert task.main_metric in metrics and all(isinstance(v, float) for v in metrics.values())
    assert read_back(artefacts["predictions.conll"])[2] == only_o
