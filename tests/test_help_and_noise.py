"""Both entry points explain themselves with --help, and print the job's own output without known noise."""
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
KNOWN_NOISE = ("apitools not found", "No semi_persistent_directory found", "Logging handler created",
               "litlogger", "The `srun` command is available", "LeafSpec", "bigquery_storage_v1")


def run(*args, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_data_prep_help_lists_presets_keys_and_beam_options():
    result = run("data_prep/run.py", "--help")
    assert result.returncode == 0, result.stderr
    for expected in ("usage: python data_prep/run.py", "sample", "phase1", "wiki_books_phase2", "inputs",
                     "output_dir", "dupe_factor", "masking", "--runner=DataflowRunner", "passed to Beam untouched"):
        assert expected in result.stdout, expected


def test_train_help_lists_only_training_groups():
    result = run("pipeline/train.py", "--help")
    assert result.returncode == 0, result.stderr
    assert ("model: base, large, medium, mini, modernbert_base, modernbert_large, modernbert_mini, modernbert_tiny, "
            "small, tiny") in result.stdout
    assert "strategy: auto, ddp" in result.stdout
    assert "data_prep:" not in result.stdout   # conf/data_prep holds the data job's presets, not a training group


def test_data_prep_prints_its_progress_and_summary_without_known_noise(tmp_path, shared_data):
    book = shared_data / "corpora" / "books" / "chesterton-thursday.txt"
    result = run("data_prep/run.py", "preset=phase1", f"inputs=[{{path: '{book}', format: books}}]",
                 f"output_dir={tmp_path}", "dupe_factor=1",
                 "--direct_running_mode=multi_processing", "--direct_num_workers=2", "--runner=DirectRunner")
    assert result.returncode == 0, result.stderr
    assert "random-next share" in result.stdout and "read chesterton-thursday.txt" in result.stderr
    for noise in KNOWN_NOISE:
        assert noise not in result.stderr + result.stdout, noise


TRAINER_SCRIPT = """
import logging, warnings, sys
logging.basicConfig(level=logging.INFO)   # as Hydra's job logging: INFO records show
import pipeline.core.app  # what every entry point imports first: installs the filters
import apache_beam.io.filesystems  # what reading a set on gs:// imports (data_prep.manifest), and its BigQuery module
import pytorch_lightning as pl
from pytorch_lightning.loggers import CSVLogger
pl.Trainer(logger=CSVLogger(sys.argv[1]), accelerator="cpu", devices=1, enable_progress_bar=False)
warnings.warn("a real warning stays visible")
"""


def test_training_start_up_without_known_noise(tmp_path):
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}
    result = subprocess.run([sys.executable, "-c", TRAINER_SCRIPT, str(tmp_path)], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "a real warning stays visible" in result.stderr
    for noise in KNOWN_NOISE:
        assert noise not in result.stderr + result.stdout, noise
