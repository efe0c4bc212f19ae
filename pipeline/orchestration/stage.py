"""One stage, as its rule runs it (locally, or inside the stage's SLURM job):

    python -m pipeline.orchestration.stage <launch spec> <stage>

1. Its inputs: the run directory and content identity each upstream stage's sentinel names.
2. Its run directory (runs.py): <root>/<stage>/<version>, the version a hash of the stage's identity and its inputs'
   content. A finished run of that version is used as it is (an upstream stage ran again and made the same
   content: nothing to redo); an unfinished one is continued (pre-training resumes from its newest complete
   checkpoint, ckpt_path=auto); any other version is left alone.
3. Refuses when the stage's config or code changed since the launch (a queued job must run what was planned).
4. Runs the entry point with its output appended to <run dir>/stage.log; ranks under `srun` in a SLURM job of
   several processes. Ctrl-C or SIGTERM stop the entry point and fail the stage.
5. Writes the run's record, points <root>/<stage>/current at it, and writes the sentinel last.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import identity, runs
from pipeline.orchestration.spec import workflow_from_dict
from pipeline.orchestration.stages import StageSpec, compose_stage, entry_argv

LOG_NAME = "stage.log"


class StageError(RuntimeError):
    pass


def read_inputs(root: Path, spec: StageSpec) -> dict[str, dict]:
    inputs = {}
    for role, upstream in spec.inputs.items():
        sentinel = runs.read_json(runs.sentinel_path(root, upstream))
        if sentinel is None:
            raise StageError(f"input {role} of stage {spec.name}: stage {upstream} has no sentinel "
                             f"({runs.sentinel_path(root, upstream)}); it has not finished")
        inputs[role] = {"stage": upstream, "run_dir": sentinel["run_dir"], "content": sentinel["content"]}
    return inputs


def check_identity_unchanged(launch: dict, spec: StageSpec) -> None:
    """The stage's config and code now must be what the launch planned: a job can wait in the queue for days."""
    workflow = workflow_from_dict(launch["workflow"])
    stage = next(s for s in workflow.stages if s.name == spec.name)
    cfg = compose_stage(workflow, stage)
    from omegaconf import OmegaConf
    document = identity.identity_document(spec.entry, OmegaConf.to_container(cfg, resolve=True) if cfg else {})
    if identity.identity_hash(document) != spec.identity:
        changed = identity.changed_keys(spec.document, document)
        raise StageError(f"stage {spec.name} changed since this workflow was launched ({', '.join(changed)}): "
                         "launch it again to run the new version")


def command(spec: StageSpec, inputs: dict[str, dict], run_dir: Path) -> list[str]:
    argv = [sys.executable, *entry_argv(spec, {role: Path(i["run_dir"]) for role, i in inputs.items()}, run_dir)]
    resources = spec.resources
    ranks = resources["nodes"] * (resources.get("tasks_per_node") or max(1, resources["gpus_per_node"]))
    if ranks > 1 and os.environ.get("SLURM_JOB_ID"):
        # one process per task on every node, as infra/slurm/train.sbatch starts them; Lightning reads the ranks
        # from SLURM
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={resources['nodes']}",
                f"--ntasks-per-node={ranks // resources['nodes']}", *argv]
    return argv


def run_entry(argv: list[str], env: dict[str, str], log_path: Path) -> int:
    with open(log_path, "ab") as log:
        log.write(f"\n[{runs.now()}] {' '.join(argv)}\n".encode())
        log.flush()
        child = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stopped: list[int] = []

        def forward(signum, _frame):
            stopped.append(signum)
            if child.poll() is None:
                child.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    return code if not stopped or code else 128 + stopped[0]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def run_stage(spec_path: Path, stage_name: str) -> int:
    launch = runs.read_json(spec_path)
    if launch is None:
        raise StageError(f"launch spec {spec_path} not found")
    root = Path(launch["root"])
    spec = StageSpec.from_dict(launch["stages"][stage_name])
    inputs = read_inputs(root, spec)
    version = runs.version_name(spec.identity, {role: i["content"] for role, i in inputs.items()})
    stage_dir = root / spec.name
    run_dir = stage_dir / version
    record = runs.read_json(run_dir / runs.RECORD) or {}
    job = os.environ.get("SLURM_JOB_ID")

    if record.get("finished"):
        print(f"{spec.name}: {run_dir} already holds this version (same config, code and input content)", flush=True)
    else:
        check_identity_unchanged(launch, spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        attempt = {"started": runs.now(), "host": socket.gethostname(), "job_id": job, "pid": os.getpid()}
        record = {"stage": spec.name, "entry": spec.entry, "version": version, "identity": spec.identity,
                  "document": spec.document, "inputs": inputs, "attempts": [*record.get("attempts", []), attempt],
                  "finished": None}
        runs.write_json(run_dir / runs.RECORD, record)
        argv = command(spec, inputs, run_dir)
        env = {**os.environ, **spec.env,
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        log_path = run_dir / LOG_NAME
        print(f"{spec.name}: running in {run_dir} (log: {log_path})", flush=True)
        started = time.perf_counter()
        code = run_entry(argv, env, log_path)
        attempt.update(seconds=round(time.perf_counter() - started, 1), exit=code, ended=runs.now())
        if code != 0:
            runs.write_json(run_dir / runs.RECORD, record)
            print(f"{spec.name}: failed with exit status {code}; log: {log_path}\n{tail(log_path)}", file=sys.stderr,
                  flush=True)
            return code or 1
        record["finished"] = attempt["ended"]
        record["content"] = runs.content_identity(spec.entry, run_dir)
        runs.write_json(run_dir / runs.RECORD, record)
    runs.point_current(stage_dir, run_dir)
    runs.write_json(runs.sentinel_path(root, spec.name), {
        "stage": spec.name, "run_dir": str(run_dir), "identity": spec.identity, "content": record["content"]})
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        return run_stage(Path(argv[0]), argv[1])
    except StageError as error:
        print(f"stage {argv[1]}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
