"""study_data.py on the real task files: a seed's subsets are nested, never touch the rows the recipe search
and the rate selection use, are the same whichever arm asks, and come back whole through the fine-tuning readers."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def study_data(study_importable):
    import study_data
    return study_data


@pytest.fixture(scope="module")
def data(study_data, shared_data, tmp_path_factory):
    return study_data.StudyData(shared_data, tmp_path_factory.mktemp("study_data"))


def test_sst2_subsets_are_nested_and_leave_out_the_reserved_rows(data):
    drawn = {}
    for seed in (1, 2, 3, 4, 5):
        rows = {budget: data.training_rows("sst2", budget, seed) for budget in (500, 1000, 5000)}
        assert [len(r) for r in rows.values()] == [500, 1000, 5000]
        assert len(set(rows[5000].tolist())) == 5000
        assert np.array_equal(rows[5000][:1000], rows[1000]) and np.array_equal(rows[1000][:500], rows[500])
        assert rows[5000].min() >= 2000        # rows 1-2,000: the selection probe's and the rate selection's
        drawn[seed] = rows[1000]
    assert set(data.selection_rows("sst2").tolist()) == set(range(1000, 2000))
    assert not np.array_equal(drawn[1], drawn[2])                        # each seed draws its own
    assert len(set(drawn[1].tolist()) & set(drawn[2].tolist())) < 100    # ~15 of 1,000 expected by chance


@pytest.mark.parametrize("task, slice_size", [("imdb", 1000), ("stsb", 500), ("cola", 500)])
def test_the_rate_selection_slice_is_never_trained_on(data, task, slice_size):
    selection = set(data.selection_rows(task).tolist())
    assert len(selection) == slice_size
    budgets = {"imdb": 1000, "stsb": "full", "cola": "full"}
    for seed in (0, 1, 5):
        rows = data.training_rows(task, budgets[task], seed)
        assert not selection & set(rows.tolist())
    if task != "imdb":   # the full sets: every other row, the same for every seed
        assert len(data.training_rows(task, "full", 1)) == data.count(task, "train") - slice_size
        assert np.array_equal(data.training_rows(task, "full", 1), data.training_rows(task, "full", 3))


def test_imdb_scores_a_fixed_5000_of_the_test_reviews(data, study_data):
    rows = data.eval_rows("imdb")
    assert len(rows) == 5000 == len(set(rows.tolist()))
    assert np.array_equal(rows, study_data.permutation(0, 25000)[:5000])
    labels = [data.lines("imdb", "eval")[i].rsplit("\t", 1)[1] for i in rows]
    assert 2200 < labels.count("1") < 2800     # the test file is sorted by label: a permutation mixes them


def test_the_files_are_the_same_for_every_arm_and_read_back_whole(study_data, shared_data, tmp_path, data):
    # two arms' runs, each with its own StudyData (and here even its own directory), write the same files
    other = study_data.StudyData(shared_data, tmp_path / "other")
    for task, budget in (("sst2", 1000), ("imdb", 1000), ("stsb", "full"), ("cola", "full")):
        mine, theirs = data.split(task, budget, 2), other.split(task, budget, 2)
        assert mine.train.read_bytes() == theirs.train.read_bytes()
        assert mine.eval.read_bytes() == theirs.eval.read_bytes()
    sst2 = data.split("sst2", 500, 2)
    texts, labels = data.texts(sst2.train, "sst2", tmp_path / "cache")
    original = data.lines("sst2", "train")
    assert [f"{t}\t{label}" for t, label in zip(texts, labels)] == [
        original[i] for i in data.training_rows("sst2", 500, 2)]
    imdb = data.split("imdb", 1000, 2)
    texts, labels = data.texts(imdb.train, "imdb", tmp_path / "cache")
    assert len(texts) == imdb.train_rows == 1000 and set(labels) == {0, 1}
    assert not any("\t" in t or "<br" in t.lower() or "\n" in t for t in texts)
    scored = data.texts(imdb.eval, "imdb", tmp_path / "cache")[0]
    assert len(scored) == imdb.eval_rows == 5000


def test_the_task_readers_take_the_original_formats(data, tmp_path):
    from pipeline.finetuning.tasks import get_task

    for task, budget, name in (("stsb", "full", "stsb"), ("cola", "full", "cola")):
        files = data.split(task, budget, 1)
        rows = get_task(name).read("train", str(files.train), cache_dir=str(tmp_path / "cache"))
        assert len(rows) == files.train_rows
        scored = get_task(name).read("dev", str(files.eval), cache_dir=str(tmp_path / "cache"))
        assert len(scored) == files.eval_rows == {"stsb": 1500, "cola": 527}[task]


def test_quick_cuts_the_scored_and_full_sets_but_keeps_the_label_budgets(study_data, shared_data, tmp_path):
    quick = study_data.StudyData(shared_data, tmp_path, quick=True)
    assert len(quick.eval_rows("sst2")) == study_data.QUICK_EVAL_ROWS
    assert len(quick.training_rows("cola", "full", 1)) == study_data.QUICK_FULL_ROWS
    assert len(quick.training_rows("sst2", 5000, 1)) == 5000
    assert quick.split("sst2", 500, 1).train.parent != study_data.StudyData(shared_data, tmp_path).split(
        "sst2", 500, 1).train.parent


def test_reviews_become_one_sst2_field():
    from study_data import clean_review

    assert clean_review("Great.<br /><br />Really\tgreat<BR/>film\n") == "Great. Really great film"


def test_an_unknown_budget_is_refused(data):
    with pytest.raises(ValueError, match="no label budget"):
        data.training_rows("sst2", 2000, 1)
