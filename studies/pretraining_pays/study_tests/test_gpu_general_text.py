"""gpu_general_text.py's CPU rehearsal, run as a user runs it: a tiny shard set made by data_prep from the repository's
bundled sample (WikiExtractor articles, MLM only, dynamic masking, BERT's uncased vocabulary), the GLUE files from the
shared data, then `python studies/pretraining_pays/gpu_general_text.py --rehearse ...` as a separate program."""
from __future__ import annotations

import json
import math
import time

import pytest

from tests.helpers.common_fixtures import REPO_ROOT


def _bundled_sample_shards(output_dir):
    from data_prep.run import run

    run([f"inputs=[{{path: '{REPO_ROOT / 'data_prep' / 'sample_corpus' / 'wikiextractor'}', format: wikiextractor}}]",
         f"output_dir={output_dir}", "preset=phase1", "objective=mlm", "masking=dynamic", "max_seq_length=128",
         "max_predictions_per_seq=20", "dupe_factor=1", "num_shards=1",
         "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return output_dir


@pytest.mark.slow   # ~30 s on 2 busy cores: data_prep, two pre-training runs, six fine-tunings
def test_rehearsal_fine_tunes_both_arms_on_every_task(tmp_path, shared_data, study_script):
    shards = _bundled_sample_shards(tmp_path / "shards")
    out = tmp_path / "out"
    done = study_script("gpu_general_text.py", "--rehearse", "--shards", str(shards),
                        "--glue", str(shared_data / "downstream" / "glue"), "--out", str(out),
                        "--work", str(tmp_path / "work"), "--minutes", "0.1", "--budget-minutes", "30", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    results = json.loads((out / "results.json").read_text())
    assert results["rehearsal"] and results["device"] == "cpu" and results["command"].startswith("python ")
    assert results["pretraining"]["model"] == "tiny" and results["pretraining"]["steps"] > 0
    assert math.isfinite(results["pretraining"]["final_train_mlm_loss"])
    assert results["random_twin"]["torch_seed"] == 1
    assert results["not_run"] == []
    cells = {(c["arm"], c["task"], c["seed"]): c for c in results["cells"]}
    assert set(cells) == {(arm, task, 1) for arm in ("pretrained", "random") for task in ("sst2", "stsb", "cola")}
    for (_, task, _), cell in cells.items():
        assert math.isfinite(cell["value"]) and cell["seconds"] > 0
        assert cell["metric"] == {"sst2": "acc", "stsb": "pearson", "cola": "mcc"}[task]
        assert cell["train_rows"] == cell["eval_rows"] == 64
        assert cell["epochs"] == {"sst2": 2, "stsb": 4, "cola": 4}[task] and cell["lr"] == 1e-4

    table = (out / "table.md").read_text()
    assert "Turc et al." in table and "test-set" in table and "85.9" in table   # BERT-Mini's published SST-2
    assert (out / "pretrain_metrics.csv").is_file()


def test_budget_guard_stops_before_a_pair_that_would_pass_the_budget(study_importable):
    import gpu_general_text as script

    class Stub:   # a record that only collects
        results = {"cells": [], "not_run": []}

        def __call__(self):
            raise AssertionError("no cell may run")

    record = Stub()
    budget = 2 * script.EXPECTED_CELL_S["sst2"] - 1   # the first pair (SST-2, both arms) does not fit
    script.finetune_all({}, {}, None, (1, 2), budget, started=time.monotonic(), record=record)
    assert len(record.results["not_run"]) == 2 * 3 * 2 and "sst2 seed 1" in record.results["stopped"]
