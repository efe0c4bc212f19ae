"""One stage, as its rule's `run:` runs it: its entry point in the run directory of its version (a finished one kept
as it is, an unfinished one continued), from the launch's code snapshot; then its record, `current`, the sentinel."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.cluster import restarts
from pipeline.orchestration import identity, runs
from pipeline.orchestration.launch import code_environment
from pipeline.orchestration.stage_config import entry_argv
from pipeline.orchestration.workflow_config import Stage, ranks_per_node

LOG_NAME = "stage.log"


class StageError(RuntimeError):
    pass


def read_inputs(root: Path, spec: Stage) -> dict[str, dict]:
    inputs = {}
    for role, upstream in spec.inputs.items():
        if (finished := runs.finished_run(root, upstream)) is None:
            raise StageError(f"input {role} of stage {spec.name}: stage {upstream} has not finished (no sentinel "
                             f"{runs.sentinel_path(root, upstream)}, or {root / upstream / runs.CURRENT} holds "
                             "other content)")
        inputs[role] = {"stage": upstream, "run_dir": str(finished[0]), "content": finished[1]["content"]}
    return inputs


def command(spec: Stage, inputs: dict[str, dict], run_dir: Path, on_slurm: bool) -> tuple[list[str], dict]:
    argv = [sys.executable, *entry_argv(spec, {role: Path(i["run_dir"]) for role, i in inputs.items()}, run_dir)]
    if not on_slurm:
        return argv, {}
    r = spec.resources
    # Since SLURM 22.05 srun does not take the job's --cpus-per-task: it is given here, with the GPUs per node
    step = ["srun", "--kill-on-bad-exit=1", f"--nodes={r['nodes']}", f"--ntasks-per-node={ranks_per_node(r)}",
            f"--cpus-per-task={r['cpus_per_task']}", *([f"--gpus-per-node={r['gpus_per_node']}"]
                                                        if r["gpus_per_node"] else [])]
    return [*step, *argv], {"OMP_NUM_THREADS": str(r["cpus_per_task"]), "SRUN_CPUS_PER_TASK": str(r["cpus_per_task"])}


def run_stage(launch: dict, name: str, log: str) -> None:
    """Runs stage `name` of the launch (the Snakemake config); raises StageError when it fails."""
    root, code = Path(launch["workflow"]["root"]), Path(launch["code"])
    spec = Stage.from_dict(launch["stages"][name])
    with open(log, "a", encoding="utf-8") as say:
        inputs = read_inputs(root, spec)
        version = runs.version_name(spec.identity, {role: i["content"] for role, i in inputs.items()}, spec.rerun)
        run_dir = root / spec.name / version
        record = runs.read_json(run_dir / runs.RECORD) or {}
        if record.get("finished"):
            print(f"{spec.name}: {run_dir} already holds this version (same config and input content)", file=say)
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            attempt = {"started": runs.now(), "host": socket.gethostname(), "job_id": os.environ.get("SLURM_JOB_ID"),
                       "pid": os.getpid(), "code": str(code), "code_version": spec.code_version,
                       "packages": identity.package_versions()}
            record = {"stage": spec.name, "entry": spec.entry, "version": version, "identity": spec.identity,
                      "document": spec.document, "inputs": inputs, "code_version": spec.code_version,
                      "packages": attempt["packages"], "attempts": [*record.get("attempts", []), attempt],
                      "finished": None}
            runs.write_json(run_dir / runs.RECORD, record)
            argv, step_env = command(spec, inputs, run_dir, launch["executor"] == "slurm")
            env = code_environment(code, {**os.environ, **spec.env, **step_env})
            log_path = run_dir / LOG_NAME
            print(f"{spec.name}: running in {run_dir} (log: {log_path}), code {code}", file=say, flush=True)
            started = time.perf_counter()
            with open(log_path, "a", encoding="utf-8") as out:
                def note(message: str) -> None:
                    print(f"[{runs.now()}] {message}", file=out, flush=True)    # before the entry point's output
                out.write("\n")
                note(" ".join(argv))
                if spec.entry == "train":     # restarted after a failure, stopped in a crash loop
                    exit_code, attempt["tries"] = restarts.run_with_restarts(
                        argv, run_dir, restarts.max_restarts(env), note, cwd=code, env=env, stdout=out,
                        stderr=subprocess.STDOUT)
                else:
                    exit_code = subprocess.run(argv, cwd=code, env=env, stdout=out,
                                               stderr=subprocess.STDOUT).returncode
            attempt.update(seconds=round(time.perf_counter() - started, 1), exit=exit_code, ended=runs.now())
            if exit_code != 0:
                runs.write_json(run_dir / runs.RECORD, record)
                tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
                print(f"{spec.name}: failed with exit status {exit_code}; log: {log_path}\n{tail}", file=say)
                raise StageError(f"stage {spec.name} failed with exit status {exit_code}; log: {log_path}")
            record.update(finished=attempt["ended"], content=runs.content_identity(spec.entry, run_dir))
            runs.write_json(run_dir / runs.RECORD, record)
        runs.point_current(root / spec.name, run_dir)
        runs.write_json(runs.sentinel_path(root, spec.name), {"content": record["content"]})
