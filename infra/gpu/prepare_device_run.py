"""Everything a device run carries, made here: the wheels the GPU image lacks, and the shard sets.

    python infra/gpu/prepare_device_run.py           # .device/: wheels/, shards128/, shards_modern/, shards512/

Then, with the device tool: run(command="bash infra/gpu/device_run.sh", carry=[".device"], timeout_s=600), or
"bash infra/gpu/device_run.sh --phase2" for the phase-2 row, on the same carry. The shard sets are gpu_check's and
gpu_variants' GPU sets (the bundled sample at seq 128, 2 copies; the sample as ModernBERT's MLM rows of 1,024 tokens;
the sample at seq 512, 2 copies, for `gpu_variants.py --phase2`), made by data_prep as those scripts would make them
there. What travels, the working tree (tracked files and untracked ones git does not ignore) with this folder, must stay
within the device's 64 MiB: this prints both sizes and refuses more, naming the working tree's largest files (a run
refused for size there costs the lease's minutes). Until the wheels stopped carrying Beam (34 MiB of them), the three
sets did not fit together and --phase2 made a carry of its own.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO_ROOT / "benchmarks")]

from device_wheels import LOCK_NAME, build, describe  # noqa: E402

TRAVEL_LIMIT_MIB = 64.0   # the working tree and what a run carries, together (the device tool's limit)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def working_tree_files() -> dict[str, int]:
    """What travels of the checkout itself: tracked files and untracked ones git does not ignore, with their sizes."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return {name: (REPO_ROOT / name).stat().st_size for name in listed if name and (REPO_ROOT / name).is_file()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=REPO_ROOT / ".device", help="the carried folder (.device)")
    parser.add_argument("--python-version", default="3.12", help="the GPU image's Python")
    args = parser.parse_args(argv)
    dest = args.dest.resolve()
    lock = build(dest / "wheels", args.python_version)
    # The record of what travels, committed beside this script (the wheels built here from source archives,
    # DeepSpeed's and antlr4's, get a new sha256 at each build: the lock in .device/wheels is the one the run checks).
    (HERE / f"device-wheels.py{args.python_version}.lock").write_text((dest / "wheels" / LOCK_NAME).read_text())
    print(describe(lock), f"lock: {dest / 'wheels' / LOCK_NAME}", sep="\n")
    from gpu_variants import own_modern_shards, own_phase2_shards, own_shards  # data_prep (Beam) runs here

    for make in (own_shards, own_modern_shards, own_phase2_shards):
        made = make(dest, cpu=False)
        print(f"{made.name}: {folder_bytes(made) / 2**20:.2f} MiB")
    carried = folder_bytes(dest) / 2**20
    tree = working_tree_files()
    total = carried + sum(tree.values()) / 2**20
    print(f"{dest}: {carried:.2f} MiB; the working tree: {sum(tree.values()) / 2**20:.2f} MiB; together {total:.2f} "
          f"MiB of the {TRAVEL_LIMIT_MIB:.0f} a device run takes")
    if total > TRAVEL_LIMIT_MIB:
        largest = sorted(tree.items(), key=lambda item: -item[1])[:5]
        print(f"too large: {total:.2f} MiB > {TRAVEL_LIMIT_MIB:.0f} MiB; the working tree's largest files: "
              + ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in largest), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
