"""The earlier downstream curve (2026-11-24): `+experiment=cpu_hour`'s downstream scores against its pre-training
minutes, on the bundled-size corpus. Superseded by the pre-registered study on real text (bench_downstream.py,
study_protocol.md); kept so that its figures in earlier_downstream.md can be reproduced.

    python studies/pretraining_pays/bench_cpu_hour_curve.py --shared-data ../shared/data      # pre-train, every point
    python studies/pretraining_pays/bench_cpu_hour_curve.py --shared-data ../shared/data --run <run dir>  # a run's
    python studies/pretraining_pays/bench_cpu_hour_curve.py --shared-data ../shared/data --minutes 0 15 --seeds 1

1. Pre-training: `pipeline/train.py +experiment=cpu_hour` (the recipe bench_cpu_recipe.py found) on the
   training side of recipe_corpus.py (the held-out side, never trained on, is its validation set), with
   a checkpoint every quarter of the run: 15, 30, 45 and 60 minutes of a quiet 2-core CPU, as the recipe's step
   count is (see conf/training/experiment/cpu_hour.yaml).
2. Points: 0 minutes is random initialisation of the same architecture (BERT's initialiser, torch seed = the seed:
   one encoder per seed), then the checkpoints at --minutes.
3. For each point and seed (1, 2, 3): the four measures of downstream_suite.py (SST-2 linear probe, CoLA,
   STS-B, SST-2 on 5,000 sentences), with settings fixed before the first run, the same for every point.
4. A table (mean ± sample standard deviation per cell) and a figure (each measure against pre-training minutes,
   with the spread) in --out: report.md, downstream_curve.png, results.json. Results are kept per point and seed as
   they come, so an interrupted run continues where it stopped.

The goal it checks: at 60 minutes the pre-trained encoder beats random initialisation by more than twice the seed
standard deviation (the larger of the two sides') on at least two of the four measures (the probe's scalar mix with
mean pooling, CoLA's MCC, STS-B's Pearson, SST-2's accuracy), and the gap grows with the budget.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks_common import REPO_ROOT, add_shared_data_flag, checkout_env, shared_path
from downstream_suite import run_suite
from recipe_corpus import shard_sets

PRIMARY = ("probe_mix_mean", "cola_mcc", "stsb_pearson", "sst2_acc")
SHOWN = ("probe_mix_mean", "probe_last_mean", "probe_mix_cls", "probe_last_cls", "cola_mcc", "stsb_pearson",
         "stsb_spearman", "sst2_acc")
RUN_MINUTES = 60


def recipe_steps() -> int:
    from pipeline.core.app import compose
    return int(compose("train", ["+experiment=cpu_hour"]).trainer.max_steps)


def pretrain(shared_data: Path, out: Path) -> Path:
    """The cpu_hour recipe on the corpus split, a checkpoint every quarter; returns the run directory."""
    run = out / "pretrain"
    if (run / "checkpoints" / "last.ckpt").exists():
        return run
    from pipeline.core.app import compose
    recipe = compose("train", ["+experiment=cpu_hour"])
    train, heldout = shard_sets(shared_data, REPO_ROOT / "outputs" / "recipe_corpus",
                                int(recipe.data.max_seq_length), str(recipe.get("corpus_vocab", "original")))
    steps = int(recipe.trainer.max_steps)
    command = [sys.executable, str(REPO_ROOT / "pipeline" / "train.py"), "+experiment=cpu_hour",
               f"data.path={train}", f"validation.path={heldout}", f"hydra.run.dir={run}",
               f"callbacks.checkpoint.every_n_train_steps={steps // 4}", "trainer.enable_progress_bar=false"]
    print(f"pre-training: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, cwd=REPO_ROOT, env=checkout_env(OMP_NUM_THREADS="2"))
    return run


def init_of(run: Path, minutes: float, seed: int, out: Path) -> Path:
    """The weights of a point: a random export at 0 minutes (one per seed), else the run's checkpoint."""
    if minutes == 0:
        return random_init(run, seed, out / f"random-{seed}")
    step = round(recipe_steps() * minutes / RUN_MINUTES)
    path = run / "checkpoints" / f"step{step:07d}.ckpt"
    if not path.exists():
        sys.exit(f"no checkpoint for {minutes:g} minutes ({path}); the run keeps one every quarter")
    return path


def random_init(run: Path, seed: int, out: Path) -> Path:
    import torch

    from model import BertForPreTraining
    from model.bert.hf_files import export_hf
    from pipeline.core.checkpoints.weights import load_pretrained

    if (out / "config.json").exists():
        return out
    pretrained = load_pretrained(run)                 # for the architecture and the tokenizer only
    torch.manual_seed(seed)
    return export_hf(BertForPreTraining(pretrained.config), out, pretrained.tokenizer_source)


def spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def report(results: dict, minutes: list[float], seeds: list[int]) -> tuple[str, list[str]]:
    """The table, and the goal's verdict lines."""
    lines = ["| measure | " + " | ".join(f"{m:g} min" for m in minutes) + " |",
             "|---|" + "---|" * len(minutes)]
    for measure in SHOWN:
        cells = []
        for m in minutes:
            values = [results[f"{m:g}"][str(s)][measure] for s in seeds if str(s) in results.get(f"{m:g}", {})]
            cells.append("{:.4f} ± {:.4f}".format(*spread(values)) if values else "")
        lines.append(f"| {measure} | " + " | ".join(cells) + " |")
    verdict = []
    if "0" in results and f"{RUN_MINUTES}" in results and len(seeds) > 1:
        wins = 0
        for measure in PRIMARY:
            base = [results["0"][str(s)][measure] for s in seeds]
            top = [results[f"{RUN_MINUTES}"][str(s)][measure] for s in seeds]
            gap = statistics.fmean(top) - statistics.fmean(base)
            sd = max(spread(base)[1], spread(top)[1])
            wins += gap > 2 * sd
            verdict.append(f"{measure}: gap at {RUN_MINUTES} min {gap:+.4f}, larger sd {sd:.4f}: "
                           f"{'beats random by more than 2 sd' if gap > 2 * sd else 'not by 2 sd'}")
        verdict.append(f"goal (>= 2 of 4 measures beyond 2 sd at {RUN_MINUTES} min): "
                       f"{'met' if wins >= 2 else 'not met'} ({wins} of 4)")
    return "\n".join(lines), verdict


def plot(results: dict, minutes: list[float], seeds: list[int], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7), constrained_layout=True)
    for ax, measure in zip(axes.flat, SHOWN):
        xs, means, sds = [], [], []
        for m in minutes:
            values = [results[f"{m:g}"][str(s)][measure] for s in seeds if str(s) in results.get(f"{m:g}", {})]
            if values:
                mean, sd = spread(values)
                xs.append(m), means.append(mean), sds.append(sd)
                ax.scatter([m] * len(values), values, s=10, color="grey", alpha=0.6)
        ax.errorbar(xs, means, yerr=sds, marker="o", capsize=4)
        ax.set_title(measure)
        ax.set_xlabel("pre-training minutes (0 = random init)")
        ax.grid(alpha=0.3)
    fig.suptitle("cpu_hour: downstream scores against pre-training budget (mean ± sd over seeds; dots: each seed)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_data_flag(parser)
    parser.add_argument("--run", type=Path, default=None, help="a finished cpu_hour run (default: pre-train one)")
    parser.add_argument("--minutes", type=float, nargs="+", default=[0, 15, 30, 60])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench_cpu_hour_curve")
    args = parser.parse_args()
    shared_data = shared_path(args, "downstream").parent
    glue = shared_data / "downstream" / "glue"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = args.run.resolve() if args.run else pretrain(shared_data, out)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for minutes in args.minutes:
        for seed in args.seeds:
            done = results.setdefault(f"{minutes:g}", {})
            if str(seed) in done:
                continue
            init = init_of(run, minutes, seed, out)
            print(f"{minutes:g} min, seed {seed}: {init}", flush=True)
            done[str(seed)] = run_suite(init, glue, seed, out / f"{minutes:g}min-seed{seed}")
            print(f"  {done[str(seed)]}", flush=True)
            results_path.write_text(json.dumps(results, indent=1))
    table, verdict = report(results, args.minutes, args.seeds)
    figure = plot(results, args.minutes, args.seeds, out / "downstream_curve.png")
    text = "\n".join([table, "", *verdict, "", f"figure: {figure}", f"run: {run}"])
    (out / "report.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
