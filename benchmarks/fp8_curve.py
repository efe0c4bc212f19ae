"""Does FP8 train like bf16? The loss curves of the two over a few hundred steps, on one GPU (issue 35, item 6).

    python benchmarks/fp8_curve.py --shards-128 <set>      # BERT-Large, 300 steps each, at most 8 minutes
    python benchmarks/fp8_curve.py --cpu                   # the CPU rehearsal (a test in CI): bf16 against bf16

Two runs of gpu_check.py's `pretrain-128-ddp` row (BERT-Large, seq 128, 64 x 4, LAMB, bf16-mixed), both compiled,
one with model.fp8=true (torchao's float8 training of the encoder's projections), the same seed, data and order,
--steps optimizer steps each, train/loss logged every 10. Tolerance, fixed before any GPU run: after the first 50
steps (the warm-up's start, where the loss falls fastest), the mean of |loss_fp8 - loss_bf16| / loss_bf16 over the
logged steps at most 1%, and no logged step more than 3%. The table lists both curves side by side.
FP8 is refused without a GPU of compute capability 8.9+, so the CPU rehearsal runs the bf16 arm twice: the same seed
and data must give the same curve (difference 0), which checks the comparison and the runs' determinism.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import REPO_ROOT, at_least_one, metrics_rows
from gpu_variants import own_shards, run_variant

ARMS = {"bf16": ("model.compile=true",), "fp8": ("model.compile=true", "model.fp8=true")}
SETTLED_AFTER = 50          # steps left out of the comparison
MEAN_TOLERANCE, STEP_TOLERANCE = 0.01, 0.03


def curve(run_dir: Path) -> dict[int, float]:
    return {int(row["step"]): float(row["train/loss"]) for row in metrics_rows(run_dir) if row.get("train/loss")}


def compare(base: dict[int, float], other: dict[int, float]) -> dict:
    steps = sorted(step for step in base.keys() & other.keys() if step >= SETTLED_AFTER)
    if not steps:
        return {"steps": 0, "verdict": "no logged step after the settling steps in both runs"}
    gaps = [abs(other[s] - base[s]) / base[s] for s in steps]
    within = statistics.mean(gaps) <= MEAN_TOLERANCE and max(gaps) <= STEP_TOLERANCE
    return {"steps": len(steps), "mean_gap": statistics.mean(gaps), "max_gap": max(gaps),
            "verdict": "within the tolerance" if within else "outside the tolerance"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the rehearsal: tiny sizes, bf16 against bf16")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "outputs" / "fp8_curve")
    parser.add_argument("--shards-128", type=Path, help="a phase-1 shard set (default: gpu_check's, made here)")
    parser.add_argument("--steps", type=at_least_one, default=None, help="optimizer steps a run (300; CPU: 60)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for both runs (480 on a GPU)")
    args = parser.parse_args(argv)
    import torch
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --cpu for the CPU rehearsal")
    steps = args.steps or (60 if args.cpu else 300)
    if args.budget is None and not args.cpu:
        args.budget = 480.0
    arms = {"bf16": ARMS["bf16"], "bf16_again" if args.cpu else "fp8": ARMS["bf16"] if args.cpu else ARMS["fp8"]}
    common = (f"trainer.max_steps={steps}", "trainer.log_every_n_steps=10",
              "callbacks.throughput.log_every_n_steps=10")
    if args.cpu:   # compiling twice on 2 cores costs more than the comparison needs
        arms = {name: tuple(o for o in overrides if o != "model.compile=true") for name, overrides in arms.items()}
    started, work = time.perf_counter(), args.workdir.resolve()
    shards = args.shards_128.resolve() if args.shards_128 else own_shards(work, args.cpu)
    command = "python benchmarks/fp8_curve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: {command}", flush=True)
    results, last_took = {}, None
    for name, overrides in arms.items():
        began = time.perf_counter()
        results[name] = run_variant(name, (*overrides, *common), 0, work, shards, args, started, last_took)
        last_took = time.perf_counter() - began
    errors = {name: r["error"] for name, r in results.items() if "error" in r}
    first, second = arms
    curves = {name: curve(work / name / "round1" / "pretrain-128-ddp") for name in arms if name not in errors}
    lines = [f"{time.strftime('%Y-%m-%d %H:%M')}; `{command}`; {steps} steps a run; tolerance after step "
             f"{SETTLED_AFTER}: mean gap <= {MEAN_TOLERANCE:.0%}, every step <= {STEP_TOLERANCE:.0%}", "",
             f"| step | {first} loss | {second} loss | gap |", "|---|---|---|---|"]
    if not errors:
        for step in sorted(curves[first].keys() & curves[second].keys()):
            a, b = curves[first][step], curves[second][step]
            lines.append(f"| {step} | {a:.4f} | {b:.4f} | {abs(b - a) / a:.2%} |")
        result = compare(curves[first], curves[second])
        measured = (f"mean gap {result['mean_gap']:.3%}, largest {result['max_gap']:.3%} over {result['steps']} "
                    "logged steps" if result["steps"] else "")
        lines += ["", f"{result['verdict']}: {measured}"]
    else:
        lines += ["", "not compared: " + "; ".join(f"{name}: {error}" for name, error in errors.items())]
    text = "\n".join(lines)
    print("\n" + text)
    (work / "fp8_curve.md").write_text(text + "\n")
    return 1 if errors or "outside" in text else 0


if __name__ == "__main__":
    sys.exit(main())
