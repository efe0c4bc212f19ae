"""SQuAD reading (pipeline.finetuning.tasks.squad.reader) and features (pipeline.finetuning.tasks.squad.features): the
real AllenNLP sample, a hand-written file (tests/finetuning/fixtures/squad/), doc-stride windows and max-context marks
computed by hand, label positions, character offsets (accents, cased and uncased vocabularies), the report's counts,
caching and bad input."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks.squad import SQUAD_V1, read_squad, squad_features  # noqa: E402
from pipeline.finetuning.tasks.squad.features import answer_token_span, max_context_windows, window_starts  # noqa: E402
from pipeline.finetuning.tasks.squad.reader import SQUAD_FEATURES  # noqa: E402
from pipeline.finetuning.tokenizer import load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCAB = REPO / "data_prep" / "vocab"
FIXTURES = Path(__file__).parent / "fixtures" / "squad"
HANDWRITTEN = FIXTURES / "handwritten-v1.1.json"
FEATURE_COLUMNS = ["input_ids", "token_type_ids", "length", "label", "example_index", "offsets", "max_context"]

# ten single-token words: token i is the (i+1)-th word
TEN = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_datasets_cache")


@pytest.fixture(scope="module")
def uncased():
    return load_tokenizer(VOCAB / "bert-base-uncased-vocab.txt", 30522)


@pytest.fixture(scope="module")
def cased(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cased")
    shutil.copy(VOCAB / "bert-base-cased-vocab.txt", directory / "vocab.txt")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    return load_tokenizer(directory / "vocab.txt", 28996)


@pytest.fixture(scope="module")
def sample(shared_data) -> Path:
    path = shared_data / "downstream" / "squad" / "allennlp_fixture_squad_v1.1_sample.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


def examples(*rows: tuple[str, str, str | None, int | None]) -> datasets.Dataset:
    """(context, question, answer text, answer_start or None for context.index(text)) -> an examples dataset."""
    records = []
    for i, (context, question, text, start) in enumerate(rows):
        answers = {"text": [], "answer_start": []}
        if text is not None:
            answers = {"text": [text], "answer_start": [context.index(text) if start is None else start]}
        records.append({"id": f"q{i}", "title": "t", "context": context, "question": question, "answers": answers})
    return datasets.Dataset.from_list(records, features=SQUAD_FEATURES)


def tokens_of(tokenizer, ids) -> list[str]:
    return [tokenizer.tokenizer.id_to_token(i) for i in ids]


# -- reading -------------------------------------------------------------------------------------------------------

def test_read_the_real_sample(sample, cache):
    rows = read_squad(sample, cache)
    assert rows.column_names == ["id", "title", "context", "question", "answers"]
    assert len(rows) == 5 and rows["id"][0] == "5733be284776f41900661182"
    first = rows[0]
    assert first["title"] == "University_of_Notre_Dame"
    assert first["question"] == "To whom did the Virgin Mary allegedly appear in 1858 in Lourdes France?"
    assert first["answers"] == {"text": ["Saint Bernadette Soubirous"], "answer_start": [515]}
    assert first["context"][515:515 + len("Saint Bernadette Soubirous")] == "Saint Bernadette Soubirous"
    assert len(rows[1]["answers"]["text"]) == 3 and rows[1]["answers"]["answer_start"] == [92, 92, 0]
    assert rows[2]["context"].startswith("In 1882, Albert Zahm")


def test_read_the_handwritten_file(cache):
    rows = read_squad(HANDWRITTEN, cache)
    assert rows["id"][:] == ["pe-when", "pe-who", "pe-long", "pe-what", "zu-dessert", "zu-where"]
    assert rows["title"][:] == ["Port_Ellery"] * 4 + ["Zurich"] * 2
    assert rows[3]["answers"]["text"] == ["Its lighthouse", "lighthouse", "Its lighthouse, painted red and white"]


def test_read_through_the_task(tmp_path, cache):
    shutil.copy(HANDWRITTEN, tmp_path / "dev-v1.1.json")
    assert len(SQUAD_V1.read("dev", tmp_path, cache_dir=cache)) == 6                  # a directory: its usual name
    assert len(SQUAD_V1.read("train", tmp_path / "dev-v1.1.json", cache_dir=cache)) == 6   # a file: any name
    with pytest.raises(FileNotFoundError, match=r"squad_v1 train: no train-v1\.1\.json in .*dev-v1\.1\.json"):
        SQUAD_V1.read("train", tmp_path, cache_dir=cache)
    with pytest.raises(ValueError, match="no split 'test'; its splits: train, dev"):
        SQUAD_V1.read("test", tmp_path, cache_dir=cache)


def test_read_questions_without_answers(tmp_path, cache):
    path = tmp_path / "test-v1.1.json"
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [
        {"context": "Some text.", "qas": [{"id": "x", "question": "What?"}]}]}]}))
    rows = read_squad(path, cache)
    assert rows[0]["answers"] == {"text": [], "answer_start": []}


def test_read_bad_files(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="SQuAD file not found: .*nowhere.json"):
        read_squad(tmp_path / "nowhere.json", cache)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [{"title": "x", "paragraphs": [')
    with pytest.raises(ValueError, match=r"broken\.json is not a SQuAD JSON file"):
        read_squad(broken, cache)
    no_data = tmp_path / "no_data.json"
    no_data.write_text('{"version": "1.1"}')
    with pytest.raises(ValueError, match=r"no_data\.json is not a SQuAD JSON file"):
        read_squad(no_data, cache)
    no_paragraphs = tmp_path / "no_paragraphs.json"
    no_paragraphs.write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(ValueError, match=r"no_paragraphs\.json is not a SQuAD JSON file: .*no 'paragraphs'"):
        read_squad(no_paragraphs, cache)
    duplicates = tmp_path / "duplicates.json"
    qa = {"id": "same", "question": "?", "answers": [{"text": "a", "answer_start": 0}]}
    duplicates.write_text(json.dumps({"data": [{"title": "x", "paragraphs": [{"context": "a b", "qas": [qa, qa]}]}]}))
    with pytest.raises(ValueError, match=r"duplicates\.json: question ids must be unique; repeated: \['same'\]"):
        read_squad(duplicates, cache)


# -- windows and max context, by hand ---------------------------------------------------------------------------

def test_window_starts():
    # 10 tokens, windows of 4, stride 3: [0,4) [3,7) [6,10), the last one ending at the context's end
    assert window_starts(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    # a stride longer than the window moves by the window (no token skipped): [0,4) [4,8) [8,10)
    assert window_starts(10, 4, 8) == [(0, 4), (4, 4), (8, 2)]
    assert window_starts(3, 4, 3) == [(0, 3)]
    assert window_starts(0, 4, 3) == []


def test_max_context_by_hand():
    # score = min(left, right) + 0.01 * length; windows [0,4) [3,7) [6,10)
    # token 3: window 0 min(3, 0) + .04 = .04, window 1 min(0, 3) + .04 = .04: a tie, the first window wins
    # token 4: only window 1 (1.04); token 5: window 1 min(2, 1) + .04 = 1.04; token 6: windows 1 and 2 tie at .04
    assert max_context_windows([(0, 4), (3, 4), (6, 4)], 10).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    # windows [0,6) [2,8): token 2: w0 min(2,3)+.06 = 2.06, w1 min(0,5)+.06 = .06 -> w0; token 4: w0 min(4,1) = 1.06,
    # w1 min(2,3) = 2.06 -> w1; token 3: w0 min(3,2) = 2.06, w1 min(1,4) = 1.06 -> w0
    assert max_context_windows([(0, 6), (2, 6)], 8).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # a longer window wins a tie in context by its 0.01 * length: [0,5) and [1,4) at token 2: 2.05 vs 1.03
    assert max_context_windows([(0, 5), (1, 3)], 5).tolist() == [0, 0, 0, 0, 0]


def test_answer_token_span():
    offsets = np.array([[0, 3], [4, 7], [8, 13], [13, 15]])     # "one two three" + "##xx" glued to three
    assert answer_token_span(offsets, 4, 7) == (1, 1)
    assert answer_token_span(offsets, 5, 7) == (1, 1)            # starts inside a token: that token
    assert answer_token_span(offsets, 4, 9) == (1, 2)            # ends inside a token: that token
    assert answer_token_span(offsets, 3, 4) is None              # only the space between tokens
    assert answer_token_span(offsets, 0, 15) == (0, 3)
    assert answer_token_span(offsets, 14, 20) == (3, 3)
    assert answer_token_span(offsets, 16, 20) is None            # past the last token


# -- features ------------------------------------------------------------------------------------------------------

def test_stride_windows_labels_and_offsets(uncased):
    # question "what number ?" = 3 tokens; max_seq_length 10 leaves 10 - 3 - 3 = 4 context tokens per window
    rows = examples((TEN, "what number ?", "six", None), (TEN, "what number ?", "four five", None))
    features, report = squad_features(rows, uncased, max_seq_length=10, doc_stride=3, max_query_length=4)
    assert features.column_names == FEATURE_COLUMNS
    assert report["examples"] == 2 and report["features"] == 6 == len(features)
    assert features["example_index"][:] == [0, 0, 0, 1, 1, 1]
    words = TEN.split()
    for f, (start, end) in enumerate([(0, 4), (3, 7), (6, 10)] * 2):
        feature = features[f]
        assert tokens_of(uncased, feature["input_ids"]) == ["[CLS]", "what", "number", "?", "[SEP]",
                                                             *words[start:end], "[SEP]"]
        assert feature["token_type_ids"] == [0] * 5 + [1] * 5 and feature["length"] == 10
        assert feature["offsets"][:5] == [[-1, -1]] * 5 and feature["offsets"][-1] == [-1, -1]
        assert [TEN[s:e] for s, e in feature["offsets"][5:9]] == words[start:end]
    # max context (see test_max_context_by_hand): window 0 tokens 0-3, window 1 tokens 4-6, window 2 tokens 7-9
    assert features["max_context"][0] == [False] * 5 + [True, True, True, True] + [False]
    assert features["max_context"][1] == [False] * 5 + [False, True, True, True] + [False]
    assert features["max_context"][2] == [False] * 5 + [False, True, True, True] + [False]
    # "six" is token 5: only window 1 ([3, 7)) holds it, at 5 - 3 + 5 = 7; the others point at [CLS]
    assert features["label"][:3] == [[0, 0], [7, 7], [0, 0]]
    # "four five" = tokens 3-4: window 0 holds 3 but not 4, so only window 1 is labelled: [5, 6]
    assert features["label"][3:] == [[0, 0], [5, 6], [0, 0]]


def test_a_context_that_fits_is_one_feature(uncased):
    rows = examples((TEN, "what number ?", "seven eight", None))
    features, report = squad_features(rows, uncased)                      # 384 / 128 / 64
    assert len(features) == 1 and report["features"] == 1
    feature = features[0]
    assert feature["label"] == [5 + 6, 5 + 7] and feature["length"] == 5 + 10 + 1
    assert all(feature["max_context"][5:15]) and not any(feature["max_context"][:5] + feature["max_context"][15:])
    s, e = feature["offsets"][feature["label"][0]][0], feature["offsets"][feature["label"][1]][1]
    assert TEN[s:e] == "seven eight"


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_offsets_point_into_the_original_text(which, request):
    tokenizer = request.getfixturevalue(which)
    context = "Café Müller in Zürich served crème brûlée to the crew of the Sea Wren every Friday."
    rows = examples((context, "What did the café serve?", "crème brûlée", None),
                    (context, "Where is Café Müller?", "Zürich", None))
    features, _ = squad_features(rows, tokenizer)
    for feature, gold in zip(features, ["crème brûlée", "Zürich"]):
        start, end = feature["label"]
        assert start > 0 and feature["max_context"][start]
        assert context[feature["offsets"][start][0]:feature["offsets"][end][1]] == gold
        pieces = [context[s:e] for s, e in feature["offsets"] if s >= 0]
        assert "".join(pieces) == context.replace(" ", "")          # every character of the context, once
    first = tokens_of(tokenizer, features[0]["input_ids"])
    assert ("cafe" in first) == (which == "uncased") and ("Café" in first or "Caf" in first) == (which == "cased")


def test_report_counts_and_training_skips_misaligned(uncased, cache):
    rows = read_squad(HANDWRITTEN, cache)
    evaluation, report = squad_features(rows, uncased, training=False)
    assert report == {"examples": 6, "features": 6, "questions_truncated": 1, "answers_misaligned": 1,
                      "answers_without_tokens": 0, "examples_without_answer": 0, "examples_without_features": 0,
                      "examples_skipped": 0}
    # pe-who (row 1): answer_start 3 characters off: kept for evaluation, labelled [CLS]
    assert evaluation["example_index"][:] == [0, 1, 2, 3, 4, 5] and evaluation["label"][1] == [0, 0]
    # pe-long (row 2): 74 question tokens cut to 64: [CLS] + 64 + [SEP] before the context
    long = evaluation[2]
    assert long["token_type_ids"].index(1) == 66 and long["input_ids"][65] == uncased.sep_id
    start, end = long["label"]
    assert rows[2]["context"][long["offsets"][start][0]:long["offsets"][end][1]] == "red and white"

    training, report = squad_features(rows, uncased, training=True)
    assert report["answers_misaligned"] == 1 and report["examples_skipped"] == 1 and report["features"] == 5
    assert training["example_index"][:] == [0, 2, 3, 4, 5]
    assert all(label != [0, 0] for label in training["label"])
    assert training.column_names == FEATURE_COLUMNS


def test_answers_without_tokens_and_questions_without_answers(uncased):
    context = "Zero one two."
    rows = examples((context, "What?", " ", 4),          # only a space: no token to point at
                    (context, "What?", None, None),      # no answer
                    ("", "What?", None, None),           # an empty context: no feature at all
                    (context, "What?", "one", None))
    features, report = squad_features(rows, uncased, training=False)
    # the answer counts are over the questions that have features; the empty context is counted on its own
    assert report["answers_without_tokens"] == 1 and report["examples_without_answer"] == 1
    assert report["examples_without_features"] == 1 and report["features"] == 3
    # row 3: [CLS] what ? [SEP] zero one: "one" at 5
    assert features["example_index"][:] == [0, 1, 3] and features["label"][:] == [[0, 0], [0, 0], [5, 5]]
    training, report = squad_features(rows, uncased, training=True)
    assert training["example_index"][:] == [3] and report["examples_skipped"] == 3


def test_the_real_sample_features(sample, uncased, cache):
    rows = read_squad(sample, cache)
    features, report = squad_features(rows, uncased, training=True)
    assert report["answers_misaligned"] == 0 and report["features"] == len(features) == 5
    for feature in features:
        row = rows[feature["example_index"]]
        gold = row["answers"]["text"][0]
        start, end = feature["label"]
        text = row["context"][feature["offsets"][start][0]:feature["offsets"][end][1]]
        # "Father Julius Nieuwl" ends inside "Nieuwland": the answer's tokens cover the whole word piece
        assert text == gold or (gold == "Father Julius Nieuwl" and text.startswith(gold))


def test_features_are_cached(uncased, cache, tmp_path):
    shutil.copy(HANDWRITTEN, tmp_path / "dev.json")
    rows = read_squad(tmp_path / "dev.json", cache)
    first, _ = squad_features(rows, uncased, max_seq_length=32, doc_stride=8, max_query_length=16)
    began = time.perf_counter()
    again, report = squad_features(rows, uncased, max_seq_length=32, doc_stride=8, max_query_length=16)
    assert time.perf_counter() - began < 5
    assert [f["filename"] for f in again.cache_files] == [f["filename"] for f in first.cache_files]
    assert again["input_ids"][:] == first["input_ids"][:] and report["features"] == len(first)
    other, _ = squad_features(rows, uncased, max_seq_length=32, doc_stride=4, max_query_length=16)
    assert other.cache_files[0]["filename"] != first.cache_files[0]["filename"]
    assert len(other) > len(first)


def test_settings_are_checked(uncased):
    rows = examples((TEN, "what number ?", "six", None))
    with pytest.raises(ValueError, match="max_seq_length=60 leaves no room"):
        squad_features(rows, uncased, max_seq_length=60, max_query_length=64)
    with pytest.raises(ValueError, match="doc_stride"):
        squad_features(rows, uncased, doc_stride=0)


def test_task_featurize_takes_settings(uncased):
    rows = examples((TEN, "what number ?", "six", None))
    settings = {"max_seq_length": 10, "doc_stride": 3, "max_query_length": 4, "lr": 1e-3}   # others: ignored
    features, report = SQUAD_V1.featurize(rows, uncased, settings, training=False)
    assert len(features) == 3 and report["features"] == 3
    features, _ = SQUAD_V1.featurize(rows, uncased, {}, training=True)     # the paper's defaults
    assert len(features) == 1 and features["label"][0] == [10, 10]
