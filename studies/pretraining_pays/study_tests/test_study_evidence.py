"""The second protocol's rules as code (evidence_protocol.md, sections 3 and 4): the rate ladder, the interval over
pre-training runs, the plateau exit, the selection of a remedy, the tries' schedules and the nested seeds."""
from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.usefixtures("study_importable")


@pytest.mark.parametrize(("scores", "chosen", "tried"), [
    ({1e-4: 0.6, 3e-4: 0.7, 1e-3: 0.65}, 3e-4, [1e-4, 3e-4, 1e-3]),                     # interior at once
    ({1e-4: 0.6, 3e-4: 0.7, 1e-3: 0.75, 3e-3: 0.72}, 1e-3, [1e-4, 3e-4, 1e-3, 3e-3]),     # one step up
    ({1e-4: 0.6, 3e-4: 0.7, 1e-3: 0.75, 3e-3: 0.8, 1e-2: 0.9}, 1e-2, [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]),  # the end
    ({1e-5: 0.7, 3e-5: 0.8, 1e-4: 0.75, 3e-4: 0.7, 1e-3: 0.6}, 3e-5, [1e-5, 3e-5, 1e-4, 3e-4, 1e-3]),  # two down
    ({1e-4: 0.7, 3e-4: 0.7, 1e-3: 0.6, 3e-5: 0.65}, 1e-4, [3e-5, 1e-4, 3e-4, 1e-3]),    # a tie: the lower rate
    ({1e-4: math.nan, 3e-4: math.nan, 1e-3: 0.1, 3e-3: math.nan}, 1e-3, [1e-4, 3e-4, 1e-3, 3e-3]),  # NaN never wins
])
def test_the_rate_ladder_extends_until_the_choice_is_interior(scores, chosen, tried):
    from study_pairing import choose_on_ladder

    asked = []
    found, scored = choose_on_ladder(lambda rate: asked.append(rate) or scores[rate])
    assert found == chosen and sorted(scored) == tried and len(asked) == len(set(asked))


def test_the_interval_is_over_the_runs_means():
    from scipy import stats
    from study_stats import two_level, two_level_verdict

    differences = {1: {1: 0.05, 2: 0.07, 3: 0.06, 4: 0.08, 5: 0.04}, 2: {6: 0.01, 7: 0.03, 8: 0.02, 9: 0.0, 10: 0.04},
                   3: {11: 0.09, 12: 0.1, 13: 0.08, 14: 0.11, 15: 0.07}}
    found = two_level(differences)
    means = [0.06, 0.02, 0.09]
    low, high = stats.t.interval(0.95, 2, loc=sum(means) / 3, scale=stats.sem(means))
    assert found["run_means"] == pytest.approx(means) and found["mean"] == pytest.approx(sum(means) / 3)
    assert (found["low"], found["high"]) == (pytest.approx(low), pytest.approx(high))
    assert found["within_sd"] == pytest.approx(math.sqrt(0.00025)) and found["sd"] == pytest.approx(stats.tstd(means))
    assert found["bootstrap_low"] < found["mean"] < found["bootstrap_high"]
    assert two_level(differences)["bootstrap_low"] == found["bootstrap_low"]          # seeded: the same every time
    assert two_level_verdict(found, runs=3, seeds=5) == ("met" if low > 0 else "not met")
    del differences[3][15]
    assert two_level_verdict(two_level(differences), runs=3, seeds=5).startswith("undecided")


def _rows(accuracies, every=50):
    return [{"step": str(every * (k + 1)), "train/mlm_acc": str(acc)} for k, acc in enumerate(accuracies)] + [
        {"step": "999999", "val/mlm_acc": "0.3"}]


def test_the_plateau_exit_is_the_first_window_past_the_threshold():
    from study_evidence import exit_step

    assert exit_step(_rows([0.14] * 10)) is None
    assert exit_step(_rows([0.14, 0.15, 0.2, 0.14, 0.14])) is None                   # one high value is not an exit
    assert exit_step(_rows([0.14, 0.14, 0.15, 0.17, 0.18, 0.19, 0.2])) == 300        # mean(.15,.17,.18,.19) > .16


def test_a_step_that_a_resume_logged_again_counts_once_as_last_logged():
    from study_evidence import exit_step, highest_window

    # stopped after step 200 with its checkpoint at 150: the resumed process logs 200 again (over steps 151-200
    # only), then goes on. Read in file order, the window at 250 would hold 200 twice.
    rows = _rows([0.13, 0.15, 0.17, 0.30]) + [{"step": "200", "train/mlm_acc": "0.18"},
                                                {"step": "250", "train/mlm_acc": "0.19"}]
    assert exit_step(rows) == 250                         # at 200: (.13+.15+.17+.18)/4 = .1575, not past .16
    assert highest_window(rows) == pytest.approx((0.15 + 0.17 + 0.18 + 0.19) / 4)


def test_the_highest_window_says_how_near_a_run_came_to_the_exit():
    from study_evidence import highest_window

    assert highest_window(_rows([0.14, 0.15, 0.2, 0.14, 0.14])) == pytest.approx(0.1575)   # (.14+.15+.2+.14)/4
    assert highest_window(_rows([0.14, 0.15])) is None                                    # fewer than a window


def _try(exit_step, accuracy, scale=1):
    return {"exit_step": exit_step, "exit_examples_of_32": None if exit_step is None else exit_step * scale,
            "heldout_mlm_acc": accuracy}


def test_the_remedy_is_the_earliest_exit_in_both_seeds():
    from study_evidence import choose_remedy

    tries = {"base": [_try(None, 0.14), _try(3000, 0.16)],                     # one seed stayed: no exit
             "lr1e-3": [_try(2000, 0.2), _try(2600, 0.21)],                    # exit 2,600
             "batch128": [_try(500, 0.2, 4), _try(600, 0.2, 4)],               # 2,400 in examples of 32
             "warmup20": [_try(2400, 0.19), _try(1000, 0.19)]}                 # 2,400: a tie, lower accuracy
    assert choose_remedy(tries)["chosen"] == "batch128"
    tries["warmup20"] = [_try(2400, 0.25), _try(1000, 0.25)]
    assert choose_remedy(tries)["chosen"] == "warmup20"
    assert choose_remedy({"base": [_try(None, 0.14), _try(None, 0.14)]})["chosen"] is None


def test_the_tries_run_the_first_steps_of_the_arms_schedule():
    from study_evidence import PLATEAU_TRIES, _schedule

    assert _schedule(PLATEAU_TRIES["base"][0])[1:] == (46150, 4000)
    recipe, arm_steps, steps = _schedule(PLATEAU_TRIES["batch128"][0])
    assert (recipe["batch"], arm_steps, steps) == (128, 11538, 1000)
    assert _schedule(PLATEAU_TRIES["lr5e-4"][0])[0]["lr"] == 5e-4


def test_a_tries_overrides_reach_the_model_and_the_schedule():
    from study_evidence import PLATEAU_TRIES

    from pipeline.core.app import compose
    from pipeline.core.optim.optimizers import warmup_steps_of
    from pipeline.pretraining.checks import model_config_of

    for name, warmup in (("init0.01", 2769), ("warmup20", 9230)):
        cfg = compose("train", ["+experiment=cpu_hour", "model=tiny", "trainer.max_steps=4000",
                                "scheduler.total_steps=46150", *PLATEAU_TRIES[name][1]])
        assert warmup_steps_of(cfg.scheduler, int(cfg.scheduler.total_steps)) == warmup
        assert model_config_of(cfg).initializer_range == (0.01 if name == "init0.01" else 0.02)


def test_fine_tuning_seeds_nest_in_the_runs_and_random_encoders_follow_both(tmp_path):
    from study_evidence import finetune_seeds, remedy_pairing, replication_pairing

    assert [finetune_seeds(run) for run in (1, 2, 3)] == [(1, 2, 3, 4, 5), (6, 7, 8, 9, 10), (11, 12, 13, 14, 15)]
    pairing = replication_pairing(tmp_path, 2)
    assert (pairing.pretrained, pairing.random) == ("domain_120_p2", "random_domain_p2")
    assert pairing.seeds == (6, 7, 8, 9, 10)
    assert [pairing.random_seed(seed) for seed in (0, 6, 10)] == [200, 206, 210]
    assert remedy_pairing(tmp_path).random_seed(4) == 4


def test_a_pairing_fine_tunes_each_cell_once_both_arms_of_a_seed_together(shared_data, tmp_path, monkeypatch):
    import study_pairing
    from study_pairing import Pairing, run_pairing
    from study_results import result_path

    made = []

    def fake_finetune(files, init, lr, epochs, seed, run_dir, cache, extra=()):
        made.append((run_dir.parts[-3], files.task, seed, init.name))
        return {"metrics": {"acc": 0.5 + seed / 100}, "lr": lr, "epochs": epochs, "global_step": 1, "seconds": 0.1,
                "train_rows": files.train_rows, "eval_rows": files.eval_rows, "eval_set": files.eval_name}

    monkeypatch.setattr(study_pairing, "run_finetune", fake_finetune)
    monkeypatch.setattr(study_pairing, "random_export", lambda like, seed, target: target)
    pairing = Pairing("domain_120_p1", "random_domain_p1", tmp_path / "export", (1, 2), lambda seed: 100 + seed,
                      (("sst2", 1000),))
    run_pairing(pairing, shared_data, tmp_path / "out", quick=True)
    assert made == [("domain_120_p1", "sst2", 1, "export"), ("random_domain_p1", "sst2", 1, "seed101"),
                    ("domain_120_p1", "sst2", 2, "export"), ("random_domain_p1", "sst2", 2, "seed102")]
    record = json.loads(result_path(tmp_path / "out", "random_domain_p1", "sst2", 1000, 2).read_text())
    assert "torch seed 102" in record["init"] and record["metrics"]["acc"] == 0.52
    run_pairing(pairing, shared_data, tmp_path / "out", quick=True)
    assert len(made) == 4                                                   # done: nothing again


def test_the_report_shows_what_is_finished_and_the_verdict_over_runs(tmp_path):
    from study_evidence_report import build_evidence_report
    from study_record import RECORD
    from study_results import result_path, write_json

    out = tmp_path / "evidence"
    empty = build_evidence_report(out, RECORD).read_text()
    assert "| domain | second | not built |" in empty and "Not run yet." in empty
    assert "| domain_120_p1 | not finished |" in empty and "(a') SST-2 at 1,000 labels | not run |" in empty
    for run, base in ((1, 0.05), (2, 0.03), (3, 0.07)):
        for k, seed in enumerate(range(5 * run - 4, 5 * run + 1)):
            for arm, value in ((f"domain_120_p{run}", 0.7 + base + k / 1000), (f"random_domain_p{run}", 0.7)):
                write_json(result_path(out, arm, "sst2", 1000, seed), {"arm": arm, "task": "sst2", "budget": "1000",
                                                                      "seed": seed, "metrics": {"acc": value}})
    text = build_evidence_report(out, RECORD).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| (a') SST-2"))
    assert "+0.0520, +0.0320, +0.0720" in row and row.endswith("| met |")
    assert next(line for line in text.splitlines() if line.startswith("| (c') IMDB")).endswith("| undecided |")
    # Beside (c'): the pre-trained arm minus the bag of words on the same subsets, over the runs
    for run in (1, 2, 3):
        for seed in range(5 * run - 4, 5 * run + 1):
            for arm, value in ((f"domain_120_p{run}", 0.75 + run / 100), ("bag_of_words", 0.76)):
                write_json(result_path(out, arm, "imdb", 1000, seed), {"arm": arm, "task": "imdb", "budget": "1000",
                                                                      "seed": seed, "metrics": {"acc": value}})
    text = build_evidence_report(out, RECORD).read_text()
    assert "The bag of words on the same IMDB subsets (15 seeds): mean accuracy 0.7600." in text
    assert "minus the bag of words, paired on those subsets (not an endpoint): +0.0100 [" in text
    # Section 4: a finished try shows its exit, how near it came and its held-out score; an unfinished one dashes
    run_dir = out / "plateau" / "lr1e-3" / "seed1"
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / "DONE").write_text(json.dumps({"heldout_mlm_acc": 0.1412}))
    (run_dir / "csv" / "metrics.csv").write_text("step,train/mlm_acc\n" + "".join(
        f"{50 * k + 49},{acc}\n" for k, acc in enumerate([0.14, 0.15, 0.2, 0.14, 0.14])))
    text = build_evidence_report(out, RECORD).read_text()
    assert "| lr1e-3 | lr=0.001 | None / — | 0.1575 / — | 0.1412 / — |" in text
    assert "Chosen: not yet (the tries are not finished)" in text
    # No try chosen is the rule's outcome: reported as such, with no remedy endpoints to wait for
    (out / "plateau" / "choice.json").write_text(json.dumps({"chosen": None, "tries": {}}))
    text = build_evidence_report(out, RECORD).read_text()
    assert "Chosen: none. No try left the plateau at both seeds" in text and "general_120_remedy` against" not in text


def test_the_report_stage_runs_as_a_user_runs_it_beside_a_running_stage(study_script, shared_data, tmp_path):
    import fcntl

    with open(tmp_path / ".running", "w", encoding="utf-8") as held:   # a replication stage holds the folder
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = study_script("bench_evidence.py", "report", "--shared-data", str(shared_data), "--out", str(tmp_path),
                            timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "## 3. Replication of `domain_120`" in (tmp_path / "report.md").read_text()
        refused = study_script("bench_evidence.py", "corpora", "--shared-data", str(shared_data), "--out",
                               str(tmp_path), timeout=300)
        assert refused.returncode == 1 and "one stage of the study at a time" in refused.stderr


def test_each_finished_try_is_kept_at_once(tmp_path, monkeypatch):
    """A sitting that loses its machine after some tries keeps those tries: finished() runs after each one."""
    import study_evidence

    trained, kept = [], []
    monkeypatch.setattr(study_evidence, "train_for", lambda out, corpus, recipe, run_dir, steps, **kw: trained.append(
        run_dir) or {"heldout_mlm_acc": 0.14})
    monkeypatch.setattr(study_evidence, "metrics_rows", lambda run_dir: [])
    tries = study_evidence.run_tries(tmp_path, lambda: kept.append(len(trained)))
    assert kept == list(range(1, 13)) and len(trained) == 12
    assert tries["base"][0] == {"heldout_mlm_acc": 0.14, "exit_step": None, "exit_examples_of_32": None}
