"""Fixtures for the training tests: a small real shard set, the overrides of a tiny CPU run, subprocess runs."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOK = "austen-persuasion.txt"   # ~470 KB: ~1,200 instances at seq 128 with dupe_factor 1

# Two cores shared with other work: few threads everywhere, subprocesses included.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    import torch
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory, shared_data) -> Path:
    """A phase-1 shard set (seq 128, 20 predictions, static masking, BERT's uncased vocabulary) made by the real
    data_prep job from one real book."""
    book = shared_data / "corpora" / "books" / BOOK
    if not book.is_file():
        pytest.skip(f"{book} not found")
    inputs = tmp_path_factory.mktemp("books")
    shutil.copy(book, inputs / BOOK)
    out = tmp_path_factory.mktemp("shards") / "phase1"
    from data_prep.run import run
    run([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={out}", "preset=phase1",
         "num_shards=2", "dupe_factor=1", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


def tiny_run_overrides(shards: Path, output_dir: Path, max_steps: int = 10, *extra: str) -> list[str]:
    """A tiny-BERT CPU run of max_steps optimizer steps of 8 sequences (2 micro-batches of 4: accumulation)."""
    return [f"data.path={shards}", f"output_dir={output_dir}", "data.global_batch_size=8",
            "data.micro_batch_size=4", "data.num_workers=0", f"trainer.max_steps={max_steps}",
            "trainer.log_every_n_steps=2", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", "callbacks.checkpoint.every_n_train_steps=5", *extra]


# A training process as a separate program: `train(compose_config(argv))`, killed hard with SIGKILL at the start
# of the first batch once KILL_AT_STEP optimizer steps are done (the checkpoint of an earlier step on disk).
TRAIN_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(2)
import pytorch_lightning as pl
from pipeline.train import compose_config, train

kill_at = int(os.environ.get("KILL_AT_STEP", "0"))

class KillHard(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

result = train(compose_config(sys.argv[1:]), extra_callbacks=[KillHard()] if kill_at else [])
print("FINAL_STEP", result["global_step"])
"""


def run_training_process(overrides: list[str], kill_at_step: int = 0, timeout: float = 300
                         ) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AT_STEP": str(kill_at_step), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", TRAIN_SCRIPT.format(repo=str(REPO_ROOT)), *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def read_wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (run-*.wandb): a LevelDB-style log of wandb_internal_pb2.Record
    protobufs (7-byte file header ':W&B' + magic 0xBEE1 + version; 32 KiB blocks; 7-byte record headers of crc32,
    length, type FULL/FIRST/MIDDLE/LAST). wandb 0.31 ships no Python reader for it (the Go core writes it)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    block, pos, pending, raw_records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left_in_block = block - pos % block
        if left_in_block < 7:       # a block's tail too short for a header is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:               # zero padding up to the next block
            pos += left_in_block
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            raw_records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            raw_records.append(pending + chunk)
            pending = b""
        else:
            raise ValueError(f"{path}: unknown record type {kind} at byte {pos}")
    records = []
    for raw in raw_records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_history(path: Path) -> list[dict[str, float | str]]:
    import json
    rows = []
    for record in read_wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


@pytest.fixture(scope="session")
def torch_extensions_dir(tmp_path_factory) -> str:
    """DeepSpeed JIT-builds its CPU comm op (~45 s or more) once per session, into this directory."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(tmp_path_factory.mktemp("torch_extensions"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Data tests: one thread (2 cores shared with other work; the training runs above allow 2)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# The helpers as fixtures: test modules cannot import a conftest by name (tests/ has two).
@pytest.fixture(scope="session")
def tiny_overrides():
    return tiny_run_overrides


@pytest.fixture(scope="session")
def training_process():
    return run_training_process


@pytest.fixture(scope="session")
def read_wandb_history():
    return wandb_history

# ---------------------------------------------------------------------------------------------- fine-tuning

@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A tiny BERT at random initialisation, exported as a Hugging Face directory with BERT's uncased vocabulary:
    what `init=` takes for a downloaded bert-base-uncased, at a size that trains in seconds."""
    import torch

    from model import BertConfig, BertForPreTraining
    from model.hf_conversion import export_hf

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522, max_position_embeddings=128))
    vocab = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
    return export_hf(model, tmp_path_factory.mktemp("tiny_bert") / "hf", vocab)
