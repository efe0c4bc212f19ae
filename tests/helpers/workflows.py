"""Running the workflow as a user does: `python pipeline/workflow.py +workflow=tiny ...` in a subprocess, from a copy
of this checkout (so that a test can edit a YAML file of it, as a user edits theirs), with few threads."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGES = ["prep_phase1", "prep_phase2", "pretrain_phase1", "pretrain_phase2", "export", "finetune_sst2"]


def copy_checkout(destination: Path) -> Path:
    """The repository's files (tracked, or new and not ignored) but tests/, benchmarks/ and studies/ (about 6 MB)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        if name.split("/", 1)[0] in ("tests", "benchmarks", "studies") or not (REPO_ROOT / name).is_file():
            continue
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, destination / name)
    return destination


def workflow_env(repo: Path, extra: dict | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "WANDB_"))}
    return {**env, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "WANDB_MODE": "disabled",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo), **(extra or {})}


class Workflow:
    """The tiny workflow in `root`, run from checkout `repo`; with root=None as the README writes it
    (`python pipeline/workflow.py +workflow=tiny`, its default root outputs/workflows/tiny) in directory `cwd`,
    which is the checkout unless given (then the program is named by its path in the checkout)."""

    def __init__(self, repo: Path, root: Path | None, env: dict | None = None, cwd: Path | None = None):
        self.repo, self.cwd, self.extra_env = repo, cwd or repo, env or {}
        self.args = [f"workflow.root={root}"] if root else []
        self.root = root or self.cwd / "outputs" / "workflows" / "tiny"

    def command(self, *extra: str) -> list[str]:
        program = "pipeline/workflow.py" if self.cwd == self.repo else str(self.repo / "pipeline" / "workflow.py")
        return [sys.executable, program, "+workflow=tiny", *self.args, *extra]

    def run(self, *extra: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(*extra), cwd=self.cwd, env=workflow_env(self.repo, self.extra_env),
                                capture_output=True, text=True, timeout=timeout)
        print(result.stdout[-6000:], result.stderr[-6000:])
        return result

    def start(self, *extra: str, log: Path) -> subprocess.Popen:
        """In the background, in a process group of its own (as a terminal runs it), output to `log` (a pipe that
        nobody reads would block it). With Ctrl-C's default action, as a terminal gives it: a test run that was
        itself started in the background of a script inherits SIGINT ignored, and so would the workflow."""
        with open(log, "wb") as handle:
            return subprocess.Popen(self.command(*extra), cwd=self.cwd, env=workflow_env(self.repo, self.extra_env),
                                    stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def plan(self, *extra: str) -> dict[str, str]:
        """stage -> 'run: <reasons>' or 'skip: ...' from workflow.action=plan (and 'sbatch <stage>': its options)."""
        result = self.run("workflow.action=plan", *extra)
        assert result.returncode == 0, result.stdout + result.stderr
        lines, stage = {}, None
        for line in result.stdout.splitlines()[1:-1]:
            name, _, rest = line.strip().partition("  ")
            if name.startswith("sbatch "):
                lines[f"sbatch {stage}"] = name.removeprefix("sbatch ") + "  " + rest
            else:
                stage, lines[name] = name, rest.strip()
        return lines

    def status(self, *extra: str) -> dict[str, str]:
        result = self.run("workflow.action=status", *extra)
        assert result.returncode == 0, result.stdout + result.stderr
        return {line.split()[0]: line.split(None, 1)[1] for line in result.stdout.splitlines()
                if line.startswith("  ") and line.split()[0] in (*STAGES,)}


def phase1_stage_on_shards(tmp_path: Path, shards: Path, phase1_overrides: str, sitecustomize: str,
                           monkeypatch) -> tuple[Path, dict]:
    """The tiny workflow launched in tmp_path/wf with prep_phase1 recorded as finished on `shards` (a real phase-1
    set standing in for its output), and `sitecustomize` on the PYTHONPATH of the processes the stage starts (where a
    test hooks the real training's fit). Returns the workflow root and its launch, for run_stage(launch,
    "pretrain_phase1", ...)."""
    from pipeline.orchestration import runs
    from pipeline.orchestration.launch import write_launch
    from pipeline.orchestration.stage_config import stage_specs
    from pipeline.orchestration.workflow_config import Stage, load_workflow

    root = tmp_path / "wf"
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={root}", phase1_overrides])
    launch = runs.read_json(write_launch(workflow, stage_specs(workflow, check_shapes=False), REPO_ROOT))
    prep = Stage.from_dict(launch["stages"]["prep_phase1"])
    prep_dir = root / "prep_phase1" / runs.version_name(prep.identity, {})
    shutil.copytree(shards, prep_dir)
    runs.write_json(prep_dir / runs.RECORD, {"identity": prep.identity, "finished": runs.now(), "content": "shards"})
    runs.point_current(root / "prep_phase1", prep_dir)
    runs.write_json(runs.sentinel_path(root, "prep_phase1"), {"content": "shards"})
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return root, launch
