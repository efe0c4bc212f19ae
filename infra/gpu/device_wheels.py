"""The wheels the lent GPU machine lacks, built here for its Python: one folder that a device run carries.

    python infra/gpu/device_wheels.py                       # .device/wheels, for the GPU image's Python 3.12
    python infra/gpu/device_wheels.py --python-version 3.11 --dest <dir>   # the same set for this machine (rehearsal)

The GPU image (infra/gpu/device_image_packages.txt) has torch 2.11, Lightning, numpy, pyarrow, transformers, pyyaml,
psutil, einops, msgpack, ninja, py-cpuinfo, tqdm; it has no DeepSpeed, torchao, Hydra/omegaconf or pytorch-optimizer,
nor what those need beyond the image (found by running the device command in an environment made like the image's:
infra/gpu/device_image.py, tests/infra/test_device_run.py). It reaches no registry, so they travel as wheels and are
installed there with `pip install --no-index --no-deps --target`. torch itself never travels (the image's is the one
its CUDA matches). Nor does Beam (34 MiB with what it needs): only data prep, which runs here, writes through it;
training reads a local shard set's manifest without it (data_prep.manifest).

Where a binary wheel exists for the target Python it is downloaded (`pip download --only-binary=:all:` with the
target's version and manylinux tags); the two that ship only a source archive are built here into
py3-none-any wheels: DeepSpeed with DS_BUILD_OPS=0 (no op prebuilt: it JIT-builds the few it needs, and our DDP
and ZeRO rows need none on a GPU), and antlr4-python3-runtime 4.9.3 (omegaconf 2.3's pin). The folder's
lock (device-wheels.lock: name, version, file, sha256) and total size are written beside the wheels and printed; a
set over CARRY_LIMIT_MIB is refused, since a device run carries at most 64 MiB of ignored paths, shards included.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = REPO_ROOT / ".device" / "wheels"
# The CPU rehearsal's copies (tests/infra/test_device_run.py): the set for the GPU's Python and the same set for this
# machine's, outside the checkout, made once by `--rehearsal` (it needs the index; the tests reach none).
REHEARSAL_CACHE = Path(os.environ.get("DEVICE_WHEELS_CACHE",
                                      Path.home() / ".cache" / "bert-pipeline" / "device-wheels"))
DEVICE_PYTHON = "3.12"
LOCK_NAME = "device-wheels.lock"
# 64 MiB is what a device run carries in all; the shard sets travel beside the wheels (infra/gpu/device_inputs.py).
CARRY_LIMIT_MIB = 48.0

# name, version, how: "binary" (a wheel for the target's tags) or "sdist" (built here into a py3-none-any wheel).
# The versions are pyproject.toml's train extra where it pins them; the others are those this machine's training
# environment runs with, which the CPU tests cover.
WHEELS: tuple[tuple[str, str, str], ...] = (
    ("deepspeed", "0.19.8", "sdist"),
    ("hjson", "3.1.0", "binary"),                  # DeepSpeed's config reader
    ("pydantic", "2.13.4", "binary"),              # DeepSpeed's config models
    ("pydantic-core", "2.46.4", "binary"),         # the one compiled wheel: per Python version
    ("annotated-types", "0.7.0", "binary"),
    ("typing-inspection", "0.4.2", "binary"),
    # 0.18's wheel is cp310-abi3, and it loads its kernels from torch 2.11 on (pyproject.toml's comment)
    ("torchao", "0.18.0", "binary"),
    ("hydra-core", "1.3.8", "binary"),
    ("omegaconf", "2.3.1", "binary"),
    ("antlr4-python3-runtime", "4.9.3", "sdist"),  # omegaconf 2.3 pins 4.9.*, which PyPI has as a source archive only
    ("pytorch-optimizer", "4.1.0", "binary"),
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def download_binary(name: str, version: str, python_version: str, dest: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python_version, "--implementation", "cp", *platforms, "--dest", str(dest),
         f"{name}=={version}"])


def build_from_sdist(name: str, version: str, dest: Path) -> None:
    """pip wheel of the source archive, without build isolation (DeepSpeed's setup.py imports torch: this machine's),
    with no op prebuilt, so the wheel is pure Python and fits any Python 3 and any torch."""
    env = {**os.environ, "DS_BUILD_OPS": "0", "DS_BUILD_AIO": "0", "DS_BUILD_GDS": "0"}
    with tempfile.TemporaryDirectory() as archive:
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary=:all:", "--dest", archive,
             f"{name}=={version}"])
        source = next(Path(archive).iterdir())
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
             str(dest), str(source)], env=env)


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        output = done.stdout[-2000:] + done.stderr[-2000:]
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{output}")


def normalised(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def wheel_file(dest: Path, name: str, version: str) -> Path | None:
    prefix = f"{normalised(name)}-{version}-"
    return next((path for path in sorted(dest.glob("*.whl")) if path.name.lower().startswith(prefix)), None)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(dest: Path, python_version: str) -> dict:
    """Every wheel of WHEELS in dest (kept where already there), then the lock; returns the lock."""
    dest.mkdir(parents=True, exist_ok=True)
    drop_outside_the_set(dest)
    entries = []
    for name, version, how in WHEELS:
        found = wheel_file(dest, name, version)
        if found is None:
            if how == "sdist":
                build_from_sdist(name, version, dest)
            else:
                download_binary(name, version, python_version, dest)
            found = wheel_file(dest, name, version)
            if found is None:
                raise RuntimeError(f"{name} {version}: no wheel in {dest} after its {how} step")
        entries.append({"name": name, "version": version, "how": how, "file": found.name,
                        "bytes": found.stat().st_size, "sha256": sha256(found)})
    strays = sorted({p.name for p in dest.glob("*.whl")} - {e["file"] for e in entries})
    if strays:   # two versions of one package stop the whole install there
        raise RuntimeError(f"{dest} holds wheels outside the set: {', '.join(strays)}; remove them")
    total = sum(e["bytes"] for e in entries)
    lock = {"python_version": python_version, "total_bytes": total, "wheels": entries}
    if total / 2**20 > CARRY_LIMIT_MIB:
        raise RuntimeError(f"the wheels take {total / 2**20:.1f} MiB, over the {CARRY_LIMIT_MIB:.0f} MiB they may take "
                           "of a device run's 64 MiB")
    (dest / LOCK_NAME).write_text(json.dumps(lock, indent=1) + "\n")
    return lock


def drop_outside_the_set(dest: Path) -> None:
    """Remove the wheels that this folder's lock lists (this script made them) and WHEELS no longer names, so a folder
    made for an earlier set (one that carried Beam, say) is brought to this one. A wheel the lock does not list is not
    this script's to remove: build() refuses it instead."""
    lock = dest / LOCK_NAME
    if not lock.is_file():
        return
    wanted = {(normalised(name), version) for name, version, _ in WHEELS}
    for entry in json.loads(lock.read_text())["wheels"]:
        wheel = dest / entry["file"]
        if (normalised(entry["name"]), entry["version"]) not in wanted and wheel.is_file():
            print(f"{entry['name']} {entry['version']}: not in the set any more, {wheel.name} removed", file=sys.stderr)
            wheel.unlink()


def describe(lock: dict) -> str:
    lines = [f"{e['name']} {e['version']} ({e['how']}): {e['file']}, {e['bytes'] / 2**20:.2f} MiB, sha256 "
             f"{e['sha256'][:16]}..." for e in lock["wheels"]]
    return "\n".join([*lines, f"total {lock['total_bytes'] / 2**20:.2f} MiB for Python {lock['python_version']}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"the wheel folder (default {DEFAULT_DEST})")
    parser.add_argument("--python-version", default=DEVICE_PYTHON, help="the target's Python (the GPU image's)")
    parser.add_argument("--rehearsal", action="store_true",
                        help=f"both sets the CPU rehearsal uses, in {REHEARSAL_CACHE}/py<version>: the GPU's Python's "
                             "and this one's")
    args = parser.parse_args(argv)
    targets = ([(REHEARSAL_CACHE / f"py{version}", version) for version in sorted({DEVICE_PYTHON, this_python()})]
               if args.rehearsal else [(args.dest.resolve(), args.python_version)])
    for dest, version in targets:
        lock = build(dest, version)
        print(describe(lock))
        print(f"lock: {dest / LOCK_NAME}")
    return 0


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


if __name__ == "__main__":
    sys.exit(main())
