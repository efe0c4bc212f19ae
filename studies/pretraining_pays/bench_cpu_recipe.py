"""The search for `+experiment=cpu_hour`: what reaches the highest held-out MLM accuracy in an hour of a 2-core CPU.

    python studies/pretraining_pays/bench_cpu_recipe.py calibrate --shared-data ../shared/data  # steps/min of each try
    python studies/pretraining_pays/bench_cpu_recipe.py search --minutes 10 TRY [TRY ...]        # the same budget each
    python studies/pretraining_pays/bench_cpu_recipe.py report                                   # figure + table

Budgets are in minutes of a quiet 2-thread machine, turned into optimizer steps with the try's own throughput
measured by `calibrate` (the fastest 5-step window of 60 steps, the first 10 left out: other work on the machine
only slows windows down), once per shape (model, vocabulary, sequence, batch, optimizer; the learning rate does
not change the speed): a try then trains the same number of steps however loaded the machine is while it runs, and
tries of different speed get the same time. Each
try is `python pipeline/train.py` with its overrides, validated on the held-out shards (recipe_corpus.py:
one book and a fifth of the Wikipedia articles that no try trains on) at ten points of its budget. Every try keeps
the paper's two objectives (MLM and NSP), AdamW's or LAMB's parameter groups, and a linear warm-up then decay to 0
at the end of its own budget.

A caveat the report repeats: tries with another vocabulary predict other pieces (a smaller vocabulary has shorter,
more frequent pieces), so their MLM accuracies are not on the same scale as the original vocabulary's; the report
compares vocabularies on a measure that does not depend on them too (the SST-2 probe of bench_cpu_hour_curve.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks_common import REPO_ROOT, add_shared_data_flag, metrics_rows, shared_path, train_process
from recipe_corpus import shard_sets

OUT = REPO_ROOT / "outputs" / "bench_cpu_recipe"
THREADS = 2
CALIBRATION_STEPS, CALIBRATION_SKIP, CALIBRATION_WINDOW = 60, 10, 5
VALIDATIONS_PER_TRY = 10
LONG_TRY_MINUTES = 30         # tries this long keep a checkpoint every quarter (bench_cpu_hour_curve.py)
VALIDATION_BATCHES = 32       # of 32 sequences: ~1,000 held-out sequences, ~15,000 masked tokens at seq 128

# name -> (sequence length, vocabulary, overrides of pipeline/train.py). The names say what differs.
TRIES: dict[str, tuple[int, str, list[str]]] = {
    "tiny_v30k_s128_b32_adamw1e-3": (128, "original", ["model=tiny", "optimizer.lr=1e-3"]),
    "tiny_v30k_s128_b32_adamw2e-3": (128, "original", ["model=tiny", "optimizer.lr=2e-3"]),
    "mini_v30k_s128_b32_adamw3e-4": (128, "original", ["model=mini", "optimizer.lr=3e-4"]),
    "mini_v30k_s128_b32_adamw6e-4": (128, "original", ["model=mini", "optimizer.lr=6e-4"]),
    "mini_v30k_s128_b32_adamw1e-3": (128, "original", ["model=mini", "optimizer.lr=1e-3"]),
    "mini_v30k_s128_b32_adamw2e-3": (128, "original", ["model=mini", "optimizer.lr=2e-3"]),
    "mini_v16k_s128_b32_adamw1e-3": (128, "16000", ["model=mini", "model.vocab_size=16000", "optimizer.lr=1e-3"]),
    "mini_v8k_s128_b32_adamw1e-3": (128, "8000", ["model=mini", "model.vocab_size=8000", "optimizer.lr=1e-3"]),
    "mini_v30k_s64_b64_adamw1e-3": (64, "original", ["model=mini", "optimizer.lr=1e-3", "data.global_batch_size=64",
                                                     "data.micro_batch_size=64"]),
    "mini_v30k_s128_b128_lamb6e-3": (128, "original", ["model=mini", "optimizer=lamb", "optimizer.lr=6e-3",
                                                       "data.global_batch_size=128", "data.micro_batch_size=128"]),
    "small_v30k_s128_b32_adamw6e-4": (128, "original", ["model=small", "optimizer.lr=6e-4"]),
}


def shape_of(name: str) -> str:
    """The part of a try's name that sets its speed: everything but the learning rate."""
    model, vocab, seq, batch, optimizer = name.split("_")[:5]
    return "_".join([model, vocab, seq, batch, optimizer.rstrip("0123456789.e-")])


def _global_batch(overrides: list[str]) -> int:
    for item in overrides:
        if item.startswith("data.global_batch_size="):
            return int(item.split("=", 1)[1])
    return 32


def _train(run_dir: Path, overrides: list[str], threads: int = THREADS) -> None:
    train_process(run_dir, [*overrides, "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
                            "export.hf=false"], threads)


def _data_overrides(shared_data: Path, seq: int, vocab: str) -> list[str]:
    train, heldout = shard_sets(shared_data, OUT.parent / "recipe_corpus", seq, vocab)
    predictions = json.loads((train / "manifest.json").read_text())["parameters"]["max_predictions_per_seq"]
    return [f"data.path={train}", f"validation.path={heldout}", f"data.max_seq_length={seq}",
            f"data.max_predictions_per_seq={predictions}", "data.verify_checksums=false"]


def calibrate(args: argparse.Namespace, names: list[str]) -> None:
    """Optimizer steps per minute of each shape, 2 threads, validation off."""
    path = OUT / "calibration.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    shapes = {shape_of(name): name for name in names}
    for shape, name in shapes.items():
        seq, vocab, overrides = TRIES[name]
        run_dir = OUT / "calibration" / shape
        load_before = os.getloadavg()[0]
        _train(run_dir, [*overrides, *_data_overrides(args.shared_data, seq, vocab), "validation.path=null",
                         f"trainer.max_steps={CALIBRATION_STEPS}", "scheduler.warmup_steps=2",
                         f"trainer.log_every_n_steps={CALIBRATION_WINDOW}",
                         "callbacks.checkpoint.every_n_train_steps=0",
                         "callbacks.checkpoint.save_last=false", "export.plot=false"])
        rates = [float(r["perf/sequences_per_s"]) for r in metrics_rows(run_dir)
                 if r.get("perf/sequences_per_s") and int(r["step"]) >= CALIBRATION_SKIP]
        steps_per_minute = 60 * max(rates) / _global_batch(overrides)
        result[shape] = {"steps_per_minute": steps_per_minute, "load_before": load_before,
                         "windows": len(rates), "measured": time.strftime("%Y-%m-%d %H:%M")}
        print(f"{shape:<30} {steps_per_minute:8.1f} steps/min  (load average before: {load_before:.2f})", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))


def search(args: argparse.Namespace, names: list[str]) -> None:
    calibration = json.loads((OUT / "calibration.json").read_text())
    for name in names:
        seq, vocab, overrides = TRIES[name]
        minutes = args.minutes[0]
        # A multiple of 20 steps: ten validations, and (long tries) a checkpoint every quarter, the last at the end.
        steps = 20 * max(1, round(minutes * calibration[shape_of(name)]["steps_per_minute"] / 20))
        every = steps // VALIDATIONS_PER_TRY
        checkpoints = steps // 4 if minutes >= LONG_TRY_MINUTES else 0
        run_dir = OUT / f"{minutes:g}min" / name
        if (run_dir / "DONE").exists():
            print(f"{name}: done already ({run_dir})")
            continue
        started = time.monotonic()
        _train(run_dir, [*overrides, *_data_overrides(args.shared_data, seq, vocab), f"trainer.max_steps={steps}",
                         "scheduler.warmup_steps=null", "scheduler.warmup_fraction=0.06",
                         f"validation.every_n_steps={every}", f"validation.max_batches={VALIDATION_BATCHES}",
                         f"trainer.log_every_n_steps={min(every, 50)}",
                         f"callbacks.checkpoint.every_n_train_steps={checkpoints}"], threads=args.threads)
        (run_dir / "DONE").write_text(json.dumps({"steps": steps, "wall_s": time.monotonic() - started}))
        final = [r for r in metrics_rows(run_dir) if r.get("val/mlm_acc")][-1]
        print(f"{name}: {steps} steps, held-out MLM acc {float(final['val/mlm_acc']):.4f}, "
              f"NSP acc {float(final['val/nsp_acc']):.4f} ({(time.monotonic() - started) / 60:.1f} min wall)",
              flush=True)


def curves(minutes: float) -> dict[str, list[tuple[float, float, float]]]:
    """try -> [(minutes, held-out MLM accuracy, held-out NSP accuracy)] of every finished try of that budget."""
    calibration = json.loads((OUT / "calibration.json").read_text())
    result = {}
    for run_dir in sorted((OUT / f"{minutes:g}min").glob("*/DONE")):
        name = run_dir.parent.name
        per_minute = calibration[shape_of(name)]["steps_per_minute"]
        result[name] = [((int(r["step"]) + 1) / per_minute, float(r["val/mlm_acc"]), float(r["val/nsp_acc"]))
                        for r in metrics_rows(run_dir.parent) if r.get("val/mlm_acc")]
    return result


def report(budgets: list[float]) -> None:
    """One figure of every try's held-out MLM accuracy against minutes, and a table of where each ended."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calibration = json.loads((OUT / "calibration.json").read_text())
    fig, ax = plt.subplots(figsize=(11, 6.5), constrained_layout=True)
    lines = ["| try | budget | steps | steps/min (quiet, 2 threads) | held-out MLM acc | held-out NSP acc |",
             "|---|---|---|---|---|---|"]
    for minutes in budgets:
        for name, points in curves(minutes).items():
            if not points:
                continue
            xs, mlm, _ = zip(*points)
            style = "-" if minutes == max(budgets) else "--"
            ax.plot(xs, mlm, style, marker="o", markersize=3, label=f"{name} ({minutes:g} min)")
            steps = json.loads((OUT / f"{minutes:g}min" / name / "DONE").read_text())["steps"]
            lines.append(f"| {name} | {minutes:g} min | {steps:,} | "
                         f"{calibration[shape_of(name)]['steps_per_minute']:.1f} "
                         f"| {points[-1][1]:.4f} | {points[-1][2]:.4f} |")
    ax.set_xlabel("minutes of a quiet 2-core CPU (optimizer steps / the try's measured steps per minute)")
    ax.set_ylabel("held-out MLM accuracy")
    ax.set_title("CPU recipe search: held-out MLM accuracy (one book and a fifth of the Wikipedia articles, never "
                 "trained on)\nvocabularies other than v30k predict other pieces: compare their accuracy within a "
                 "vocabulary", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    figure = OUT / "recipe_search.png"
    fig.savefig(figure, dpi=110)
    plt.close(fig)
    text = "\n".join(lines)
    (OUT / "report.md").write_text(text + f"\n\nfigure: {figure}\n")
    print(text + f"\n\nfigure: {figure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["calibrate", "search", "report"])
    parser.add_argument("tries", nargs="*", help=f"default: all of {', '.join(TRIES)}")
    parser.add_argument("--minutes", type=float, nargs="+", default=[10.0],
                        help="the budget of each try (search: the first; report: every budget to show)")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="torch threads of each try (budgets are steps, so this changes only the wall time)")
    add_shared_data_flag(parser)
    args = parser.parse_intermixed_args()
    names = args.tries or list(TRIES)
    unknown = [n for n in names if n not in TRIES]
    if unknown:
        sys.exit(f"unknown tries: {', '.join(unknown)}")
    if args.phase in ("calibrate", "search"):
        args.shared_data = shared_path(args, "corpora").parent
    if args.phase == "calibrate":
        calibrate(args, names)
    elif args.phase == "search":
        search(args, names)
    else:
        report(args.minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
