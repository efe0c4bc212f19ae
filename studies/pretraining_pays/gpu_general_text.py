"""Item 4 of the study: general text at GPU scale. BERT-mini pre-trained for a few minutes of one GPU on the general
corpus, and its random twin, fine-tuned on the full SST-2, STS-B and CoLA training sets; beside them Turc et al.'s
published scores of fully pre-trained compact BERTs.

On the CPU, once, beforehand (the study's general corpus, a fixed prefix of its training side, and the three GLUE task
folders into outputs/gpu_general/, an ignored folder; prints the total size, which must fit the device's 64 MiB carry):

    python studies/pretraining_pays/gpu_general_text.py --prepare --shared-data ../shared/data

which builds the second protocol's corpora if outputs/evidence/corpora/general/ lacks them (as bench_evidence.py
corpora does), copies SST-2/, STS-B/ and CoLA/ from <shared data>/downstream/glue/ and the BERT uncased vocabulary,
then runs:

    python data_prep/run.py \
        "inputs=[{path: 'outputs/evidence/corpora/general/train/part-0[0-4].jsonl', format: jsonl}]" \
        output_dir=outputs/gpu_general/shards/train preset=phase1 objective=mlm masking=dynamic max_seq_length=128 \
        max_predictions_per_seq=20 dupe_factor=1 vocab.file=outputs/gpu_general/vocab.txt \
        --runner=DirectRunner --direct_running_mode=multi_processing --direct_num_workers=2

The prefix is GENERAL_PARTS of the 8 training files (documents are dealt round-robin, so each holds about an eighth of
the 34.6 M words): data_prep on a 0.66 M-word slice of the same sources wrote 2.34 bytes of shards per word, so the
whole training side (~81 MB) would not fit 64 MiB; five files (~21.6 M words) come to ~51 MB, ~57 MB with GLUE.

On the device (one H100; under 8 minutes in all, the fine-tuning guarded by --budget-minutes):

    python studies/pretraining_pays/gpu_general_text.py --shards outputs/gpu_general/shards/train \
        --glue outputs/gpu_general/glue --out $OUT --minutes 4

What it runs, with the protocol's settings (the constants below):
1. Pre-training through pipeline/pretraining/run.py's train(): first a calibration run (a warm-up window, then a timed
   window of the same steps) measures steps/s; --minutes of that speed is the step count of the real run. bf16 mixed
   precision on a GPU, fp32 on the CPU. Exported to Hugging Face format as every study pre-training is (export.hf).
2. The random twin: the export's config and tokenizer at BERT's initialisation, torch seed 1 (study_tasks).
3. Fine-tuning (study_tasks.run_finetune, the study's settings at lr 1e-4), seeds 1-3 seed-major: for each seed every
   task, for each task both arms. A (task, seed) pair starts only if the elapsed time plus its two cells' expected
   time (the slowest finished cell of the task, else EXPECTED_CELL_S) stays within --budget-minutes; otherwise the run
   stops there and results.json lists the cells not run. The guard reads times only, never results.
4. --out gets results.json (rewritten after every cell), table.md and the pre-training's CSV log; run directories
   and the two exports go to --work (default outputs/gpu_general/work), so that $OUT stays small.

--rehearse: the same code path on the CPU for CI: BERT-tiny, the fine-tuning sets cut to their first REHEARSAL_ROWS
training and scored rows, seed 1 only (studies/pretraining_pays/study_tests/test_gpu_general_text.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks_common import REPO_ROOT, checkout_env, metrics_rows
from study_corpora import BEAM_ARGS
from study_data import HEADERS, SUFFIX, SplitFiles, file_rows
from study_tasks import random_export, run_finetune

# Pre-training (the protocol's)
MODEL, REHEARSAL_MODEL = "mini", "tiny"
SEQ = 128
BATCH = 256
PEAK_LR = 1e-3
WEIGHT_DECAY = 0.01
WARMUP_FRACTION = 0.1
PRETRAIN_SEED = 1
RANDOM_TWIN_SEED = 1
# Calibration: a first window of steps warms up (CUDA context, kernels, loader workers), the second is timed.
CALIBRATION_WINDOW, REHEARSAL_CALIBRATION_WINDOW = 50, 2
LOADER_WORKERS = {"gpu": 6, "cpu": 0}   # dynamic masking runs in the loader: at ~10^4 sequences/s one worker stalls

# Fine-tuning (the protocol's)
TASKS = ("sst2", "stsb", "cola")
SEEDS = (1, 2, 3)
FINETUNE_LR = 1e-4
EPOCHS = {"sst2": 2, "stsb": 4, "cola": 4}
METRIC = {"sst2": "acc", "stsb": "pearson", "cola": "mcc"}
GLUE_FILES = {"sst2": ("SST-2/train.tsv", "SST-2/dev.tsv"), "stsb": ("STS-B/sts-train.csv", "STS-B/sts-dev.csv"),
              "cola": ("CoLA/in_domain_train.tsv", "CoLA/in_domain_dev.tsv")}
SCORED_SET = {"sst2": "SST-2 dev (872)", "stsb": "STS-B sts-dev", "cola": "CoLA in_domain_dev"}
REHEARSAL_ROWS = 64
# A cell's expected seconds until one of its task has finished: a guess for BERT-mini on one H100, not measured
# (SST-2 4,210 steps and 67k rows to tokenize, STS-B 720 steps, CoLA 1,070), later replaced by the slowest measured.
EXPECTED_CELL_S = {"sst2": 60, "stsb": 20, "cola": 25}
ARMS = ("pretrained", "random")

# Turc et al. (2019), "Well-Read Students Learn Better", GLUE *test* scores of the released compact BERTs (x100; STS-B
# Pearson/Spearman, CoLA Matthews): google-research/bert README.md, "New March 11th, 2020: Smaller BERT Models"
# (commit eedf5716ce1268e56f0a50264a88cafad334ac61, lines 28-30). Fully pre-trained, then the best of 5 batch sizes x
# 4 rates, 4 epochs.
TURC_TEST = {
    "BERT-Tiny": {"sst2": "83.2", "stsb": "74.3/73.6", "cola": "0.0"},
    "BERT-Mini": {"sst2": "85.9", "stsb": "75.4/73.3", "cola": "0.0"},
    "BERT-Small": {"sst2": "89.7", "stsb": "78.8/77.0", "cola": "27.8"},
}

# --prepare
GENERAL_PARTS = 5
PREPARED = Path("outputs/gpu_general")
CORPORA_OUT = Path("outputs/evidence")   # the second protocol's corpora (decontaminated)
CARRY_LIMIT_BYTES = 64 * 2**20


# ------------------------------------------------------------------------------------------------ pre-training

def _device() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def pretrain_overrides(shards: Path, run_dir: Path, model: str, steps: int, log_every: int, export: bool) -> list[str]:
    parameters = json.loads((shards / "manifest.json").read_text())["parameters"]
    vocab = len((shards / "vocab.txt").read_text(encoding="utf-8").splitlines())
    device = ["trainer=gpu", "trainer.devices=1", "trainer.num_nodes=1", "trainer.precision=bf16-mixed"] \
        if _device() == "gpu" else ["trainer=cpu", "trainer.precision=32-true"]
    return [f"model={model}", f"model.vocab_size={vocab}", "model.compile=false", f"data.path={shards}",
            f"data.max_seq_length={SEQ}", f"data.max_predictions_per_seq={parameters['max_predictions_per_seq']}",
            f"data.global_batch_size={BATCH}", f"data.micro_batch_size={BATCH}",
            f"data.num_workers={LOADER_WORKERS[_device()]}", "optimizer=adamw", f"optimizer.lr={PEAK_LR}",
            f"optimizer.weight_decay={WEIGHT_DECAY}", "scheduler=linear_warmup", "scheduler.warmup_steps=null",
            f"scheduler.warmup_fraction={WARMUP_FRACTION}", "scheduler.power=1.0", "scheduler.total_steps=null",
            f"seed={PRETRAIN_SEED}", "validation.path=null", "logger=csv", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "callbacks.checkpoint.every_n_train_steps=0",
            "callbacks.checkpoint.save_last=false", f"export.hf={str(export).lower()}", "export.plot=false",
            f"trainer.max_steps={steps}", f"trainer.log_every_n_steps={log_every}", f"output_dir={run_dir}", *device]


def _train(overrides: list[str]) -> dict:
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    return train(compose("train", overrides))


def calibrate(shards: Path, run_dir: Path, model: str, window: int) -> float:
    """Optimizer steps per second over the second of two windows of `window` steps (the first warms up)."""
    _train(pretrain_overrides(shards, run_dir, model, 2 * window, window, export=False))
    rates = [float(row["perf/sequences_per_s"]) for row in metrics_rows(run_dir) if row.get("perf/sequences_per_s")]
    return rates[-1] / BATCH


def pretrain(shards: Path, work: Path, minutes: float, rehearse: bool) -> dict:
    model = REHEARSAL_MODEL if rehearse else MODEL
    steps_per_s = calibrate(shards, work / "calibration", model,
                            REHEARSAL_CALIBRATION_WINDOW if rehearse else CALIBRATION_WINDOW)
    steps = max(1, int(minutes * 60 * steps_per_s))
    print(f"calibration: {steps_per_s:.2f} steps/s -> {steps} steps in {minutes} minutes", flush=True)
    started = time.monotonic()
    result = _train(pretrain_overrides(shards, work / "pretrain", model, steps, min(50, steps), export=True))
    metrics = result["metrics"]
    return {"model": model, "steps": result["global_step"], "calibrated_steps_per_s": round(steps_per_s, 3),
            "minutes_asked": minutes, "seconds": round(time.monotonic() - started, 1),
            "final_train_mlm_loss": metrics.get("train/mlm_loss"), "final_train_mlm_acc": metrics.get("train/mlm_acc"),
            "batch": BATCH, "peak_lr": PEAK_LR, "warmup_fraction": WARMUP_FRACTION, "weight_decay": WEIGHT_DECAY,
            "seq": SEQ, "objective": "mlm", "masking": "dynamic", "seed": PRETRAIN_SEED, "shards": str(shards),
            "export": result["hf_export"], "log": result["csv"]}


# ------------------------------------------------------------------------------------------------ fine-tuning

def task_files(glue: Path, task: str, work: Path, rehearse: bool) -> SplitFiles:
    """The task's full training file and its scored file; rehearsing, copies of their first REHEARSAL_ROWS rows."""
    paths = [glue / name for name in GLUE_FILES[task]]
    rows = [file_rows(path, HEADERS[task]) for path in paths]
    if rehearse:
        header = [HEADERS[task]] if HEADERS[task] else []
        rows = [side[:REHEARSAL_ROWS] for side in rows]
        paths = [work / "glue" / task / f"{side}{SUFFIX[task]}" for side in ("train", "eval")]
        for path, side in zip(paths, rows):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join([*header, *side]) + "\n", encoding="utf-8")
    name = SCORED_SET[task] + (f", its first {REHEARSAL_ROWS} rows" if rehearse else "")
    return SplitFiles(task, paths[0], paths[1], len(rows[0]), len(rows[1]), name)


def expected_seconds(cells: list[dict], task: str) -> float:
    done = [cell["seconds"] for cell in cells if cell["task"] == task]
    return max(done) if done else EXPECTED_CELL_S[task]


def finetune_all(inits: dict[str, Path], files: dict[str, SplitFiles], work: Path, seeds: tuple[int, ...],
                 budget_s: float, started: float, record: Record) -> None:
    """Every cell, seed-major, each pair of arms behind the budget guard; `record()` after every cell."""
    extra = ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"] if _device() == "gpu" else []
    cells, not_run = record.results["cells"], record.results["not_run"]
    pairs = [(seed, task) for seed in seeds for task in TASKS]
    for index, (seed, task) in enumerate(pairs):
        expected = len(ARMS) * expected_seconds(cells, task)
        elapsed = time.monotonic() - started
        if elapsed + expected > budget_s:
            not_run.extend({"arm": arm, "task": t, "seed": s} for s, t in pairs[index:] for arm in ARMS)
            record.results["stopped"] = (f"before {task} seed {seed}: {elapsed:.0f} s elapsed + {expected:.0f} s "
                                         f"expected > the budget's {budget_s:.0f} s")
            print(f"budget: {record.results['stopped']}; {len(not_run)} cells not run", flush=True)
            break
        for arm in ARMS:
            made = run_finetune(files[task], inits[arm], FINETUNE_LR, EPOCHS[task], seed,
                                work / "finetune" / f"{arm}-{task}-seed{seed}", work / "finetune" / "cache", extra)
            value = made["metrics"][METRIC[task]]
            cells.append({"arm": arm, "task": task, "seed": seed, "metric": METRIC[task], "value": value,
                          "seconds": made["seconds"], "epochs": made["epochs"], "lr": made["lr"],
                          "global_step": made["global_step"], "train_rows": made["train_rows"],
                          "eval_rows": made["eval_rows"], "eval_set": made["eval_set"]})
            print(f"{arm} {task} seed {seed}: {METRIC[task]} {value:.4f} ({made['seconds']} s)", flush=True)
            record()


# ------------------------------------------------------------------------------------------------ the record

class Record:
    """results.json and table.md in --out, rewritten whole after every step (a run cut short keeps what it made)."""

    def __init__(self, out: Path, results: dict, started: float):
        self.out, self.results, self.started = out, results, started
        out.mkdir(parents=True, exist_ok=True)

    def __call__(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.started, 1)
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1), encoding="utf-8")
        (self.out / "table.md").write_text(table(self.results), encoding="utf-8")


def table(results: dict) -> str:
    """Per task: the means over the seeds where both arms finished, the paired differences, Turc et al.'s scores."""
    cells = results["cells"]
    pre = results.get("pretraining") or {}
    lines = [f"# General text at GPU scale: {pre.get('model', '?')} pre-trained {pre.get('steps', '?')} steps against "
             f"its random twin ({results['device']}, {results['date']})", "",
             "Ours: dev-set scores x100, mean over the seeds where both arms finished. Turc et al. (2019): GLUE "
             "**test-set** scores x100 of fully pre-trained compact BERTs (google-research/bert README; STS-B "
             "Pearson/Spearman), the best of a fine-tuning grid: another split and another pre-training budget, "
             "shown for scale only.", "",
             "| task (dev metric) | seeds | pre-trained | random | pre-trained - random, per seed | mean difference | "
             "Turc et al. BERT-Mini (test) | BERT-Tiny (test) | BERT-Small (test) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task in TASKS:
        value = {(c["arm"], c["seed"]): 100 * c["value"] for c in cells if c["task"] == task}
        seeds = sorted(s for s in {seed for _, seed in value} if all((arm, s) in value for arm in ARMS))
        turc = [TURC_TEST[size][task] for size in ("BERT-Mini", "BERT-Tiny", "BERT-Small")]
        if seeds:
            diffs = [value["pretrained", s] - value["random", s] for s in seeds]
            means = [statistics.fmean(value[arm, s] for s in seeds) for arm in ARMS]
            shown = [f"{means[0]:.1f}", f"{means[1]:.1f}", ", ".join(f"{d:+.1f}" for d in diffs),
                     f"{statistics.fmean(diffs):+.1f}"]
        else:
            shown = ["not run"] * 4
        lines.append(f"| {task} ({METRIC[task]}) | {', '.join(map(str, seeds)) or '-'} | " + " | ".join(shown + turc)
                     + " |")
    if results["not_run"]:
        lines += ["", f"Not run (budget): {len(results['not_run'])} cells; {results.get('stopped', '')}"]
    return "\n".join(lines) + "\n"


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    work = args.work or REPO_ROOT / PREPARED / "work"   # not in --out: two exports of ~45 MB
    seeds = SEEDS[:1] if args.rehearse else SEEDS
    for stale in ("calibration", "pretrain", "random_twin", "finetune", "glue"):   # one-shot: a run starts afresh
        shutil.rmtree(work / stale, ignore_errors=True)
    record = Record(args.out, {
        "command": " ".join(["python", *sys.argv]), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_name(), "rehearsal": args.rehearse, "budget_minutes": args.budget_minutes,
        "finetuning": {"lr": FINETUNE_LR, "epochs": EPOCHS, "seeds": list(seeds), "batch": 32, "seq": SEQ,
                       "weight_decay": 0.01, "warmup_fraction": 0.1, "dropout": 0.1},
        "pretraining": None, "random_twin": None, "cells": [], "not_run": []}, started)
    record.results["pretraining"] = pretrain(args.shards, work, args.minutes, args.rehearse)
    shutil.copy(record.results["pretraining"]["log"], args.out / "pretrain_metrics.csv")   # the curve, kept small
    export = Path(record.results["pretraining"]["export"])
    twin = random_export(export, RANDOM_TWIN_SEED, work / "random_twin")
    record.results["random_twin"] = {"torch_seed": RANDOM_TWIN_SEED, "export": str(twin), "like": str(export)}
    record()
    files = {task: task_files(args.glue, task, work, args.rehearse) for task in TASKS}
    finetune_all({"pretrained": export, "random": twin}, files, work, seeds, 60 * args.budget_minutes, started, record)
    record()
    return record.results


# ------------------------------------------------------------------------------------------------ --prepare

def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare(shared_data: Path, target: Path = PREPARED) -> int:
    """The device's inputs under `target`; returns their size in bytes (exits non-zero over the carry limit)."""
    from study_corpora import build_corpora
    from study_decontamination import SecondCheck

    general = REPO_ROOT / CORPORA_OUT / "corpora" / "general"
    if not (general / "DONE").exists():
        build_corpora(shared_data, REPO_ROOT / CORPORA_OUT, check=SecondCheck)   # as bench_evidence.py corpora
    target = REPO_ROOT / target
    for task in TASKS:
        folder = Path(GLUE_FILES[task][0]).parent
        shutil.copytree(shared_data / "downstream" / "glue" / folder, target / "glue" / folder, dirs_exist_ok=True)
    shutil.copy(shared_data / "vocab" / "bert-base-uncased-vocab.txt", target / "vocab.txt")
    shards = target / "shards" / "train"
    if not (shards / "manifest.json").exists():
        inputs = f"{os.path.relpath(general, REPO_ROOT)}/train/part-0[0-{GENERAL_PARTS - 1}].jsonl"
        command = [sys.executable, "data_prep/run.py", f"inputs=[{{path: '{inputs}', format: jsonl}}]",
                   f"output_dir={shards}", "preset=phase1", "objective=mlm", "masking=dynamic",
                   f"max_seq_length={SEQ}", "max_predictions_per_seq=20", "dupe_factor=1",
                   f"vocab.file={target / 'vocab.txt'}", *BEAM_ARGS]
        print(" ".join(command), flush=True)
        subprocess.run(command, cwd=REPO_ROOT, env=checkout_env(RAYON_NUM_THREADS="1"), check=True)
    total = _size(target)
    print(f"{target}: shards {_size(shards) / 2**20:.1f} MiB, GLUE {_size(target / 'glue') / 2**20:.1f} MiB, "
          f"total {total / 2**20:.1f} MiB (carry limit {CARRY_LIMIT_BYTES / 2**20:.0f} MiB)", flush=True)
    if total > CARRY_LIMIT_BYTES:
        sys.exit(f"{target} is over the carry limit: lower GENERAL_PARTS ({GENERAL_PARTS}) and prepare again")
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", action="store_true", help="make outputs/gpu_general/ on the CPU, then stop")
    parser.add_argument("--shared-data", type=Path, help="--prepare: the shared data folder")
    parser.add_argument("--shards", type=Path, help="the general corpus's training shard set (manifest.json)")
    parser.add_argument("--glue", type=Path, help="a folder with SST-2/, STS-B/ and CoLA/ as distributed")
    parser.add_argument("--out", type=Path, help="results.json and table.md go here")
    parser.add_argument("--work", type=Path, help=f"run directories (default {PREPARED}/work)")
    parser.add_argument("--minutes", type=float, default=4.0, help="pre-training minutes of this device")
    parser.add_argument("--budget-minutes", type=float, default=8.0, help="wall-clock budget of the whole run")
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal: tiny model, 64 rows, one seed")
    args = parser.parse_args(argv)
    if args.prepare:
        if args.shared_data is None:
            parser.error("--prepare needs --shared-data")
        prepare(args.shared_data)
        return
    missing = [flag for flag in ("shards", "glue", "out") if getattr(args, flag) is None]
    if missing:
        parser.error("needs " + ", ".join(f"--{flag}" for flag in missing))
    if not (args.shards / "manifest.json").is_file():
        parser.error(f"{args.shards} is not a shard set (no manifest.json)")
    import datasets

    datasets.disable_progress_bars()
    results = run(args)
    print((args.out / "table.md").read_text(encoding="utf-8"), flush=True)
    if not all(math.isfinite(cell["value"]) for cell in results["cells"]):
        print("warning: a metric is not finite (constant predictions)", flush=True)


if __name__ == "__main__":
    main()
