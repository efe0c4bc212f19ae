"""One stage, as its rule runs it (the Snakefile's `run:`, locally or inside the stage's SLURM job):

1. Its inputs: each upstream stage's content identity (its sentinel) and run directory (`current`, which must hold
   that content).
2. Its run directory (runs.py): <root>/<stage>/<version>, the version a hash of the stage's identity and its inputs'
   content. A finished run of that version is used as it is (an upstream stage ran again and made the same content:
   nothing to redo); an unfinished one is continued (pre-training resumes from its newest complete checkpoint,
   ckpt_path=auto); any other version is left alone.
3. Runs the entry point from the launch's code snapshot, with its output appended to <run dir>/stage.log. In a SLURM
   job the processes are a job step of their own (srun, one per task, with the stage's CPUs per task and
   OMP_NUM_THREADS to match); only they get the time-limit signal, Snakemake's own processes beside them do not.
   A pre-training whose try fails after writing a new checkpoint runs again from it, up to MAX_RESTARTS times (the
   stage's environment, `workflow.env`; default 3), and one that fails before its first new checkpoint stops there
   (pipeline/core/restarts.py, as in infra/slurm/train.sbatch); each try is in the run's record.
4. Records the run (code version, package versions, each attempt), points <root>/<stage>/current at it, and writes
   the sentinel last.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO, Callable

from pipeline.core import restarts
from pipeline.orchestration import identity, runs
from pipeline.orchestration.spec import Stage, ranks_per_node
from pipeline.orchestration.stages import entry_argv

LOG_NAME = "stage.log"


class StageError(RuntimeError):
    pass


def read_inputs(root: Path, spec: Stage) -> dict[str, dict]:
    inputs = {}
    for role, upstream in spec.inputs.items():
        sentinel = runs.read_json(runs.sentinel_path(root, upstream))
        run_dir = (root / upstream / runs.CURRENT).resolve()
        if sentinel is None or (runs.read_json(run_dir / runs.RECORD) or {}).get("content") != sentinel["content"]:
            raise StageError(f"input {role} of stage {spec.name}: stage {upstream} has not finished (no sentinel "
                             f"{runs.sentinel_path(root, upstream)}, or {root / upstream / runs.CURRENT} holds "
                             "other content)")
        inputs[role] = {"stage": upstream, "run_dir": str(run_dir), "content": sentinel["content"]}
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


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _noting_to(log: BinaryIO) -> Callable[[str], None]:
    def note(message: str) -> None:
        log.write(f"[{runs.now()}] {message}\n".encode())
        log.flush()
    return note


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
            env = {**os.environ, **spec.env, **step_env,
                   "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
            log_path = run_dir / LOG_NAME
            print(f"{spec.name}: running in {run_dir} (log: {log_path}), code {code}", file=say, flush=True)
            started = time.perf_counter()
            with open(log_path, "ab") as out:
                out.write(f"\n[{runs.now()}] {' '.join(argv)}\n".encode())
                out.flush()
                if spec.entry == "train":     # restarted after a failure, stopped in a crash loop
                    exit_code, attempt["tries"] = restarts.run_with_restarts(
                        argv, run_dir, restarts.max_restarts(env), _noting_to(out), cwd=code, env=env, stdout=out,
                        stderr=subprocess.STDOUT)
                else:
                    exit_code = subprocess.run(argv, cwd=code, env=env, stdout=out,
                                               stderr=subprocess.STDOUT).returncode
            attempt.update(seconds=round(time.perf_counter() - started, 1), exit=exit_code, ended=runs.now())
            if exit_code != 0:
                runs.write_json(run_dir / runs.RECORD, record)
                print(f"{spec.name}: failed with exit status {exit_code}; log: {log_path}\n{tail(log_path)}", file=say)
                raise StageError(f"stage {spec.name} failed with exit status {exit_code}; log: {log_path}")
            record.update(finished=attempt["ended"], content=runs.content_identity(spec.entry, run_dir))
            runs.write_json(run_dir / runs.RECORD, record)
        runs.point_current(root / spec.name, run_dir)
        runs.write_json(runs.sentinel_path(root, spec.name), {"content": record["content"]})
