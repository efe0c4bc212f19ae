"""study_record.py: the study's finished results are copied into the repository as they are made and come
back on a machine that has none of them; unfinished runs, checkpoints and shards stay out. And the committed record
itself: the search it holds still makes the recorded choices and budgets."""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def modules(study_importable):
    import study_recipe
    import study_record
    import study_results
    return study_record, study_recipe, study_results


def _file(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def study_out(modules, tmp_path):
    """A study folder as the stages leave it: finished and unfinished runs, their checkpoints, downstream results."""
    _, _, results = modules
    out = tmp_path / "study"
    _file(out / "calibration.json", '{"tiny_v16000_s64": {"steps_per_minute": 521.3}}')
    _file(out / "corpora" / "domain" / "stats.json", "{}")
    _file(out / "corpora" / "domain" / "train" / "part-00.jsonl", '{"text": "a review"}\n')
    _file(out / "shards" / "domain_v16000_s64_mlm_nsp" / "train" / "shard-00000-of-00001.parquet")
    _file(out / "search" / "domain" / "choice.json", "{}")
    _file(out / "search" / "domain" / "tiny_try" / "DONE", '{"heldout_mlm_acc": 0.12}')
    _file(out / "search" / "domain" / "tiny_try" / "hf_export" / "model.safetensors", "weights of a try")
    _file(out / "search" / "domain" / "stopped_try" / "csv" / "metrics.csv")
    finished = out / "pretrain" / "domain_120"
    for name in ("DONE", "csv/metrics.csv", "hf_export/config.json", "hf_export/model.safetensors",
                 "checkpoints/step0062560.ckpt", "train.log"):
        _file(finished / name, name)
    for name in ("csv/metrics.csv", "checkpoints/step0043814.ckpt"):
        _file(out / "pretrain" / "general_120" / name, name)
    results.write_json(results.result_path(out, "domain_120", "sst2", 1000, 1), {"arm": "domain_120", "seed": 1})
    results.write_json(results.zeroshot_path(out, "domain_120"), {"arm": "domain_120"})
    results.write_json(results.rate_try_path(out, "domain_120", "sst2", 1e-3), {"lr": 1e-3})
    results.write_json(results.rate_choice_path(out, "domain_120", "sst2"), {"lr": 1e-3})
    _file(results.finetune_root(out) / "domain_120" / "runs" / "sst2-1000-seed1" / "metrics.json")
    _file(results.finetune_root(out) / "data" / "sst2" / "1000" / "seed1.json")
    return out


# The export's weights as a pointer (their git blob id, sha256 and size), never a copy: the working tree travels to
# a lent GPU machine within 64 MiB
KEPT = {"calibration.json", "corpora/domain/stats.json", "search/domain/choice.json", "search/domain/tiny_try/DONE",
        "pretrain/domain_120/DONE", "pretrain/domain_120/csv/metrics.csv", "pretrain/domain_120/hf_export/config.json",
        "pretrain/domain_120/hf_export/model.safetensors.json", "finetune/domain_120/sst2/1000/seed1.json",
        "finetune/domain_120/zeroshot/sst2.json", "finetune/domain_120/rates/sst2/lr0.001.json",
        "finetune/domain_120/rates/sst2.json"}
WEIGHTS = "pretrain/domain_120/hf_export/model.safetensors"


def _files(root):
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def test_finished_results_are_kept_and_come_back_on_an_empty_machine(modules, study_out, tmp_path):
    record_module, _, _ = modules
    record = tmp_path / "record"
    assert {str(p) for p in record_module.keep(study_out, record)} == KEPT
    assert _files(record) == KEPT       # no checkpoint, shard, corpus text, run folder, unfinished run or try export
    assert record_module.keep(study_out, record) == []          # nothing new: nothing copied
    fresh = tmp_path / "new_machine"
    # These weights are in no commit: all but them come back, and restore says so
    assert {str(p) for p in record_module.restore(fresh, record)} == KEPT - {WEIGHTS + ".json"}
    for name in KEPT - {WEIGHTS + ".json"}:
        assert (fresh / name).read_bytes() == (study_out / name).read_bytes()
    assert not (fresh / WEIGHTS).exists()


def test_the_committed_records_weights_come_back_from_git_history(modules, tmp_path):
    """The 73.5 MB of exports committed before 2026-11-29 left the working tree for pointers; restore takes each
    back from the repository's history, and its sha256 is the pointer's."""
    record_module, _, _ = modules
    import hashlib

    pointers = sorted(record_module.RECORD.rglob("model.safetensors.json"))
    assert len(pointers) == 8 and not list(record_module.RECORD.rglob("model.safetensors"))
    out = tmp_path / "study"
    restored = record_module.restore(out)
    for pointer in pointers:
        relative = pointer.relative_to(record_module.RECORD).with_name("model.safetensors")
        assert relative in restored
        wanted = json.loads(pointer.read_text())
        data = (out / relative).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (wanted["bytes"], wanted["sha256"])


def test_a_changed_result_is_kept_again_and_restore_never_overwrites(modules, study_out, tmp_path):
    record_module, _, _ = modules
    record = tmp_path / "record"
    record_module.keep(study_out, record)
    (study_out / "calibration.json").write_text('{"tiny_v16000_s64": {"steps_per_minute": 500.0}}')
    assert [str(p) for p in record_module.keep(study_out, record)] == ["calibration.json"]
    assert "500.0" in (record / "calibration.json").read_text()
    (study_out / "pretrain" / "domain_120" / "DONE").write_text("this machine's own")
    restored = record_module.restore(study_out, record)
    assert restored == []
    assert (study_out / "pretrain" / "domain_120" / "DONE").read_text() == "this machine's own"


def test_the_committed_record_still_makes_the_recorded_choices_and_budgets(modules, tmp_path):
    """The search's DONE records recovered on 2026-11-26 from benchmarks/README.md give, through the protocol's
    selection rule, the recipes chosen on 2026-11-25, and the calibration gives the arms' recorded step budgets."""
    record_module, recipe, _ = modules
    out = tmp_path / "study"
    record_module.restore(out)
    chosen = {}
    for corpus in recipe.CORPORA:
        committed = json.loads((record_module.RECORD / "search" / corpus / "choice.json").read_text())
        chosen[corpus] = recipe.choose(out, corpus, recipe.TRIES)["recipe"]
        assert chosen[corpus] == committed["recipe"]
    assert chosen["domain"] == {"model": "tiny", "vocab": 16000, "seq": 64, "objective": "mlm_nsp", "lr": 2e-3}
    assert chosen["general"] == {"model": "tiny", "vocab": 8000, "seq": 128, "objective": "mlm", "lr": 2e-3}
    budgets = {(corpus, minutes): recipe.budget_steps(out, chosen[corpus], minutes)
               for corpus in recipe.CORPORA for minutes in (120, 60)}
    assert budgets == {("domain", 120): 62560, ("domain", 60): 31280, ("general", 120): 46150, ("general", 60): 23080}


def test_a_stage_restores_from_the_record_and_keeps_what_it_finished(study_script, shared_data, modules,
                                                                    tmp_path):
    record_module, _, results = modules
    out, record = tmp_path / "study", tmp_path / "record"
    results.write_json(results.result_path(record, "domain_120", "sst2", 1000, 1),
                       {"arm": "domain_120", "task": "sst2", "budget": 1000, "seed": 1, "quick": False,
                        "metrics": {"acc": 0.7}})
    done = study_script("bench_downstream.py", "report", "--shared-data", str(shared_data), "--out", str(out),
                            "--record", str(record), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "record: 1 file(s) restored" in done.stdout
    assert (out / "finetune" / "domain_120" / "sst2" / "1000" / "seed1.json").is_file()
    assert "domain_120" in (out / "report" / "report.md").read_text()


STOPPED_STAGE = """
import sys, time
sys.path.insert(0, {study!r})
import bench_downstream
from study_results import result_path, write_json

def a_long_stage(stage, out, *_):
    write_json(result_path(out, "domain_60", "imdb", 1000, 2), {{"arm": "domain_60", "seed": 2}})
    print("finished one result", flush=True)
    time.sleep(600)

bench_downstream.run_stage = a_long_stage
sys.argv = ["bench_downstream.py", "finetune", "--out", {out!r}, "--record", {record!r}, "--shared-data", {data!r}]
sys.exit(bench_downstream.main())
"""


def test_a_stage_stopped_by_sigterm_still_keeps_what_it_finished(study_importable, shared_data, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out, record = tmp_path / "study", tmp_path / "record"
    script = STOPPED_STAGE.format(study=str(study_importable), out=str(out), record=str(record),
                                  data=str(shared_data))
    stage = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [stage.stdout.readline() for _ in range(3)]     # the record, the stage's name, its first result
        assert lines[-1] == "finished one result\n", lines
        time.sleep(0.5)
        stage.send_signal(signal.SIGTERM)
        _, stderr = stage.communicate(timeout=120)
    finally:
        stage.kill()
    assert stage.returncode == 1 and "stopped by signal 15" in stderr
    assert (record / "finetune" / "domain_60" / "imdb" / "1000" / "seed2.json").is_file()
