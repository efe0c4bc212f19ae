"""The study's whole chain at its quick scale: `python studies/modern_recipe/bench_modern.py --quick --shared-data
<shared data>` (into a temporary --out): corpora and shard sets, calibration of both arms, every quick run and its
pairing against its random twin, the report; then the data stage on a "new machine" that has only the recorded
vocabulary."""
from __future__ import annotations

import json
import shutil

import pytest


@pytest.mark.slow
def test_the_quick_chain_runs_end_to_end_and_reports_the_primary_endpoint(modern_script, shared_data, tmp_path):
    result = modern_script("bench_modern.py", "--quick", "--shared-data", str(shared_data), "--out", str(tmp_path),
                           HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert set(json.loads((tmp_path / "calibration.json").read_text())) == {"modernbert_tiny_v8000_s128",
                                                                            "tiny_v8000_s128"}
    for run, model_type in (("modern_120_p1", "modernbert"), ("modern_120_p2", "modernbert"), ("tiny_120_p1", "bert")):
        export = tmp_path / "pretrain" / run / "hf_export"
        assert json.loads((export / "config.json").read_text())["model_type"] == model_type, run
    done = json.loads((tmp_path / "pretrain" / "modern_120_p1" / "DONE").read_text())
    assert "optimizer=stable_adamw" in done["overrides"]
    # the modern arm reads the same packed rows as BERT-tiny's set, masked at 30% in 38 positions
    sets = tmp_path / "shards"
    modern = json.loads((sets / "general_v8000_s128_mlm30" / "train" / "manifest.json").read_text())
    tiny = json.loads((sets / "general_v8000_s128_mlm" / "train" / "manifest.json").read_text())
    assert (modern["parameters"]["masked_lm_prob"], modern["parameters"]["max_predictions_per_seq"]) == (0.3, 38)
    assert modern["tokenizer"]["vocab_sha256"] == tiny["tokenizer"]["vocab_sha256"]
    import pyarrow.parquet as pq
    rows = [pq.read_table(next((sets / name / "train").glob("*.parquet")), columns=["input_ids"]).to_pylist()
            for name in ("general_v8000_s128_mlm30", "general_v8000_s128_mlm")]
    assert rows[0] == rows[1]
    for arm in ("modern_120_p1", "random_modern_p1", "tiny_120_p1", "random_tiny_p1"):
        for task, budget in (("stsb", "full"), ("sst2", "1000")):
            assert len(list((tmp_path / "finetune" / arm / task / budget).glob("seed*.json"))) == 2, (arm, task)
    # a sitting on a new machine rebuilds the same shard sets from the recorded vocabulary (WordPiece training is not
    # deterministic, so it must not train one again)
    again = tmp_path / "new_machine"
    (again / "vocab").mkdir(parents=True)
    shutil.copy(tmp_path / "vocab" / "general_v8000.txt", again / "vocab" / "general_v8000.txt")
    rebuilt = modern_script("bench_modern.py", "data", "--quick", "--shared-data", str(shared_data), "--out",
                            str(again))
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-4000:]
    for name in ("general_v8000_s128_mlm/train", "general_v8000_s128_mlm/heldout", "general_v8000_s128_mlm30/train"):
        for shard in (sets / name).glob("*.parquet"):
            assert (again / "shards" / name / shard.name).read_bytes() == shard.read_bytes(), (name, shard.name)
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    assert report["quick"] is True
    assert report["primary"]["arm"] == "modern" and report["primary"]["cell"] == ["stsb", "full"]
    assert report["primary"]["verdict"] in ("met", "not met")
    for arm in report["runs"].values():   # every quick run's held-out curve ends at its last step
        assert all(run["heldout_curve"][-1][0] + 1 == run["steps"] for run in arm["runs"]), arm
    for name in ("modern_120_p1", "random_modern_p1", "tiny_120_p1", "random_tiny_p1"):   # {task: its rate choice}
        assert set(report["rates"][name]) == {"stsb", "sst2"} and report["rates"][name]["stsb"]["chosen"] > 0, name
