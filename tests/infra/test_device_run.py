"""The one device command (infra/gpu/device_run.sh) rehearsed on the CPU, wheels included (issue 48, item 3): the set
infra/gpu/device_wheels.py builds, installed with --no-index into an environment made like the GPU image's
(infra/gpu/device_image.py), then gpu_variants in --cpu mode at tiny sizes with a small budget.

The wheels come from the rehearsal cache that `python infra/gpu/device_wheels.py --rehearsal` fills (it needs the
package index; these tests reach none): without it they skip, saying so."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.gpu.device_image import install_wheels, make_venv
from infra.gpu.device_wheels import CARRY_LIMIT_MIB, DEVICE_PYTHON, LOCK_NAME, REHEARSAL_CACHE, WHEELS, sha256
from tests.helpers.common_fixtures import REPO_ROOT

THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
CARRIED = {name for name, _, _ in WHEELS}


def cached_wheels(version: str) -> Path:
    folder = REHEARSAL_CACHE / f"py{version}"
    lock = folder / LOCK_NAME
    if not lock.exists():
        pytest.skip(f"no device wheels for Python {version} in {folder}: run `python infra/gpu/device_wheels.py "
                    "--rehearsal` first (it needs the package index)")
    listed = {(w["name"], w["version"]) for w in json.loads(lock.read_text())["wheels"]}
    if listed != {(name, version) for name, version, _ in WHEELS}:
        pytest.skip(f"the wheels in {folder} are not device_wheels.WHEELS' set: rerun `python "
                    "infra/gpu/device_wheels.py --rehearsal`")
    return folder


@pytest.fixture(scope="module")
def device_env(tmp_path_factory):
    """A venv like the GPU image, and the rehearsal's wheels for this Python, not installed yet."""
    wheels = cached_wheels(THIS_PYTHON)
    root = tmp_path_factory.mktemp("device")
    return make_venv(root / "venv", CARRIED), wheels, root


def run_in(python: Path, code: str, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site) if site else "", str(REPO_ROOT)])),
           "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    return subprocess.run([str(python), "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=300)


def test_the_lock_records_every_wheel_of_the_set_within_the_carry_limit():
    for version in sorted({DEVICE_PYTHON, THIS_PYTHON}):
        folder = cached_wheels(version)
        lock = json.loads((folder / LOCK_NAME).read_text())
        assert lock["python_version"] == version
        assert [w["name"] for w in lock["wheels"]] == [name for name, _, _ in WHEELS]
        for wheel in lock["wheels"]:
            assert sha256(folder / wheel["file"]) == wheel["sha256"], wheel["file"]
        assert lock["total_bytes"] == sum(w["bytes"] for w in lock["wheels"]) < CARRY_LIMIT_MIB * 2**20
        assert not any(w["name"] == "torch" for w in lock["wheels"])   # the image's torch is the one its CUDA fits


def test_the_image_like_venv_lacks_what_the_gpu_lacks_until_the_wheels_go_in(device_env):
    python, wheels, root = device_env
    before = run_in(python, "import torch, pytorch_lightning, numpy, pyarrow\n"
                            "for name in ('deepspeed', 'torchao', 'hydra', 'omegaconf', 'apache_beam', 'wandb'):\n"
                            "    try:\n        __import__(name)\n"
                            "    except ImportError:\n        print('absent', name)")
    assert before.returncode == 0, before.stderr[-2000:]
    assert before.stdout.split() == ["absent", "deepspeed", "absent", "torchao", "absent", "hydra", "absent",
                                     "omegaconf", "absent", "apache_beam", "absent", "wandb"]
    site = root / "site"
    install_wheels(python, wheels, site)
    after = run_in(python, "import deepspeed, torchao, hydra, omegaconf, pytorch_optimizer\n"
                           "import pipeline.pretraining.run, pipeline.core.app, data_prep.manifest\n"
                           "print(deepspeed.__file__)", site)
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout.strip().endswith(str(site / "deepspeed" / "__init__.py"))


def python_3_12() -> str | None:
    """A python3.12 that runs (pyenv's shim is on PATH without one selected; its versions folder has one)."""
    for candidate in [shutil.which("python3.12"), *sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))]:
        if candidate and subprocess.run([str(candidate), "--version"], capture_output=True).returncode == 0:
            return str(candidate)
    return None


@pytest.mark.skipif(python_3_12() is None, reason="no python3.12 on this machine (the GPU image's)")
def test_the_gpu_set_installs_without_an_index_under_python_3_12(tmp_path):
    """The device's own set, for its Python: pip takes every wheel's tags under 3.12, and the compiled one
    (pydantic-core) and what needs no torch import there, beside this machine's copies of the image's pure-Python
    packages. torch is not on PyPI for the CPU: the imports that need it are the rehearsal's, under this machine's
    Python."""
    wheels = cached_wheels(DEVICE_PYTHON)
    python = make_venv(tmp_path / "venv", CARRIED, python=python_3_12())
    install_wheels(python, wheels, tmp_path / "site")
    done = run_in(python, "import sys; assert sys.version_info[:2] == (3, 12)\n"
                          "import pydantic_core\n"
                          "import hydra, omegaconf, antlr4, pydantic, hjson\n"
                          "print('ok')", tmp_path / "site")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.fixture(scope="module")
def device_dir(device_env, tmp_path_factory):
    """What the command carries, at the rehearsal's sizes: the wheels, and gpu_variants' CPU shard sets."""
    _, wheels, _ = device_env
    folder = tmp_path_factory.mktemp("dot_device")
    (folder / "wheels").symlink_to(wheels)
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from gpu_variants import own_modern_shards, own_shards

    own_shards(folder, cpu=True)
    own_modern_shards(folder, cpu=True)
    return folder


def device_run(device_env, device_dir, out: Path, total_s: int, *args: str, **popen) -> subprocess.Popen:
    python, _, root = device_env
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(TOTAL_S=str(total_s), DEVICE_DIR=str(device_dir), PYTHON=str(python), SITE=str(out / "site"),
               OUT=str(out / "out"), WORKDIR=str(out / "work"), OMP_NUM_THREADS="1")
    return subprocess.Popen(["bash", "infra/gpu/device_run.sh", "--cpu", *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


@pytest.mark.slow
def test_the_device_command_runs_cheapest_first_and_skips_what_its_budget_cannot_finish(device_env, device_dir,
                                                                                        tmp_path):
    # "all" is expected to take a tenth of its GPU figure on the CPU, whatever its overrides here, so it runs last
    # (adamw's tenth is less); a run needs at least 30 s left (gpu_check's floor): of a 45 s budget, the two cheap rows
    # leave it less
    adamw = "optimizer=adamw,optimizer.lr=1e-4"
    process = device_run(device_env, device_dir, tmp_path, 120, "--budget", "45", "--variant", f"all={adamw}",
                         "--variant", f"adamw={adamw}")
    output, _ = process.communicate(timeout=300)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["device_run.log", "gpu_variants.md", "install.log", "rows.log"]
    assert "wheels: " in output and "as locked" in output and "installed in" in output, output[-3000:]
    table = (out / "gpu_variants.md").read_text()
    assert "first round's order: baseline, adamw, all" in table
    runs = [line.split("|") for line in table.split("Summary")[0].splitlines() if line.startswith("| ")][1:]
    assert [cells[1].strip() for cells in runs] == ["baseline", "adamw", "all"][:len(runs)]
    assert runs[0][-2].strip() == "done", table
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from gpu_variants import EXPECTED_S

    expected = f"expected {EXPECTED_S['all'][0] / 10:.0f} s"
    assert runs[-1][1].strip() == "all" and expected in runs[-1][-2] and "not started" in runs[-1][-2], runs[-1]
    assert process.returncode == 1   # a run left out is a run not measured
    log = (out / "rows.log").read_text()
    assert log.count("===== pretrain-128-ddp") == sum(cells[-2].strip() == "done" for cells in runs)


@pytest.mark.slow
def test_a_killed_command_leaves_every_finished_run_in_the_table_and_its_log(device_env, device_dir, tmp_path):
    process = device_run(device_env, device_dir, tmp_path, 300, "--variant", "adamw=optimizer=adamw,optimizer.lr=1e-4",
                         start_new_session=True)
    table = tmp_path / "out" / "gpu_variants.md"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (table.exists() and "| done |" in table.read_text()):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)   # as the device does at its limit: no chance to write anything more
    process.communicate(timeout=30)
    text = table.read_text()
    assert "| baseline | 1 |" in text and "| done |" in text and "Summary" not in text
    assert "===== pretrain-128-ddp" in (tmp_path / "out" / "rows.log").read_text()
