"""The accounting the SLURM tests count jobs with (tests/helpers/slurm.py's `accounted_jobs`) keeps the jobs of the
day before. Without --starttime, sacct lists only the jobs since 00:00 today. The CI of 595df99 started the tiny
workflow at 23:57 and counted its stage jobs after midnight, so its two data-prep jobs were missing from the count.
Here sacct runs as if a day later (faketime), on the real local SLURM."""
from __future__ import annotations

import shutil

import pytest


def _listed(cluster, job: str) -> bool:
    return job in [row["JobID"] for row in cluster.accounted_jobs()]


def test_a_job_of_the_day_before_is_still_counted(slurm_cluster, monkeypatch):
    if shutil.which("faketime") is None:
        pytest.skip("faketime not installed (.ci/run installs it: apt-get install -y faketime)")
    job = slurm_cluster.run("sbatch", "--parsable", "-A", slurm_cluster.account, "-J", "day_before", "-o", "/dev/null",
                            "--wrap", "true", check=True).stdout.strip()
    assert slurm_cluster.wait_for_job(job) == "COMPLETED", slurm_cluster.logs()
    # slurmdbd lists a finished job a few seconds after slurmctld ends it
    slurm_cluster._wait(lambda: _listed(slurm_cluster, job), 60, f"job {job} never reached the accounting")

    run_today = slurm_cluster.run
    tomorrow = lambda *cmd, check=False: run_today("faketime", "+1 day", *cmd, check=check)  # noqa: E731
    plain = tomorrow("sacct", "-X", "-n", "-P", "-a", "-o", "JobID", check=True).stdout.split()
    assert job not in plain            # what sacct's default window does a day later: the premise of this test

    monkeypatch.setattr(slurm_cluster, "run", tomorrow)
    assert _listed(slurm_cluster, job)
