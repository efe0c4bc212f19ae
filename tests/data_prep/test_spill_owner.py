"""data_prep.spill_owner: the spill goes with a job that has ended, never under one that may still run."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from data_prep.run import run
from data_prep.spill import spill_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
# Beam's portable runner with its job service in this process: pipeline.run() returns while the job runs, as on
# Dataflow, and the job's state can be asked after the wait is interrupted (the DirectRunner's run() blocks).
EMBEDDED_JOB_SERVICE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]


def owner_record(out: Path) -> dict:
    return json.loads((out / "_spill" / "owner.json").read_text())


def _recorded_job_id(out: Path) -> str | None:
    try:
        return owner_record(out).get("job_id")
    except (OSError, ValueError):   # not written yet
        return None


def job_args(corpus, out) -> list[str]:
    return [f"inputs=[{corpus}/records.jsonl]", f"output_dir={out}", "preset=phase1", "num_shards=2", "dupe_factor=1"]


@pytest.fixture
def python_ctrl_c():
    """Ctrl-C as a user's command gets it, Python's KeyboardInterrupt, whatever handler an earlier test left in this
    process (pytest-xdist runs many test files in one process; the workflow controller's handlers are for its own)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_leaves_a_running_jobs_spill_and_a_second_run_refuses(corpus, tmp_path, monkeypatch, caplog,
                                                                      python_ctrl_c):
    """Ctrl-C while the launcher waits stops the waiting, not the job: the job (RUNNING) keeps its spill, the log
    says where it is and how to remove it, a second run of the output refuses, and the job finishes its shards."""
    caplog.set_level(logging.WARNING)
    out = tmp_path / "out"
    reached, release = threading.Event(), threading.Event()
    from data_prep import pipeline
    write_shard = pipeline.write_shard

    def held_writer(*args, **kwargs):   # the job's first shard writer: the user presses Ctrl-C meanwhile
        if not reached.is_set():
            reached.set()
            # ... once the launcher waits: pipeline.run() has returned and the job's id is recorded (on a loaded
            # machine this writer can start before run() returns)
            deadline = time.monotonic() + 60
            while not _recorded_job_id(out) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
        release.wait(60)
        return write_shard(*args, **kwargs)

    monkeypatch.setattr(pipeline, "write_shard", held_writer)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(job_args(corpus, out) + EMBEDDED_JOB_SERVICE)
        spill = out / "_spill"
        assert spill.is_dir() and any(p.suffix == ".docs" for p in spill.iterdir()), "the running job's spill went"
        owner = owner_record(out)
        assert owner["runner"] == "PortableRunner" and owner["job_id"] and owner["pid"] == os.getpid(), owner
        assert f"the spill {spill_dir(str(out))} stays" in caplog.text and "--remove" in caplog.text, caplog.text
        with pytest.raises(ValueError, match=f"job {owner['job_id']} on PortableRunner.*still runs"):
            run(job_args(corpus, out) + EMBEDDED_JOB_SERVICE)
        assert owner_record(out) == owner, "the refused run changed the spill"
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (out / "manifest.json").exists(), "the job did not finish with its spill kept"


def test_a_killed_launchers_spill_is_removed_and_reported_by_the_next_run(corpus, tmp_path, caplog):
    """A launcher killed while its job (DirectRunner, inside it) runs leaves a spill; the next run of the same output
    finds the launcher gone, removes the spill and says so."""
    caplog.set_level(logging.WARNING)
    out = tmp_path / "out"
    owner_file = out / "_spill" / "owner.json"
    launcher = subprocess.Popen([sys.executable, "-m", "data_prep.run", *job_args(corpus, out), *IN_PROCESS],
                                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not owner_file.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher.kill()
    launcher.wait()
    assert owner_file.exists(), f"no owner recorded in the spill while the job ran (exit {launcher.returncode})"
    owner = owner_record(out)
    assert (owner["runner"], owner["pid"], owner["in_launcher"]) == ("DirectRunner", launcher.pid, True), owner

    manifest = run(job_args(corpus, out) + IN_PROCESS)
    assert manifest["totals"]["instances"] > 0
    assert "removed the spill of an earlier run" in caplog.text and f"process {launcher.pid}" in caplog.text
    assert not os.path.exists(spill_dir(str(out)))


# The first attempt records itself as a launcher whose job runs (as data_prep.run does before its pipeline starts)
# and keeps running; the requeued attempt is the workflow's retry of the stage: the real launcher, same output.
SLURM_STAGE = """#!/bin/bash
cd {repo} && export PYTHONPATH={repo}
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
    {python} -c "import sys; from apache_beam.options.pipeline_options import PipelineOptions as O
from data_prep.spill_owner import owner_of_this_launcher, write_owner
write_owner(sys.argv[1], owner_of_this_launcher(O([])))" {out}
    sleep 600
else
    {python} -m data_prep.run {args}
fi
"""


def test_a_requeued_slurm_stage_on_another_node_removes_its_first_attempts_spill(corpus, tmp_path, slurm_cluster,
                                                                                 monkeypatch):
    """A launcher in a SLURM job on another node cannot be seen by its pid: while its job attempt runs, a run of the
    output refuses; once SLURM has requeued the job (the attempt's processes ended), the retry removes the spill,
    says so, and makes the shards."""
    from data_prep.spill_owner import check_leftover_spill
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])   # scontrol, from this process
    out = tmp_path / "out"
    script = tmp_path / "stage.sh"
    script.write_text(SLURM_STAGE.format(repo=REPO_ROOT, python=sys.executable, out=out,
                                         args=" ".join(f"'{a}'" for a in job_args(corpus, out) + IN_PROCESS)))
    job = slurm_cluster.run("sbatch", "--parsable", "--requeue", f"--output={tmp_path}/stage-%j.out", str(script),
                            check=True).stdout.strip()
    deadline = time.monotonic() + 120
    while not (out / "_spill" / "owner.json").exists():
        assert time.monotonic() < deadline, "the first attempt recorded no owner in the spill"
        time.sleep(0.5)
    record = owner_record(out)
    assert record["slurm_job"] == job and record["slurm_restarts"] == 0, record
    record["host"] = "another-node"   # as a launcher on another node of the cluster leaves it
    (out / "_spill" / "owner.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"runs on another-node in SLURM job {job}"):
        check_leftover_spill(str(out))

    slurm_cluster.run("scontrol", "requeue", job, check=True)
    deadline = time.monotonic() + 120
    while slurm_cluster.job_field(job, "Restarts") != "1" or slurm_cluster.job_field(job, "JobState") != "PENDING":
        assert time.monotonic() < deadline, f"job {job} not requeued"
        time.sleep(1)
    slurm_cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=True)
    assert slurm_cluster.wait_for_job(job) == "COMPLETED", (tmp_path / f"stage-{job}.out").read_text()[-3000:]
    log = (tmp_path / f"stage-{job}.out").read_text()
    assert "removed the spill of an earlier run" in log and f"SLURM job {job}, which has ended or been requeued" in log
    assert (out / "manifest.json").exists() and not (out / "_spill").exists()
