"""What a resume compares beyond the config's keys (issue 49, items 3, 7, 8, 9): the shard set's masking and objective
beside its bytes, each accepted change at its value, the device count the config resolved to, the training code and
the packages. Tiny real runs on real shards; the code change in a copy of the repository's code, edited between two
real `python pipeline/train.py` starts, as a `git pull` between two requeues would."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.app import compose
from pipeline.orchestration.runs import content_identity
from pipeline.pretraining.checks import PretrainChecks
from pipeline.pretraining.run import train
from tests.helpers.ranks import local_launch_env
from tests.helpers.shard_sets import SMALL_BOOKS, build_books_set

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def run(shards, output_dir, tiny_overrides, max_steps, *extra):
    overrides = tiny_overrides(shards, output_dir, max_steps, "export.hf=false", "export.plot=false",
                               "callbacks.checkpoint.every_n_train_steps=0", *extra)
    return train(compose("train", overrides))


def test_a_set_re_prepared_with_other_masking_is_another_set(tmp_path, shared_data, tiny_overrides):
    """Item 3: re-prepared into the same directory at another rate with whole-word masking, a dynamically masked set
    keeps its shard bytes; the loader would mask at the new settings. On ca8c0b7 the resume trained on."""
    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    shards = tmp_path / "dynamic"
    first = build_books_set(shards, books, "masking=dynamic")
    identity = content_identity("data_prep", shards)        # the workflow's: what its later stages are keyed on
    run(shards, tmp_path / "run", tiny_overrides, STEPS)
    second = build_books_set(shards, books, "masking=dynamic", "masked_lm_prob=0.4", "whole_word_masking=true")
    assert [s["parquet"]["sha256"] for s in second["shards"]] == [s["parquet"]["sha256"] for s in first["shards"]]
    assert content_identity("data_prep", shards) != identity
    with pytest.raises(ValueError, match=r"data.path: .*dynamic \(content \w+\) -> .*dynamic \(content \w+\)"):
        run(shards, tmp_path / "run", tiny_overrides, STEPS, "ckpt_path=auto")


def test_a_list_kept_for_the_requeues_accepts_no_later_edit(small_shards, tiny_overrides, tmp_path):
    """Item 7: accept_changes=[optimizer] took lr 0.001 -> 0.05 once; the same list at the next start, with the config
    edited meanwhile, is refused naming each key (on ca8c0b7 it took them with a warning). At their values they pass."""
    run(small_shards, tmp_path, tiny_overrides, 3)
    run(small_shards, tmp_path, tiny_overrides, 4, "ckpt_path=auto", "optimizer.lr=0.05",
        "++resume.accept_changes=[optimizer,trainer.max_steps:4]")
    edited = ("optimizer.lr=0.1", "optimizer.weight_decay=0.5", "optimizer.betas=[0.5,0.6]")
    with pytest.raises(ValueError) as refused:     # the job script's list, one more step asked at its value
        run(small_shards, tmp_path, tiny_overrides, 5, "ckpt_path=auto", *edited,
            "++resume.accept_changes=[optimizer,trainer.max_steps:5]")
    message = str(refused.value)
    for change in ("optimizer.lr: 0.05 -> 0.1", "optimizer.weight_decay: 0.01 -> 0.5",
                   "optimizer.betas: [0.9, 0.999] -> [0.5, 0.6]", "trainer.max_steps: 4 -> 5"):
        assert change in message
    assert ("accept no other: optimizer.betas (by optimizer), optimizer.lr (by optimizer), optimizer.weight_decay "
            "(by optimizer)") in message
    # a list is named without its value: a key of its own, accepting this one change
    assert "resume.accept_changes=[optimizer.betas,optimizer.lr:0.1,optimizer.weight_decay:0.5]" in message
    result = run(small_shards, tmp_path, tiny_overrides, 5, "ckpt_path=auto", *edited,
                 "++resume.accept_changes=[optimizer.betas,optimizer.lr:0.1,optimizer.weight_decay:0.5,"
                 "trainer.max_steps:5]")
    assert result["global_step"] == 5
    record = json.loads((tmp_path / "run_config.json").read_text())
    assert [c["accepted_by"] for c in record["accepted_changes"]] == [
        ["optimizer", "trainer.max_steps:4"],
        ["optimizer.betas", "optimizer.lr:0.1", "optimizer.weight_decay:0.5", "trainer.max_steps:5"]]


def test_devices_auto_on_another_gpu_count_is_refused(small_shards, tiny_overrides, tmp_path, monkeypatch):
    """Item 8: the record keeps the process count `trainer.devices=auto` resolved to. The run trains on the CPU (auto:
    1 process); its resume is checked as on a node where auto finds 2 GPUs (torch's count of them patched: the
    checks run before any device is touched). On ca8c0b7 the checks passed: the record said "auto" both times."""
    run(small_shards, tmp_path, tiny_overrides, STEPS, "trainer.devices=auto")
    assert json.loads((tmp_path / "run_config.json").read_text())["in_effect"]["resolved"]["world_size"] == 1
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = compose("train", tiny_overrides(small_shards, tmp_path, STEPS, "trainer.devices=auto",
                                          "trainer.accelerator=auto", "ckpt_path=auto"))
    with pytest.raises(ValueError, match=r"world_size: 1 processes \(trainer.devices x trainer.num_nodes, as "
                                         r"resolved\) -> 2 processes"):
        PretrainChecks(cfg)


def test_a_package_of_another_version_is_refused(small_shards, tiny_overrides, tmp_path):
    """Item 9: the record keeps the training packages' versions; a resume under another torch is refused naming it
    (the record edited as a run started under torch 2.12.0 would have written it)."""
    run(small_shards, tmp_path, tiny_overrides, STEPS)
    path = tmp_path / "run_config.json"
    record = json.loads(path.read_text())
    now = record["in_effect"]["resolved"]["packages"]["torch"]
    record["in_effect"]["resolved"]["packages"]["torch"] = "2.12.0"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape(f'packages.torch: "2.12.0" -> "{now}"')):
        run(small_shards, tmp_path, tiny_overrides, STEPS, "ckpt_path=auto")
    run(small_shards, tmp_path, tiny_overrides, STEPS, "ckpt_path=auto",
        f"++resume.accept_changes=[packages.torch:{now}]")


def train_process(code: Path, shards: Path, run_dir: Path, tiny_overrides, *extra: str, steps: int = STEPS):
    argv = [sys.executable, "pipeline/train.py",
            *tiny_overrides(shards, run_dir, steps, "export.hf=false", "export.plot=false", *extra)]
    return subprocess.run(argv, cwd=code, env=local_launch_env(PYTHONPATH=str(code)), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_code_change_between_two_starts_is_refused_and_its_new_keys_come_with_it(small_shards, tiny_overrides,
                                                                                   tmp_path):
    """Item 9: a copy of the code trains 4 steps; between that start and the next, a source file changes and the
    config gains a key (as a pull brings them). The resume refuses, naming the code (old and new sources' hashes)
    and the new key as new in it; with resume.accept_changes=[code] it goes on. On ca8c0b7 it trained on without a
    word about the code, and the new key alone failed the start as `(absent) -> 1`."""
    code = tmp_path / "code"
    for package in ("model", "pipeline", "data_prep", "conf"):
        shutil.copytree(REPO_ROOT / package, code / package,
                        ignore=shutil.ignore_patterns("__pycache__", "sample_corpus", "outputs"))
    run_dir = tmp_path / "run"
    first = train_process(code, small_shards, run_dir, tiny_overrides)
    assert first.returncode == 0, first.stderr[-3000:]
    with (code / "pipeline" / "pretraining" / "module.py").open("a") as source:
        source.write("\n# a line a pull brought\n")
    with (code / "conf" / "training" / "train.yaml").open("a") as config:
        config.write("\nnew_knob: 1   # a key the pull added\n")
    refused = train_process(code, small_shards, run_dir, tiny_overrides, "ckpt_path=auto")
    assert refused.returncode != 0
    assert "code: no git commit, sources sha256 " in refused.stderr and "new_knob: (absent) -> 1" in refused.stderr
    assert "The training code changed" in refused.stderr
    accepted = train_process(code, small_shards, run_dir, tiny_overrides, "ckpt_path=auto",
                             f"resume.accept_changes=[code,trainer.max_steps:{STEPS + 1}]", steps=STEPS + 1)
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    changes = json.loads((run_dir / "run_config.json").read_text())["accepted_changes"][-1]["changes"]
    assert sorted(changes) == ["code", "new_knob", "trainer.max_steps"]
