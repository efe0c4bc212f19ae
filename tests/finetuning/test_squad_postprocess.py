"""SQuAD post-processing (pipeline.finetuning.tasks.squad.postprocess) and the task object: hand-written logits for each
rule (context tokens only, end >= start, at most max_answer_length tokens, starts only where the window has max context,
distinct texts, softmax over the n-best), the vectorised code against a plain loop written from the reference's
write_predictions on random logits over many windows, and SQUAD_V1 in the registry, evaluating end to end."""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks import TASKS, get_task  # noqa: E402
from pipeline.finetuning.tasks.squad import SQUAD_V1, SquadTask, postprocess, read_squad, squad_features  # noqa: E402
from pipeline.finetuning.tasks.squad.reader import SQUAD_FEATURES  # noqa: E402
from pipeline.finetuning.tokenizer import load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HANDWRITTEN = Path(__file__).parent / "fixtures" / "squad" / "handwritten-v1.1.json"
TEN = "one two three four five six seven eight nine ten"
SHIFT = 5   # [CLS] what number ? [SEP]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_datasets_cache")


@pytest.fixture(scope="module")
def uncased():
    return load_tokenizer(REPO / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt", 30522)


def examples(*rows: tuple[str, str, str]) -> datasets.Dataset:
    records = [{"id": f"q{i}", "title": "t", "context": context, "question": question,
                "answers": {"text": [text], "answer_start": [context.index(text)]}}
               for i, (context, question, text) in enumerate(rows)]
    return datasets.Dataset.from_list(records, features=SQUAD_FEATURES)


def logits(length: int, values: dict[int, float]) -> np.ndarray:
    out = np.zeros(length, dtype=np.float32)
    for position, value in values.items():
        out[position] = value
    return out


def one_hot_outputs(features: datasets.Dataset) -> list[np.ndarray]:
    """(T, 2) per feature: 1 at the labelled start and end ([CLS] where the answer is not in the window)."""
    outputs = []
    for length, (start, end) in zip(features["length"], features["label"]):
        out = np.zeros((length, 2), dtype=np.float32)
        out[start, 0] = out[end, 1] = 1.0
        outputs.append(out)
    return outputs


# -- the rules, on one window ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_window(uncased):
    rows = examples((TEN, "what number ?", "six"))
    features, _ = squad_features(rows, uncased, max_query_length=8)
    assert len(features) == 1 and features["length"][0] == SHIFT + 10 + 1
    return rows, features


def word(i: int) -> int:
    """The position of the i-th word of TEN (0-based) in the feature."""
    return SHIFT + i


def test_best_span_and_nbest_format(one_window):
    rows, features = one_window
    n = features["length"][0]
    start = logits(n, {word(5): 5.0, word(2): 3.0})
    end = logits(n, {word(5): 4.0, word(6): 3.5})
    predictions, nbest = postprocess(rows, features, [start], [end], n_best=3)
    assert predictions == {"q0": "six"}
    entries = nbest["q0"]
    # candidates: six (5+4=9), six seven (5+3.5=8.5), three..six (3+4=7); all other pairs score less
    assert [e["text"] for e in entries] == ["six", "six seven", "three four five six"]
    assert all(list(e) == ["text", "probability", "start_logit", "end_logit"] for e in entries)
    assert [(e["start_logit"], e["end_logit"]) for e in entries] == [(5.0, 4.0), (5.0, 3.5), (3.0, 4.0)]
    z = [math.exp(s - 9.0) for s in (9.0, 8.5, 7.0)]
    assert [e["probability"] for e in entries] == pytest.approx([v / sum(z) for v in z])
    json.dumps(nbest)    # JSON-able as it is


def test_question_and_special_tokens_are_never_answers(one_window):
    rows, features = one_window
    n = features["length"][0]
    # the highest logits on [CLS], the question and the last [SEP]; among the context, "eight" wins
    start = logits(n, {0: 50.0, 1: 40.0, 2: 40.0, n - 1: 40.0, word(7): 1.0})
    end = logits(n, {0: 50.0, 3: 40.0, 4: 40.0, n - 1: 40.0, word(7): 1.0})
    predictions, _ = postprocess(rows, features, [start], [end])
    assert predictions == {"q0": "eight"}


def test_end_before_start_and_length_limit(one_window):
    rows, features = one_window
    n = features["length"][0]
    # best start "nine", best end "two": end before start is no candidate
    start = logits(n, {word(8): 9.0, word(0): 1.0})
    end = logits(n, {word(1): 9.0, word(9): 1.0})
    predictions, nbest = postprocess(rows, features, [start], [end], n_best=20)
    assert predictions["q0"] == "nine ten"                        # 9 + 1 beats one..two (1 + 9) by order: a tie
    scores = [e["start_logit"] + e["end_logit"] for e in nbest["q0"]]
    assert scores == sorted(scores, reverse=True)
    # "one".."two" has the same score 10 as "nine ten"; the reference's stable sort keeps the start rank order
    assert [e["text"] for e in nbest["q0"][:2]] == ["nine ten", "one two"]
    # with at most 1 token, only single words remain: "nine" (9+0) and "two" (0+9) tie; start rank decides
    predictions, nbest = postprocess(rows, features, [start], [end], max_answer_length=1)
    assert predictions["q0"] == "nine" and all(len(e["text"].split()) == 1 for e in nbest["q0"])


def test_distinct_texts_only(uncased):
    context = "red and red and blue"
    rows = examples((context, "what number ?", "blue"))
    features, _ = squad_features(rows, uncased, max_query_length=8)
    n = features["length"][0]
    start = logits(n, {SHIFT + 0: 3.0, SHIFT + 2: 2.9})    # the two "red"s
    end = logits(n, {SHIFT + 0: 3.0, SHIFT + 2: 2.9})
    _, nbest = postprocess(rows, features, [start], [end], n_best=4)
    texts = [e["text"] for e in nbest["q0"]]
    assert texts[0] == "red" and texts.count("red") == 1 and len(set(texts)) == len(texts) == 4
    assert texts[1] == "red and red"   # 3.0 + 2.9; the second "red" alone (2.9 + 2.9) is a repeat of "red"


def test_padded_logits_are_cut_and_lengths_checked(one_window):
    rows, features = one_window
    n = features["length"][0]
    start = np.concatenate([logits(n, {word(3): 2.0}), np.full(20, 99.0, dtype=np.float32)])   # padding ignored
    end = np.concatenate([logits(n, {word(3): 2.0}), np.full(20, 99.0, dtype=np.float32)])
    assert postprocess(rows, features, [start], [end])[0] == {"q0": "four"}
    with pytest.raises(ValueError, match="feature 0 has 16 tokens but 15 start"):
        postprocess(rows, features, [start[:15]], [end])
    with pytest.raises(ValueError, match="1 start and 2 end logit arrays for 1 features"):
        postprocess(rows, features, [start], [end, end])


def test_only_max_context_starts(uncased):
    # windows [0,4) [3,7) [6,10) (see test_squad_features): "four" (token 3) starts answers in window 0 only
    rows = examples((TEN, "what number ?", "four"))
    features, _ = squad_features(rows, uncased, max_seq_length=10, doc_stride=3, max_query_length=4)
    assert len(features) == 3
    starts = [logits(10, {}), logits(10, {SHIFT + 0: 8.0}), logits(10, {})]       # window 1: token 3 first
    ends = [logits(10, {}), logits(10, {SHIFT + 1: 8.0}), logits(10, {})]         # window 1: token 4
    predictions, nbest = postprocess(rows, features, starts, ends)
    # "four five" would score 16 in window 1, but "four" has more context in window 0: it does not start there
    assert "four five" not in [e["text"] for e in nbest["q0"]]
    assert predictions["q0"] == "five"          # window 1 token 4 (max context there) + its end: 0 + 8


def test_no_candidate_gives_an_empty_answer(uncased):
    rows = datasets.Dataset.from_list([{"id": "e", "title": "t", "context": "", "question": "what?",
                                        "answers": {"text": ["x"], "answer_start": [0]}}], features=SQUAD_FEATURES)
    features, report = squad_features(rows, uncased)
    assert len(features) == 0 and report["examples_without_features"] == 1
    predictions, nbest = postprocess(rows, features, [], [])
    assert predictions == {"e": ""}
    assert nbest == {"e": [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]}


# -- the vectorised code against a plain loop -----------------------------------------------------------------------

def plain_postprocess(examples, features, start_logits, end_logits, n_best, max_answer_length):
    """write_predictions of the reference as loops (positions that cannot hold an answer masked before the top
    n_best, as ours does)."""
    by_example = defaultdict(list)
    for f, index in enumerate(features["example_index"]):
        by_example[index].append(f)
    offsets, max_context = features["offsets"], features["max_context"]
    predictions, nbest = {}, {}
    for row, (qid, context) in enumerate(zip(examples["id"], examples["context"])):
        prelim = []
        for f in by_example[row]:
            context_tokens = [p for p, (s, _) in enumerate(offsets[f]) if s >= 0]
            starts = sorted([p for p in context_tokens if max_context[f][p]], key=lambda p: -start_logits[f][p])
            ends = sorted(context_tokens, key=lambda p: -end_logits[f][p])
            for s in starts[:n_best]:
                for e in ends[:n_best]:
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append((float(start_logits[f][s]) + float(end_logits[f][e]), f, s, e))
        prelim.sort(key=lambda c: -c[0])
        entries, seen = [], set()
        for _score, f, s, e in prelim:
            text = context[offsets[f][s][0]:offsets[f][e][1]]
            if text in seen:
                continue
            seen.add(text)
            entries.append((text, float(start_logits[f][s]), float(end_logits[f][e])))
            if len(entries) == n_best:
                break
        if not entries:
            entries = [("", 0.0, 0.0)]
        top = max(s + e for _, s, e in entries)
        exps = [math.exp(s + e - top) for _, s, e in entries]
        nbest[qid] = [{"text": t, "probability": x / sum(exps), "start_logit": s, "end_logit": e}
                      for (t, s, e), x in zip(entries, exps)]
        predictions[qid] = entries[0][0]
    return predictions, nbest


@pytest.mark.parametrize("n_best, max_answer_length, rounding", [(20, 30, None), (5, 8, None), (3, 30, 0)])
def test_vectorised_equals_the_plain_loop(uncased, cache, shared_data, n_best, max_answer_length, rounding):
    """Real dev questions in short windows (many per question, overlapping); random logits, or logits rounded to
    integers (rounding=0: many ties, where the stable order of the reference matters)."""
    dev = shared_data / "downstream" / "squad" / "dev-v1.1.json"
    if not dev.is_file():
        pytest.skip(f"{dev} not found")
    rows = read_squad(dev, cache).select(range(150))
    features, _ = squad_features(rows, uncased, max_seq_length=64, doc_stride=24, max_query_length=24)
    assert len(features) > 3 * len(rows)
    rng = np.random.default_rng(n_best)
    starts, ends = [], []
    for n in features["length"]:
        s, e = rng.normal(scale=3.0, size=(2, n)).astype(np.float32)
        if rounding is not None:
            s, e = np.round(s, rounding), np.round(e, rounding)
        starts.append(s)
        ends.append(e)
    got = postprocess(rows, features, starts, ends, n_best=n_best, max_answer_length=max_answer_length)
    want = plain_postprocess(rows, features, starts, ends, n_best, max_answer_length)
    assert got[0] == want[0]
    assert got[1] == want[1]


# -- the task -------------------------------------------------------------------------------------------------------

def test_registered_beside_the_ten_tasks():
    assert get_task("squad_v1") is SQUAD_V1 and get_task("SQuAD-v1") is SQUAD_V1
    assert isinstance(SQUAD_V1, SquadTask) and "squad_v1" not in TASKS and len(TASKS) == 10
    assert SQUAD_V1.kind == "span" and SQUAD_V1.label_names is None and SQUAD_V1.main_metric == "f1"
    assert SQUAD_V1.splits == {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}
    assert SQUAD_V1.eval_splits == ("dev",) and SQUAD_V1.test_splits == ()
    with pytest.raises(ValueError, match="unknown task 'squad'; known tasks: .*swag, squad_v1"):
        get_task("squad")


def test_evaluate_end_to_end(uncased, cache):
    rows = read_squad(HANDWRITTEN, cache)
    settings = {"max_seq_length": 48, "doc_stride": 16, "max_query_length": 16}
    features, report = SQUAD_V1.featurize(rows, uncased, settings, training=False)
    assert report["questions_truncated"] == 1 and len(features) > len(rows)
    metrics, artefacts = SQUAD_V1.evaluate(rows, features, one_hot_outputs(features), {"n_best": 20})
    predictions = artefacts["predictions.json"]
    # every labelled answer comes back; pe-who's answer_start is wrong (labelled [CLS]), so its prediction is
    # whatever scores best without a label: not a gold answer
    assert predictions["pe-when"] == "1794" and predictions["zu-dessert"] == "crème brûlée"
    assert predictions["pe-what"] == "Its lighthouse" and predictions["pe-long"] == "red and white"
    assert predictions["zu-where"] == "Zürich"
    assert metrics == {"exact_match": pytest.approx(100 * 5 / 6), "f1": pytest.approx(metrics["f1"])}
    assert set(artefacts) == {"predictions.json", "nbest_predictions.json"}
    assert set(artefacts["nbest_predictions.json"]) == set(rows["id"][:])
    json.loads(json.dumps(artefacts))
    with pytest.raises(ValueError, match=r"output 0 has shape \(\d+,\); expected \(tokens, 2\)"):
        SQUAD_V1.evaluate(rows, features, [np.zeros(5)] * len(features), {})
