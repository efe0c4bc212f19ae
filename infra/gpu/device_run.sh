#!/usr/bin/env bash
# One command on a bare GPU machine, from the repository root: the carried wheels installed, then the levers' table.
#
#   bash infra/gpu/device_run.sh                 # on the lent GPU (the device tool: carry=[".device"], timeout_s=600)
#   bash infra/gpu/device_run.sh --cpu           # the CPU rehearsal of the same path (tests/infra/test_device_run.py)
#
# .device/ is made here first by `python infra/gpu/prepare_device_run.py` (wheels for the image's Python 3.12, their
# lock, the shard sets). Any further arguments go to benchmarks/gpu_variants.py (--variant, --rounds, --phase2: the
# row at seq 512 with packing's variants, on the carried shards512).
# What comes back, under $OUT (the device tool's folder; outputs/device_run elsewhere), at most 8 files:
#   device_run.log   this script's own output (the device, the install, each run's start and end)
#   install.log      pip's output
#   rows.log         every run's output, streamed as it runs, the runs one after another
#   gpu_variants.md  the table: each run's line appended as it ends, then the summary and the profiles
# Time: the whole command ends within TOTAL_S (default 570 s, inside the device's 600 s a command): the install is
# measured, gpu_variants gets what is left less MARGIN_S as its budget (it starts no run it expects not to finish, and
# stops a run at the budget), and `timeout` stops it outright at TOTAL_S whatever happens.
set -uo pipefail

STARTED=$(date +%s)
TOTAL_S=${TOTAL_S:-570}
MARGIN_S=${MARGIN_S:-20}          # the summary's writing, and the stop of a run cut at the budget
DEVICE_DIR=${DEVICE_DIR:-.device}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/device_site}
OUT=${OUT:-outputs/device_run}
WORKDIR=${WORKDIR:-/tmp/device_run_work}
mkdir -p "$OUT" "$WORKDIR"
exec > >(tee -a "$OUT/device_run.log") 2>&1

echo "device_run: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname), budget ${TOTAL_S} s; arguments: $*"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# The wheels: the lock's sha256 checked first (a stale or mixed folder stops here, not in a row), then the install
# without an index and without resolving (the image has the rest).
"$PYTHON" - "$DEVICE_DIR/wheels" <<'EOF' || exit 1
import hashlib, json, sys
from pathlib import Path
folder = Path(sys.argv[1])
lock = json.loads((folder / "device-wheels.lock").read_text())
bad = [w["file"] for w in lock["wheels"]
       if not (folder / w["file"]).exists() or hashlib.sha256((folder / w["file"]).read_bytes()).hexdigest() != w["sha256"]]
if bad:
    sys.exit(f"wheels missing or not as locked: {', '.join(bad)}")
print(f"wheels: {len(lock['wheels'])} as locked, {lock['total_bytes'] / 2**20:.2f} MiB, for Python {lock['python_version']}")
EOF
"$PYTHON" -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$DEVICE_DIR"/wheels/*.whl >"$OUT/install.log" 2>&1 || { echo "install failed: see install.log"; tail -5 "$OUT/install.log"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
INSTALLED=$(( $(date +%s) - STARTED ))
echo "installed in ${INSTALLED} s"

LEFT=$(( TOTAL_S - INSTALLED ))
BUDGET=$(( LEFT - MARGIN_S ))
if (( BUDGET <= 0 )); then
    echo "no time left for a run: ${LEFT} s of ${TOTAL_S} s"; exit 1
fi
echo "gpu_variants: budget ${BUDGET} s, stopped outright after ${LEFT} s"
SHARDS_512=""
[[ -d "$DEVICE_DIR/shards512" ]] && SHARDS_512="$DEVICE_DIR/shards512"
timeout --signal=TERM --kill-after=5 "$LEFT" "$PYTHON" benchmarks/gpu_variants.py \
    --shards-128 "$DEVICE_DIR/shards128" --shards-modern "$DEVICE_DIR/shards_modern" \
    ${SHARDS_512:+--shards-512 "$SHARDS_512"} \
    --workdir "$WORKDIR" --out "$OUT" --budget "$BUDGET" "$@"
STATUS=$?
echo "device_run: gpu_variants exit ${STATUS}, $(( $(date +%s) - STARTED )) s in all; table: $OUT/gpu_variants.md"
exit "$STATUS"
