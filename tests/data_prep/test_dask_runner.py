"""The job on Beam's Dask runner: a LocalCluster and SLURM workers (dask-jobqueue) started and stopped by the job,
and a cluster the user runs; byte-identical shards and the same counts as the DirectRunner's."""
import subprocess
import sys

import apache_beam as beam
import pytest

from data_prep.dask_cluster import DASK_RUNNER
from data_prep.pipeline import build_pipeline
from data_prep.plan import make_plan
from data_prep.presets import REPO_ROOT
from data_prep.run import load_config, run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def job_args(corpus, out, *extra):
    return [
        f"inputs=[{{path: '{corpus}/sentences', format: sentences}}, {{path: '{corpus}/records.jsonl'}}]",
        f"output_dir={out}", "preset=phase1", "num_shards=3", "dupe_factor=2", *extra,
    ]


@pytest.fixture(scope="module")
def direct_manifest(corpus, tmp_path_factory):
    return run(job_args(corpus, tmp_path_factory.mktemp("direct") / "out") + IN_PROCESS)


def assert_same_output(manifest, reference):
    assert [s["parquet"]["sha256"] for s in manifest["shards"]] == [s["parquet"]["sha256"] for s in reference["shards"]]
    assert manifest["totals"] == reference["totals"] and manifest["totals"]["instances"] > 0
    assert manifest["skipped"] == reference["skipped"] and manifest["repaired"] == reference["repaired"]
    assert manifest["parameters"] == reference["parameters"]   # the runner settings shape no data


def test_graph_has_no_multi_output_pardo_and_no_side_input(corpus, tmp_path):
    """What the Dask runner cannot run (see data_prep/pipeline.py): every consumer of any output of a multi-output
    ParDo gets all its outputs, and a side input re-runs its whole upstream graph inside a task."""
    pipeline = beam.Pipeline()
    build_pipeline(pipeline, make_plan(load_config(job_args(corpus, tmp_path / "out")))[0])
    offenders = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if len(node.outputs) > 1 or node.side_inputs:
                offenders.append(node.full_label)

    pipeline.visit(Visitor())
    assert offenders == []


@pytest.mark.slow   # ~15 s: two worker processes start, import Beam, and run the job
def test_local_cluster_started_by_the_job_writes_the_direct_runners_shards(corpus, tmp_path, direct_manifest):
    manifest = run(job_args(corpus, tmp_path / "out", "dask.cluster=local", "dask.workers=2"))
    assert_same_output(manifest, direct_manifest)
    assert manifest["beam_counters"] == {}   # the DaskRunner collects no metrics; the manifest has the counts


@pytest.mark.slow
def test_a_running_dask_cluster_given_by_beam_options_writes_the_direct_runners_shards(corpus, tmp_path,
                                                                                       direct_manifest):
    from distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        manifest = run(job_args(corpus, tmp_path / "out", f"--runner={DASK_RUNNER}",
                                f"--dask_client_address={cluster.scheduler_address}"))
        assert len(cluster.scheduler_info["workers"]) == 2   # still up: the job leaves a cluster it did not start
    assert_same_output(manifest, direct_manifest)


@pytest.mark.slow   # ~20 s: SLURM starts, then two SLURM jobs start Dask workers
def test_slurm_workers_started_by_the_job_write_the_direct_runners_shards(corpus, tmp_path, direct_manifest,
                                                                          slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])   # dask-jobqueue's sbatch and scancel
    logs = tmp_path / "dask-logs"
    manifest = run(job_args(corpus, tmp_path / "out", "dask.cluster=slurm", "dask.workers=2",
                            "dask.slurm.partition=debug", "dask.slurm.cores=1", "dask.slurm.memory=900MB",
                            "dask.slurm.walltime=00:10:00", f"dask.slurm.log_directory={logs}",
                            "dask.slurm.startup_timeout_s=180"))
    assert_same_output(manifest, direct_manifest)
    # The scheduler has no workers but these: one SLURM job each, whose output files SLURM wrote.
    job_logs = {p.stem for p in logs.glob("data_prep-dask-*.err")}
    assert len(job_logs) == 2, sorted(p.name for p in logs.iterdir())
    # the workers' jobs end with the job's cluster
    slurm_cluster._wait(lambda: "data_prep-dask" not in slurm_cluster.run("squeue", "-h", "-o", "%j").stdout, 60,
                        "the SLURM worker jobs outlived the data-prep job")


def run_cli(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "data_prep" / "run.py"), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (["dask.cluster=yarn"], "dask.cluster must be one of none, local, slurm"),
    (["dask.workers=0"], "dask.workers must be >= 1"),
    (["+dask.slurm.gpus=1"], "unknown option(s) ['dask.slurm.gpus']"),
    (["dask.cluster=local", "--runner=DataflowRunner"], "runs on Beam's DaskRunner, but --runner=DataflowRunner"),
    (["dask.cluster=local", f"--runner={DASK_RUNNER}", "--dask_client_address=h:1"], "starts its own cluster"),
])
def test_bad_dask_settings_fail_before_anything_starts(args, message, tmp_path):
    result = run_cli(*args, f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert not (tmp_path / "out").exists()
