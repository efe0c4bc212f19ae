"""study_tasks.py: the protocol's fine-tuning settings reach finetune(), random arms are BERT's
initialisation drawn with the fine-tuning seed, results are written once and skipped after; a quick arm runs end to
end (slow)."""
from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# one thread: two on a 2-core machine shared with other work oversubscribe it (measured: 2x the CPU time per run)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tasks(study_importable):
    import study_tasks
    return study_tasks


def _tiny_export(path, next_sentence_prediction=False):
    """A very small BERT with the bundled uncased vocabulary, exported as the study's arms are."""
    from model import BertConfig, BertForPreTraining
    from model.bert.hf_files import export_hf
    from tests.conftest import BUNDLED_VOCAB

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    return export_hf(BertForPreTraining(config, next_sentence_prediction=next_sentence_prediction), path,
                     BUNDLED_VOCAB)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return _tiny_export(tmp_path_factory.mktemp("arm") / "mlm")


def test_every_protocol_setting_reaches_the_finetune_config(tasks, tmp_path):
    from study_data import SplitFiles

    from pipeline.core.app import compose

    files = SplitFiles("imdb", tmp_path / "train.tsv", tmp_path / "eval.tsv", 1000, 5000, "IMDB test")
    cfg = compose("finetune", tasks.finetune_overrides(files, tmp_path / "init", 3e-4, 10, 4, tmp_path / "run",
                                                       tmp_path / "cache"))
    assert cfg.task.name == "sst2"     # IMDB's reviews in SST-2's format
    assert (cfg.data.dir, cfg.data.train, cfg.data.dev, cfg.data.test) == (None, str(files.train), str(files.eval),
                                                                           None)
    assert (cfg.data.batch_size, cfg.data.max_seq_length, cfg.data.group_by_length) == (32, 128, True)
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("adamw", 3e-4, 0.01)
    assert (cfg.scheduler.name, cfg.scheduler.warmup_fraction, cfg.scheduler.warmup_steps, cfg.scheduler.power) == (
        "linear_warmup", 0.1, None, 1.0)
    assert (cfg.model.hidden_dropout, cfg.model.attention_dropout) == (0.1, 0.1)
    assert (cfg.trainer.gradient_clip_val, cfg.trainer.max_epochs, cfg.trainer.check_val_every_n_epoch) == (1.0, 10, 10)
    assert (cfg.seed, cfg.data.limit_train_examples) == (4, None)


def test_epochs_by_set_size(tasks):
    assert [tasks.epochs_for("sst2", b, False) for b in (500, 1000, 5000)] == [10, 10, 3]
    others = (("imdb", 1000), ("stsb", "full"), ("cola", "full"))
    assert [tasks.epochs_for(t, b, False) for t, b in others] == [10, 3, 3]
    assert tasks.epochs_for("sst2", 5000, True) == 1


def test_an_arm_names_one_source_of_weights(tasks, export):
    assert tasks.Arm.of({"name": "domain_60", "init": str(export)}).init == export
    for bad in ({"name": "x"}, {"name": "x", "init": str(export), "random_like": str(export)},
                {"name": "x", "init": str(export), "seed": 1}):
        with pytest.raises(ValueError, match="one of 'init' or 'random_like'"):
            tasks.Arm.of(bad)
    with pytest.raises(FileNotFoundError, match="not a Hugging Face export"):
        tasks.Arm.of({"name": "x", "init": str(export.parent)})


@pytest.mark.parametrize("nsp", [False, True])
def test_a_random_arm_is_berts_initialisation_drawn_with_the_seed(tasks, tmp_path, nsp):
    from model import BertForPreTraining
    from pipeline.core.checkpoints.weights import load_pretrained, load_pretraining_model

    like = _tiny_export(tmp_path / "like", next_sentence_prediction=nsp)
    arm = tasks.Arm.of({"name": "random_domain", "random_like": str(like)})
    first, again, other = arm.weights(2, tmp_path), arm.weights(2, tmp_path), arm.weights(3, tmp_path)
    assert first == again == tmp_path / "finetune" / "random_domain" / "init" / "seed2"
    assert (first / "vocab.txt").read_bytes() == (like / "vocab.txt").read_bytes()
    model = load_pretraining_model(first)
    assert model.next_sentence_prediction == nsp
    torch.manual_seed(2)
    fresh = BertForPreTraining(load_pretrained(like).config, next_sentence_prediction=nsp)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    seeded_3 = load_pretraining_model(other).bert.embeddings.word_embeddings.weight
    assert not torch.equal(seeded_3, model.bert.embeddings.word_embeddings.weight)
    assert not torch.equal(load_pretraining_model(like).bert.embeddings.word_embeddings.weight,
                           model.bert.embeddings.word_embeddings.weight)


def test_a_cell_is_fine_tuned_once_with_its_rows_checked(tasks, shared_data, tmp_path, export, monkeypatch):
    out = tmp_path / "study"
    run = tasks.ArmRun(tasks.Arm.of({"name": "domain_120", "init": str(export)}), shared_data, out, quick=True)
    run.finetune_cell("sst2", 500, 1)
    path = out / "finetune" / "domain_120" / "sst2" / "500" / "seed1.json"
    record = json.loads(path.read_text())
    assert (record["train_rows"], record["eval_rows"], record["epochs"], record["lr"]) == (500, 200, 1, 3e-4)
    assert record["quick"] and record["objective"] == "mlm" and 0 <= record["metrics"]["acc"] <= 1
    summary = json.loads((out / "finetune" / "domain_120" / "runs" / "sst2-500-seed1" / "metrics.json").read_text())
    assert summary["hyperparameters"]["batch_size"] == 32 and summary["data"]["train"]["examples"] == 500
    monkeypatch.setattr(tasks, "run_finetune", lambda *args, **kwargs: pytest.fail("fine-tuned again"))
    run.finetune_cell("sst2", 500, 1)          # done: skipped
    full = tasks.ArmRun(run.arm, shared_data, out, quick=False)
    with pytest.raises(ValueError, match="quick result and this run is full-scale"):
        full.finetune_cell("sst2", 500, 1)


def test_the_rate_is_chosen_on_the_selection_slice_from_its_tries(tasks, shared_data, tmp_path, export, monkeypatch):
    """The grid's tries as a finished (or interrupted and resumed) selection left them: the best finite score wins,
    a NaN (constant predictions: no correlation) never does, and nothing is fine-tuned again."""
    from study_results import rate_choice_path, rate_try_path, write_json

    out = tmp_path / "study"
    for lr, pearson in zip(tasks.RATE_GRID, (float("nan"), 0.34, 0.21)):
        write_json(rate_try_path(out, "general_60", "stsb", lr),
                   {"arm": "general_60", "task": "stsb", "quick": False, "metrics": {"pearson": pearson}})
    monkeypatch.setattr(tasks, "run_finetune", lambda *args, **kwargs: pytest.fail("fine-tuned again"))
    run = tasks.ArmRun(tasks.Arm.of({"name": "general_60", "init": str(export)}), shared_data, out, quick=False)
    assert run.rate("stsb") == 3e-4
    record = json.loads(rate_choice_path(out, "general_60", "stsb").read_text())
    assert (record["metric"], record["seed"], record["train_rows"], record["eval_rows"]) == ("pearson", 0, 5249, 500)
    assert record["eval_set"] == "rate-selection slice" and record["grid"] == [1e-4, 3e-4, 1e-3]


@pytest.mark.slow   # a quick arm: nine fine-tuning runs, the probe and zero-shot on real data (about a minute)
def test_a_quick_arm_runs_end_to_end_and_resumes(tasks, shared_data, tmp_path, export, monkeypatch):
    from study_baseline import run_baseline
    from study_data import BUDGETS
    from study_report import build_report
    from study_results import result_path, zeroshot_path

    out = tmp_path / "study"
    arm = {"name": "random_domain", "random_like": str(export)}
    tasks.run_arm(arm, shared_data, out, quick=True)
    for task, budgets in BUDGETS.items():
        for budget in budgets:
            assert json.loads(result_path(out, "random_domain", task, budget, 1).read_text())["quick"]
    probe = json.loads(result_path(out, "random_domain", "probe", 1000, 1).read_text())
    assert set(probe["metrics"]) == {"last_mean", "scalar_mix_mean"} and probe["train_rows"] == 1000
    zero = json.loads(zeroshot_path(out, "random_domain").read_text())
    assert zero["eval_rows"] == 200 and "torch seed 1" in zero["init"]

    # an interrupted run: the one result it lacks is made again, nothing else
    result_path(out, "random_domain", "cola", "full", 1).unlink()
    made, real = [], tasks.run_finetune
    monkeypatch.setattr(tasks, "run_finetune", lambda files, *rest, **kw: made.append(files.task) or real(files, *rest,
                                                                                                           **kw))
    tasks.run_arm(arm, shared_data, out, quick=True)
    assert made == ["cola"]

    run_baseline(shared_data, out, quick=True)
    text = build_report(out).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| random_domain |"))
    assert "missing" not in row and "A quick run" in text
