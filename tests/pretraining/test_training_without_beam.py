"""Training reads a local shard set without Apache Beam: the lent GPU machine's image has none, and the device run no
longer carries it (infra/gpu/device_wheels.py). pipeline/train.py runs with every `import apache_beam` refused: it
opens the set through its manifest, hashes every file against it, trains in a loader worker, checkpoints, exports."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.common_fixtures import REPO_ROOT
from tests.helpers.training import tiny_run_overrides

REFUSE_BEAM = 'raise ImportError("apache_beam is hidden from this process")\n'


def hidden_beam_env(tmp_path):
    hidden = tmp_path / "hidden" / "apache_beam"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(REFUSE_BEAM)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden.parent), str(REPO_ROOT)])}


def test_a_run_on_a_local_shard_set_needs_no_beam(small_shards, tmp_path):
    env = hidden_beam_env(tmp_path)
    # the premise: data prep's side, which writes through Beam, is refused in this environment
    writer = subprocess.run([sys.executable, "-c", "import data_prep.manifest_writer"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert writer.returncode != 0 and "apache_beam is hidden" in writer.stderr

    out = tmp_path / "run"
    overrides = [o for o in tiny_run_overrides(small_shards, out, 3) if not o.startswith("data.num_workers=")]
    done = subprocess.run([sys.executable, "pipeline/train.py", *overrides, "data.num_workers=1",
                           "data.verify_checksums=full"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "hashed" in done.stdout + done.stderr          # the manifest's sha256 checked, not skipped
    assert (out / "checkpoints" / "last.ckpt").is_file() and (out / "hf_export" / "model.safetensors").is_file()
