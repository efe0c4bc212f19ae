"""What speeds up the pipeline's BERT-Large pre-training on one GPU: levers against today's recipe row, on one machine.

    python benchmarks/gpu_variants.py --shards-128 <set>           # the levers (below), 1 round, at most 8 minutes
    python benchmarks/gpu_variants.py --cpu                        # the same code paths at tiny sizes (a test in CI)
    python benchmarks/gpu_variants.py --variant workers_4=data.num_workers=4 --rounds 3
    python benchmarks/gpu_variants.py --phase2                     # the row at seq 512: packing against unpacked
    bash infra/gpu/device_run.sh                                   # on a bare GPU machine: wheels, then this

Every run is gpu_check.py's `pretrain-128-ddp` row (BERT-Large, seq 128, one process, the recipe's LAMB, bf16-mixed,
micro-batch 64 x 4 accumulated, 40 optimizer steps), in a process of its own, with one variant's Hydra overrides
added. The default variants are issue 35's levers, each alone and all together, the ZeRO rows against DDP with the
same optimizer, and ModernBERT-base through the same row (MODERNBERT, below).
The same row gave 678 to 924 sequences/s in six runs on three fresh machines of one kind (benchmarks/gpu.md), so a
variant is never compared with a figure from another machine: each round runs the baseline and every variant once on
this one, and a variant's ratio is its median over its runs against the baseline's median over the baseline's runs in
the same script.
Order and budget (issue 48, item 3): the first round runs the baseline, then the variants cheapest first by their
expected cost (EXPECTED_S: start-up, compilation and 40 steps, from benchmarks/gpu.md's measurements where there are
some, else an estimate, labelled so); later rounds rotate that order by one place a round. A run whose expected cost
(its own last run's time once it has one) exceeds the budget left is not started, and its table row says so; a run
that starts never outlives the budget (gpu_check stops it there). Each run's output goes to one log as it runs
(<out>/rows.log, the runs one after another), and its figures are appended to <out>/gpu_variants.md as soon as it ends,
so a command killed from outside leaves every finished run's line; the summary (medians, ratios, profiles) follows at
the end. Each run's step 2 is profiled (benchmarks/gpu_step_profile.py). FP8 rows' MFU is against the FP8 peak, with
the bf16-equivalent (the same FLOPs against the bf16 peak) beside it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import REPO_ROOT, at_least_one
from gpu_check import BUNDLED_BOOK, CPU, GPU, MIN_ROW_S, cases, make_shards, profile_table, run_child, summarise

ROW = "pretrain-128-ddp"
BASELINE = "baseline"
# Issue 35's levers. (unpadded: 6% of this row's tokens are padding, 15-17% at seq 512.) The row's optimizer step
# stays 256 sequences (gpu_check sets data.global_batch_size to 64 x 4):
# micro_batch_auto takes the largest pass that fits (256 x 1 on an 80 GB card). FP8 runs compiled (torchao's
# scaling and casts are fused by the compiler; eager they are extra kernels). The ZeRO rows compare with DDP under the
# same optimizer (ZeRO refuses LAMB): adamw is the DDP row with it.
LEVERS = {
    "all": ("data.micro_batch_size=auto", "model.compile=true", "model.fp8=true"),
    "micro_batch_auto": ("data.micro_batch_size=auto",),
    "compiled": ("model.compile=true",),                        # the encoder's layer, once (compile_scope=layers)
    "compiled_whole": ("model.compile=true", "model.compile_scope=whole"),   # encoder, heads and losses: one graph
    "compiled_autotune": ("model.compile=true", "model.compile_autotune=true"),   # bias+GELU in a matmul epilogue
    "vocab_padded": ("model.pad_vocab_to_multiple_of=64",),      # the decoder's matmul on 30,528 rows
    "fp8_compiled": ("model.compile=true", "model.fp8=true"),
    # torchao's filter (model.fp8=true) against every projection in FP8: which pays at BERT-Large's widths
    "fp8_all_projections": ("model.compile=true", "model.fp8=all_projections"),
    "cuda_graphs": ("model.compile=true", "model.cuda_graphs=true"),
    "unpadded": ("data.unpad=true",),
    "adamw": ("optimizer=adamw", "optimizer.lr=1e-4"),
    "zero1_adamw": ("strategy=deepspeed_stage_1", "optimizer=adamw", "optimizer.lr=1e-4"),
    "zero2_adamw": ("strategy=deepspeed_stage_2", "optimizer=adamw", "optimizer.lr=1e-4"),
}
# Seconds a run takes on an H100/H200, start-up and compilation included, for the order and the budget. Measured
# (benchmarks/gpu.md, 2026-11-26): the eager 64 x 4 row, 40 steps, averaged 41 to 61 s a run over two gpu_variants
# invocations (303 s for 5 runs, 245 s for 6), larger micro-batches included; gpu_check's five rows, ZeRO-2's among
# them, took 218-233 s. The others are estimates, marked so, until a run measures them: compilation of the whole
# 24-layer model takes minutes (issue 48's review), of its one repeated layer (the default scope) a fraction of that;
# max-autotune times each matmul shape's candidates; FP8 and CUDA graphs compile too, DeepSpeed adds its start-up.
EXPECTED_S: dict[str, tuple[float, str]] = {
    BASELINE: (60, "measured"),
    "adamw": (60, "estimate: the baseline's"),
    "unpadded": (60, "estimate: the baseline's"),
    "micro_batch_auto": (75, "estimate: the baseline's and its probe"),
    "zero1_adamw": (75, "estimate: the baseline's and DeepSpeed's start"),
    "zero2_adamw": (75, "estimate: from gpu_check's ZeRO-2 row"),
    "modernbert_base": (90, "estimate"),
    "vocab_padded": (60, "estimate: the baseline's"),
    "compiled": (90, "estimate: one layer's compile"),
    "compiled_whole": (150, "estimate: a whole-model compile"),
    "compiled_autotune": (180, "estimate: one layer's compile, each matmul shape autotuned"),
    "fp8_compiled": (120, "estimate: one layer's compile with FP8"),
    "fp8_all_projections": (120, "estimate: one layer's compile with FP8"),
    "cuda_graphs": (120, "estimate: one layer's compile and graph capture"),
    "all": (150, "estimate: compile, FP8 and the probe"),
}
UNKNOWN_S = (60, "estimate: the baseline's (a variant without a figure of its own)")
# Not in the CPU rehearsal: FP8 is refused without a GPU of compute capability 8.9+, CUDA graphs need CUDA, and "all"
# holds FP8. The whole-model and autotuned compiles are left out of it for their minutes of CPU compilation: their
# code paths run in tests/pretraining/test_compiled_model.py and test_compile_autotune.py.
GPU_ONLY = ("all", "fp8_compiled", "fp8_all_projections", "cuda_graphs", "compiled_whole", "compiled_autotune")


# Not a lever of this row: ModernBERT-base (issue 46) on packed rows of 1,024 tokens that record their documents
# (ModernBERT's phase-1 length), through the same row's trainer, batch and steps, so that its throughput and MFU are
# measured on the same machine; its ratio to the BERT-Large baseline compares two models, not a lever. The bundled
# vocabulary (the row's shard sets' and this one's). AdamW at ModernBERT-base's rate (its StableAdamW: issue 47).
# Last: a budget that runs out leaves it out first. On the CPU: ModernBERT-tiny at 256 tokens.
MODERNBERT = "modernbert_base"


def modernbert_overrides(cpu: bool, shards: Path) -> tuple[str, ...]:
    seq, predictions = (256, 77) if cpu else (1024, 307)   # 30% of the row
    return (f"model={'modernbert_tiny' if cpu else 'modernbert_base'}", "model.vocab_size=30522",
            f"data.path={shards}", f"data.max_seq_length={seq}", f"data.max_predictions_per_seq={predictions}",
            "optimizer=adamw", "optimizer.lr=8e-4")


# --phase2 (issue 48, item 4): the same row at seq 512 on phase-2 shards, the baseline included, so that every ratio is
# against unpacked phase 2; its variants are MLPerf-style packing of the sentence pairs (data.packing: each pass's pairs
# packed into fewer rows, pipeline/pretraining/data/pair_packing.py), alone and with data.unpad, and data.unpad alone.
# The packing window is the pass: 32 pairs here (the bundled phase-2 sample's real-token share of the rows goes from
# 0.772 to 0.958 at 32, benchmarks/bench_pair_packing.py), 4 passes a step. sequences/s counts pairs, not rows
# (pipeline/core/speed/throughput.py). Packing runs eager (compile is refused with it): the rows compare eager.
PHASE2_LEVERS = {
    "packed": ("data.packing=true",),
    "packed_unpadded": ("data.packing=true", "data.unpad=true"),
    "unpadded": ("data.unpad=true",),
}
PHASE2_EXPECTED_S: dict[str, tuple[float, str]] = {
    BASELINE: (90, "estimate: 40 steps of 128 sequences at seq 512, eager"),
    "unpadded": (90, "estimate: the phase-2 baseline's"),
    "packed": (80, "estimate: the phase-2 baseline's, ~20% fewer rows"),
    "packed_unpadded": (80, "estimate: the phase-2 baseline's, ~20% fewer rows"),
}


def phase2_overrides(cpu: bool, shards: Path) -> tuple[str, ...]:
    """What --phase2 adds to every run of the row, the baseline's included: seq 512, 80 predictions, 32 x 4."""
    micro, accumulation = (2, 2) if cpu else (32, 4)
    return (f"data.path={shards}", "data.max_seq_length=512", "data.max_predictions_per_seq=80",
            f"data.micro_batch_size={micro}", f"data.global_batch_size={micro * accumulation}")


def own_phase2_shards(work: Path, cpu: bool) -> Path:
    """gpu_check's own seq-512 set (the bundled phase-2 sample on a GPU machine, one of its books on the CPU)."""
    target = work / "shards512"
    make_shards(CPU if cpu else GPU, target, 512)
    return target


def default_variants(cpu: bool, modern_shards: Path) -> dict[str, tuple[str, ...]]:
    levers = {name: overrides for name, overrides in LEVERS.items() if not (cpu and name in GPU_ONLY)}
    return {**levers, MODERNBERT: modernbert_overrides(cpu, modern_shards)}


def variant(text: str) -> tuple[str, tuple[str, ...]]:
    """NAME=KEY=VALUE[,KEY=VALUE...] -> (NAME, overrides)."""
    name, sep, overrides = text.partition("=")
    if not sep or not name or "=" not in overrides:
        raise argparse.ArgumentTypeError(f"expected NAME=KEY=VALUE[,KEY=VALUE...], not {text!r}")
    if name == BASELINE:
        raise argparse.ArgumentTypeError(f"{BASELINE!r} is the row without overrides; give the variant another name")
    return name, tuple(overrides.split(","))


def round_order(names: list[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def link_shards(run_dir: Path, shards: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir / "shards128"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(shards)


def own_shards(work: Path, cpu: bool) -> Path:
    """gpu_check's own seq-128 set (the bundled sample on a GPU machine, one of its books on the CPU), made once."""
    target = work / "shards128"
    make_shards(CPU if cpu else GPU, target, 128)
    return target


def own_modern_shards(work: Path, cpu: bool) -> Path:
    """MLM-only shards with document boundaries for the ModernBERT row: the bundled sample at 1,024 tokens on a GPU
    machine, one of its books at 256 on the CPU; made once."""
    target = work / "shards_modern"
    if (target / "manifest.json").exists():
        return target
    from data_prep.run import run  # Apache Beam: only when the set is made here

    if cpu:
        run(["preset=sample_modern", f"inputs=[{{path: '{BUNDLED_BOOK}', format: books}}]", f"output_dir={target}",
             "max_seq_length=256", "max_predictions_per_seq=77", "num_shards=1", "--runner=DirectRunner",
             "--direct_running_mode=in_memory"])
    else:
        run(["preset=sample_modern", f"output_dir={target}", "max_seq_length=1024", "max_predictions_per_seq=307"])
    return target


def expected_cost(name: str, cpu: bool, last_took: float | None,
                  expected: dict[str, tuple[float, str]] = EXPECTED_S) -> tuple[float, str]:
    """(seconds, where the figure comes from): the variant's own last run in this invocation, else `expected`
    (EXPECTED_S, or PHASE2_EXPECTED_S under --phase2; a tenth of it on the CPU, where the rehearsal's runs are tiny)."""
    if last_took is not None:
        return last_took, "its last run here"
    seconds, source = expected.get(name, UNKNOWN_S)
    return (seconds / 10, f"{source}, a tenth on the CPU") if cpu else (seconds, source)


def first_round_order(names: list[str], cpu: bool, expected: dict[str, tuple[float, str]] = EXPECTED_S) -> list[str]:
    """The baseline first (the ratios need it), then the variants cheapest first (a stable sort: ties keep their
    order)."""
    rest = sorted((n for n in names if n != BASELINE), key=lambda n: expected_cost(n, cpu, None, expected)[0])
    return [BASELINE, *rest] if BASELINE in names else rest


def expected_table(args: argparse.Namespace) -> dict[str, tuple[float, str]]:
    return PHASE2_EXPECTED_S if getattr(args, "phase2", False) else EXPECTED_S


def run_variant(name: str, overrides: tuple[str, ...], round_index: int, work: Path, shards: Path,
                args: argparse.Namespace, started: float, last_took: float | None, log: Path | None = None) -> dict:
    sizes = CPU if args.cpu else GPU
    print(f"[round {round_index + 1}] {name}: {' '.join(overrides) or '(no overrides)'}", flush=True)
    if args.budget is not None:
        left = args.budget - (time.perf_counter() - started)
        expected, source = expected_cost(name, args.cpu, last_took, expected_table(args))
        if left < max(expected, MIN_ROW_S):   # it would be stopped before its end (gpu_check starts none under 30 s)
            print(f"  not run: {max(left, 0):.0f} s left, expected {expected:.0f} s ({source})", flush=True)
            return {"error": f"not started: {max(left, 0):.0f} s of the budget left, expected {expected:.0f} s "
                             f"({source})"}
    run_dir = work / name / f"round{round_index + 1}"
    link_shards(run_dir, shards)
    case = next(c for c in cases(sizes, run_dir, overrides) if c.name == ROW)
    child_args = argparse.Namespace(cpu=args.cpu, override=list(overrides), budget=args.budget)
    return run_child(case, child_args, run_dir, sizes, started, log=log)


RUN_COLUMNS = ("| variant | round | overrides | expected s | took s | sequences/s | against the baseline's run | "
               "MFU | MFU, bf16-equivalent | peak memory | status |\n|---|---|---|---|---|---|---|---|---|---|---|")


def mfu_cells(summary: dict) -> tuple[str, str]:
    """(MFU against the peak of the precision the matmuls ran in, the same FLOPs against the dense bf16 peak): the
    throughput callback logs perf/mfu_bf16 for FP8 runs only; for the others the two are one figure."""
    mfu = summary.get("perf/mfu")
    bf16 = summary.get("perf/mfu_bf16", mfu)
    return (f"{mfu:.1%}" if mfu is not None else "n/a", f"{bf16:.1%}" if bf16 is not None else "n/a")


def run_line(name: str, round_index: int, overrides: tuple[str, ...], expected: tuple[float, str], took: float,
             result: dict, baseline_rate: float | None) -> str:
    """One finished (or not started) run as a table line, appended to the table file at once."""
    head = f"| {name} | {round_index + 1} | {' '.join(overrides) or '-'} | {expected[0]:.0f} ({expected[1]}) |"
    if "error" in result:
        return f"{head} {took:.0f} | - | - | - | - | - | {result['error']} |"
    summary = summarise(result)
    rate = summary["perf/sequences_per_s"]
    ratio = "1 (the baseline)" if name == BASELINE else f"{rate / baseline_rate:.2f}x" if baseline_rate else "-"
    mfu, bf16 = mfu_cells(summary)
    return (f"{head} {took:.0f} | {rate:,.1f} | {ratio} | {mfu} | {bf16} | "
            f"{result['peak_memory'] / 2**30:.2f} GiB | done |")


def table(variants: dict[str, tuple[str, ...]], results: dict[str, list[dict]]) -> str:
    def medians(name: str) -> tuple[list[float], list[float], list[float], list[float]]:
        done = [summarise(r) for r in results[name] if "error" not in r]
        return ([s["perf/sequences_per_s"] for s in done], [s["perf/mfu"] for s in done if "perf/mfu" in s],
                [s.get("perf/mfu_bf16", s["perf/mfu"]) for s in done if "perf/mfu" in s],
                [r["peak_memory"] / 2**30 for r in results[name] if "error" not in r])

    base_seqs = medians(BASELINE)[0]
    lines = ["| variant | overrides | runs | sequences/s, each run | median | against the baseline | MFU (median) | "
             "MFU, bf16-equivalent | peak memory |", "|---|---|---|---|---|---|---|---|---|"]
    for name, overrides in variants.items():
        seqs, mfus, bf16s, memory = medians(name)
        not_run = [r["error"] for r in results[name] if "error" in r]
        runs = f"{len(seqs)}" + (f" ({len(not_run)} not run: {not_run[0]})" if not_run else "")
        each = ", ".join(f"{s:,.1f}" for s in seqs) or "-"
        median = statistics.median(seqs) if seqs else None
        ratio = ("1 (the baseline)" if name == BASELINE else
                 f"{median / statistics.median(base_seqs):.2f}x" if median and base_seqs else "-")
        lines.append(f"| {name} | {' '.join(overrides) or '-'} | {runs} | {each} | "
                     f"{f'{median:,.1f}' if median else '-'} | {ratio} | "
                     f"{f'{statistics.median(mfus):.1%}' if mfus else 'n/a'} | "
                     f"{f'{statistics.median(bf16s):.1%}' if bf16s else 'n/a'} | "
                     f"{f'{max(memory):.2f} GiB' if memory else '-'} |")
    return "\n".join(lines)


def append(path: Path, text: str) -> None:
    """A line or section added to the table file and flushed at once: a kill after it leaves it there."""
    with open(path, "a") as handle:
        handle.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: the same code paths, for CI")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "outputs" / "gpu_variants")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the table (gpu_variants.md) and the runs' log (rows.log) go (default: --workdir)")
    parser.add_argument("--shards-128", type=Path, help="a phase-1 shard set (default: gpu_check's, made here)")
    parser.add_argument("--shards-modern", type=Path, help="the ModernBERT row's shard set (default: made here)")
    parser.add_argument("--phase2", action="store_true",
                        help="the row at seq 512 (the baseline too); default variants: packing's (PHASE2_LEVERS)")
    parser.add_argument("--shards-512", type=Path, help="--phase2's shard set (default: gpu_check's, made here)")
    parser.add_argument("--variant", type=variant, action="append", metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="a variant to compare with the baseline (repeatable; default: the levers, "
                             + "; ".join(f"{k}={','.join(v)}" for k, v in LEVERS.items()) + ")")
    parser.add_argument("--rounds", type=at_least_one, default=1, help="runs of each variant, and of the baseline")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole comparison (default: 480 on a GPU, none on the CPU)")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.variant or ()]
    if len(set(names)) < len(names):
        parser.error(f"--variant: each name once (given: {', '.join(names)})")
    if args.budget is None and not args.cpu:
        args.budget = 480.0
    import torch
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --cpu for the CPU rehearsal")
    started = time.perf_counter()
    work = args.workdir.resolve()
    out = (args.out or args.workdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    table_file, log = out / "gpu_variants.md", out / "rows.log"
    row_overrides: tuple[str, ...] = ()   # --phase2: added to every run, before its variant's
    if args.phase2:
        shards = args.shards_512.resolve() if args.shards_512 else own_phase2_shards(work, args.cpu)
        row_overrides = phase2_overrides(args.cpu, shards)
    else:
        shards = args.shards_128.resolve() if args.shards_128 else own_shards(work, args.cpu)
    if args.variant:
        chosen = dict(args.variant)
    elif args.phase2:
        chosen = dict(PHASE2_LEVERS)
    else:
        modern = args.shards_modern.resolve() if args.shards_modern else own_modern_shards(work, args.cpu)
        chosen = default_variants(args.cpu, modern)
    variants = {BASELINE: (), **chosen}
    command = "python benchmarks/gpu_variants.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: {command}", flush=True)
    first = first_round_order(list(variants), args.cpu, expected_table(args))
    row = f"the `{ROW}` row of gpu_check.py"
    if row_overrides:
        row += f" with {' '.join(row_overrides)} in every run"
    table_file.write_text(f"{time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}; `{command}`; {row}; "
                          f"budget {args.budget if args.budget is not None else 'none'} s; "
                          f"{args.rounds} rounds; first round's order: {', '.join(first)}\n\n"
                          f"Each run, as it ended (the runs' output: {log.name}):\n\n{RUN_COLUMNS}\n")
    results: dict[str, list[dict]] = {name: [] for name in variants}
    took: dict[str, float] = {}   # each variant's last wall time, start-up included
    baseline_rate = None
    for round_index in range(args.rounds):
        for name in round_order(first, round_index):
            began = time.perf_counter()
            expected = expected_cost(name, args.cpu, took.get(name), expected_table(args))
            result = run_variant(name, (*row_overrides, *variants[name]), round_index, work, shards, args, started,
                                 took.get(name), log)
            if "error" not in result:
                took[name] = time.perf_counter() - began
                if name == BASELINE:
                    baseline_rate = summarise(result)["perf/sequences_per_s"]
            results[name].append(result)
            append(table_file, run_line(name, round_index, variants[name], expected, time.perf_counter() - began,
                                        result, baseline_rate))
    device = next((f"{r['device']}, torch {r['torch']}" for rs in results.values() for r in rs if "device" in r), "?")
    first_runs = [(name, next((r for r in rs if "error" not in r), {"error": "none ran"}))
                  for name, rs in results.items()]
    text = (f"Summary, {device}: medians over the rounds\n\n{table(variants, results)}\n\n"
            f"Step 2 of each variant's first run, profiled:\n\n{profile_table(first_runs)}")
    print("\n" + text)
    append(table_file, "\n" + text)
    print(f"\nwritten to {table_file}; {time.perf_counter() - started:.0f} s in all")
    return 1 if any("error" in r for rs in results.values() for r in rs) else 0

if __name__ == "__main__":
    sys.exit(main())
