"""Every shipped recipe at the shapes users run it: each experiment composed for 1, 4 and 8 nodes of 8 GPUs passes
pre-training's pre-flight checks (batch split, schedule, strategy x optimizer x precision, phase-2 init, W&B),
without a GPU; and the real BERT-Large trains for a few steps on the CPU, phase 2 from phase 1's checkpoint."""
from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.app import TRAINING_CONFIGS, compose
from pipeline.pretraining.checks import preflight

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (TRAINING_CONFIGS / "experiment").glob("bert_*.yaml"))   # the GPU recipes
NODES = (1, 4, 8)


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_passes_preflight_at_its_cluster_shapes(name, nodes, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)   # the recipes log online; the key's presence is what is checked
    overrides = [f"+experiment={name}", "trainer.devices=8", f"trainer.num_nodes={nodes}"]
    if name.endswith("phase2"):
        overrides.append("init_from_checkpoint=/phase1/checkpoints/last.ckpt")   # existence is checked at the start
    cfg = compose("train", overrides)
    shape = preflight(cfg, world_size=8 * nodes)
    assert shape.micro_batch_size * shape.accumulation * 8 * nodes == cfg.data.global_batch_size
    most = cfg.data.micro_batch_size   # auto: the whole per-process batch before the run's start sizes the pass
    assert shape.micro_batch_size <= (cfg.data.global_batch_size // (8 * nodes) if most == "auto" else most)
    assert shape.trainer_cfg["precision"] == "bf16-mixed"


def test_a_shape_a_recipe_cannot_take_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    cfg = compose("train", ["+experiment=bert_base", "trainer.devices=8", "trainer.num_nodes=3"])
    with pytest.raises(ValueError, match="global_batch_size=256 does not divide over devices x nodes = 24"):
        preflight(cfg, world_size=24)


def test_a_phase_2_recipe_without_phase_1_weights_is_refused(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    with pytest.raises(ValueError, match="phase 2 from phase 1"):
        preflight(compose("train", ["+experiment=bert_large_phase2"]), world_size=8)


def test_online_logging_without_a_key_is_refused(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        preflight(compose("train", ["+experiment=bert_base"]), world_size=8)


def test_the_dry_run_after_an_experiment_takes_its_own_batch_and_steps():
    """Hydra applies appended configs in command-line order: +debug=dryrun goes after +experiment=... (as in the
    README), or the recipe's batch of 65,536 in passes of 64 comes back (1,024 passes a step; killed for memory)."""
    cfg = compose("train", ["+experiment=bert_large", "+debug=dryrun"])
    assert (cfg.data.global_batch_size, cfg.data.micro_batch_size, cfg.trainer.max_steps) == (2, 1, 4)


def dry_run(experiment: str, *overrides: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    command = [sys.executable, "pipeline/train.py", f"+experiment={experiment}", "+debug=dryrun", "trainer=cpu",
               "logger=csv", "trainer.enable_progress_bar=false", *overrides]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "2"})


@pytest.fixture(scope="module")
def phase2_shards(tmp_path_factory, shared_data) -> Path:
    """Seq 512 / 80 predictions from one real book, by the real data job (phase 2's shape)."""
    from data_prep.run import run

    book = shared_data / "corpora" / "books" / "chesterton-thursday.txt"
    out = tmp_path_factory.mktemp("phase2") / "shards"
    run([f"inputs=[{{path: '{book}', format: books}}]", f"output_dir={out}", "preset=phase2", "num_shards=2",
         "dupe_factor=1", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.mark.slow
def test_bert_large_dry_run_on_the_cpu_phase_1_then_phase_2(small_shards, phase2_shards, tmp_path):
    """The real BERT-Large (340M parameters, LAMB, DDP strategy) for the dry run's 4 steps on the CPU, then phase 2
    at seq 512 from its last checkpoint: the recipes' code paths end to end, at full model size."""
    phase1, phase2 = tmp_path / "phase1", tmp_path / "phase2"
    free = shutil.disk_usage(tmp_path).free / 2**30
    assert free > 7, (f"needs 7 GiB free under {tmp_path} (phase 1's checkpoint with LAMB's states ~3.8, phase 2's "
                      f"export ~1.3, room beside them); has {free:.1f}")
    # Phase 1 writes its last checkpoint only (4 GB with LAMB's states; the dry run's periodic ones add nothing here)
    # and no export: phase 2, which starts from that checkpoint, exports.
    done = dry_run("bert_large", f"data.path={small_shards}", f"hydra.run.dir={phase1}",
                   "callbacks.checkpoint.every_n_train_steps=0", "export.hf=false", "export.plot=false")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 4:" in done.stdout and (phase1 / "checkpoints" / "last.ckpt").is_file()
    done = dry_run("bert_large_phase2", f"data.path={phase2_shards}", f"hydra.run.dir={phase2}",
                   f"init_from_checkpoint={phase1 / 'checkpoints' / 'last.ckpt'}",
                   "callbacks.checkpoint.every_n_train_steps=0", "callbacks.checkpoint.save_last=false",
                   "export.plot=false")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 4:" in done.stdout and (phase2 / "hf_export" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def short_pair_phase2_shards(tmp_path_factory) -> Path:
    """The bundled sample at phase 2's shape with every pair of a random target length (short_seq_prob=1): pairs
    of ~255 tokens on average, so that micro-batches of 2 pack."""
    from data_prep.run import run

    out = tmp_path_factory.mktemp("phase2_short") / "shards"
    run(["preset=sample_phase2", "short_seq_prob=1.0", "dupe_factor=1", "num_shards=1", f"output_dir={out}",
         "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.mark.slow
def test_bert_large_phase2_dry_run_with_packing_on_the_cpu(short_pair_phase2_shards, tmp_path):
    """The real BERT-Large phase-2 recipe, 2 steps of 2 passes of 2 pairs on the CPU, with data.packing=true (from
    random weights: packing needs none of phase 1's): the packed rows through the recipe's LAMB, DDP strategy and
    bf16 path. Throughput counts pairs, so padded tokens per pair below 512 show rows shared by two pairs. (On the
    2-core machine: 2 min 28 s, data prep included; the same run by hand on the plain phase-2 sample, under load:
    5 min 42 s, peak RSS 11.6 GB.)"""
    run_dir = tmp_path / "phase2_packed"
    done = dry_run("bert_large_phase2", f"data.path={short_pair_phase2_shards}", f"hydra.run.dir={run_dir}",
                   "require_init_from_checkpoint=false", "data.packing=true", "data.global_batch_size=4",
                   "data.micro_batch_size=2", "trainer.max_steps=2", "callbacks.checkpoint.every_n_train_steps=0",
                   "callbacks.checkpoint.save_last=false", "export.hf=false", "export.plot=false")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 2:" in done.stdout
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        windows = [row for row in csv.DictReader(handle) if row.get("perf/sequences_per_s")]
    assert len(windows) == 2
    per_pair = [float(w["perf/padded_tokens_per_s"]) / float(w["perf/sequences_per_s"]) for w in windows]
    assert min(per_pair) < 512, per_pair   # some row held two pairs
    assert all(float(w["perf/tokens_per_s"]) <= float(w["perf/padded_tokens_per_s"]) for w in windows)
