"""A GPU check in ten minutes: BERT-Large pre-training at seq 128 and 512, and BERT-Base fine-tuning on SST-2, in bf16.

    python benchmarks/gpu_check.py          # on one GPU; writes outputs/gpu_check/gpu_check.md
    python benchmarks/gpu_check.py --cpu    # the same code paths at tiny sizes on the CPU (a test in CI)
    python benchmarks/gpu_check.py --budget 450 --override model.compile=true   # a shorter budget; a variant

Every row is the pipeline's own run: pipeline.pretraining.run.train / pipeline.finetuning.run.finetune with a config
composed as `python pipeline/train.py` / `pipeline/finetune.py` would compose it (pipeline.core.app.compose), each in
a process of its own (a clean CUDA context, so that its peak memory is its own):
- pre-training, +experiment=bert_large (seq 128) and +experiment=bert_large_phase2 (seq 512), with the recipes'
  micro-batches (64 and 8 sequences), on shards that data_prep makes from the bundled sample corpus:
  - DDP (one process) with the recipes' LAMB (optimizer=lamb: DeepSpeed's FusedLamb is another algorithm and is
    refused, pipeline/core/optim/optimizers.py),
  - DeepSpeed ZeRO-2 with torch's fused AdamW (optimizer=adamw: fused wherever the parameters are), the ZeRO path;
- fine-tuning BERT-Base (random weights: speed, not scores) on the bundled SST-2 sample, batch 32.
Precision bf16-mixed (autocast over fp32 weights, under DDP and DeepSpeed alike) on the GPU and on the CPU.

Figures per row: sequences/s, tokens/s (padded: what the hardware computes on; and without padding) and MFU, all
from the pipeline's throughput callback (pipeline/core/speed/throughput.py: MFU = model FLOPs over the device's
dense bf16 peak, model/flops.py), the median of its windows after the first (which holds start-up and the profiled
step); peak memory (torch.cuda.max_memory_allocated; on the CPU the process's peak RSS); and the scaled-dot-product
attention kernel the step actually ran (benchmarks/gpu_probes.py: the operators of one profiled step).
Goal (issue 17): MFU 55% for BERT-Large at seq 128 on an H100 (NVIDIA's published A100 throughput is about 44%).

A row that cannot run (a refused setting, a missing package or kernel, an error in its run) is reported with the
reason its run gave, in the log and in its table row, and the check goes on with the next row; the exit status is
then 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import BUNDLED_VOCAB, REPO_ROOT, checkout_env

GOAL_MFU = 0.55
MIN_ROW_S = 30.0   # a row given less than this by the budget is not started
BUNDLED_BOOK = REPO_ROOT / "data_prep" / "sample_corpus" / "books" / "chesterton-ball.txt"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What differs between the GPU check and its CPU rehearsal: sizes and device."""
    large: str              # the pre-training model
    base: str               # the fine-tuning model
    trainer: str            # conf/training/trainer/
    micro_128: int
    micro_512: int
    accumulation: int       # micro-batches per optimizer step (NVIDIA's recipe: 128; here the step's cost shows)
    steps: int
    log_every: int          # the throughput window, in optimizer steps
    finetune_batch: int
    loader_workers: int
    budget_s: float | None  # the whole check, start-up and data included
    case_timeout_s: float   # one row (the CPU rehearsal: DeepSpeed's JIT build of its CPU comm op included)


GPU = Sizes(large="large", base="base", trainer="gpu", micro_128=64, micro_512=8, accumulation=4,
            steps=40, log_every=10, finetune_batch=32, loader_workers=2, budget_s=600,
            case_timeout_s=300)
CPU = Sizes(large="tiny", base="tiny", trainer="cpu", micro_128=4, micro_512=2, accumulation=2,
            steps=4, log_every=2, finetune_batch=8, loader_workers=0, budget_s=None, case_timeout_s=1200)
PRECISION = "bf16-mixed"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    program: str            # "train" or "finetune"
    model: str
    seq: str
    strategy: str
    optimizer: str
    batch: str              # micro-batch x accumulation
    overrides: tuple[str, ...]


def cases(sizes: Sizes, work: Path, extra: tuple[str, ...] = ()) -> list[Case]:
    """The rows; extra: Hydra overrides added to the pre-training rows (--override)."""
    runs = []
    for seq, experiment, micro, shards in ((128, "bert_large", sizes.micro_128, work / "shards128"),
                                           (512, "bert_large_phase2", sizes.micro_512, work / "shards512")):
        for strategy, optimizer, strategy_overrides in (("ddp", "lamb", ()),
                                                        ("deepspeed_stage_2", "adamw", ("optimizer.lr=1e-4",))):
            runs.append(Case(
                name=f"pretrain-{seq}-{strategy}", program="train", model=sizes.large, seq=str(seq), strategy=strategy,
                optimizer=optimizer, batch=f"{micro} x {sizes.accumulation}",
                overrides=(f"+experiment={experiment}", "require_init_from_checkpoint=false", f"model={sizes.large}",
                           f"trainer={sizes.trainer}", "trainer.devices=1", "trainer.num_nodes=1",
                           f"trainer.precision={PRECISION}", f"strategy={strategy}", f"optimizer={optimizer}",
                           *strategy_overrides, "logger=csv", f"data.path={shards}", f"data.micro_batch_size={micro}",
                           f"data.global_batch_size={micro * sizes.accumulation}",
                           f"data.num_workers={sizes.loader_workers}", "data.verify_checksums=false",
                           f"trainer.max_steps={sizes.steps}", f"trainer.log_every_n_steps={sizes.log_every}",
                           "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
                           "callbacks.checkpoint.every_n_train_steps=0", "callbacks.checkpoint.save_last=false",
                           "export.hf=false", "export.plot=false", *extra)))
    batch = sizes.finetune_batch
    # torch's fused AdamW under bf16-mixed with finetune.yaml's clipping: the module clips
    # (pipeline/core/speed/clipping.py)
    runs.append(Case(
        name="finetune-sst2", program="finetune", model=sizes.base, seq="longest in batch", strategy="auto",
        optimizer="adamw (fused)", batch=f"{batch} x 1",
        overrides=("task=sst2", f"init={work / 'init'}",
                   f"trainer.accelerator={'gpu' if sizes.trainer == 'gpu' else 'cpu'}", "trainer.devices=1",
                   f"trainer.precision={PRECISION}", "trainer.max_epochs=1",
                   f"trainer.log_every_n_steps={sizes.log_every}", "trainer.enable_progress_bar=false",
                   f"data.batch_size={batch}", f"data.limit_train_examples={batch * sizes.steps}",
                   f"data.limit_eval_examples={4 * batch}", f"data.cache_dir={work / 'datasets_cache'}",
                   "export.hf=false", "export.plot=false", "logger=csv")))
    return runs


# ----------------------------------------------------------------------------------------------------------
# inputs: shards and the fine-tuning weights

def prepare_inputs(sizes: Sizes, work: Path, args: argparse.Namespace) -> None:
    """Shards at seq 128 and 512 (given, or made), and BERT-Base (tiny on the CPU) at random initialisation as a
    Hugging Face directory for fine-tuning's init=."""
    for seq, given in ((128, args.shards_128), (512, args.shards_512)):
        target = work / f"shards{seq}"
        if given is not None:
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(Path(given).resolve())
        else:
            make_shards(sizes, target, seq)
    init = work / "init"
    if not (init / "config.json").exists():
        import torch

        from model import BertConfig, BertForPreTraining
        from model.bert.hf_files import export_hf

        torch.manual_seed(0)
        export_hf(BertForPreTraining(BertConfig.from_preset(sizes.base)), init, BUNDLED_VOCAB)


def make_shards(sizes: Sizes, target: Path, seq: int) -> None:
    """A shard set at seq 128 or 512 made by data_prep: the bundled sample corpus on the GPU, one of its books on the
    CPU. Kept: a set already there is used again."""
    if (target / "manifest.json").exists():
        return
    from data_prep.run import run  # here: with given shard sets, the check needs no data-prep packages

    started = time.perf_counter()
    if sizes is GPU:   # the bundled sample, 2 copies (~20k rows at seq 128): no epoch ends inside the run
        run([f"preset=sample{'' if seq == 128 else '_phase2'}", f"output_dir={target}", "dupe_factor=2"])
    else:
        run([f"preset={'phase1' if seq == 128 else 'phase2'}", f"inputs=[{{path: '{BUNDLED_BOOK}', format: books}}]",
             f"output_dir={target}", "dupe_factor=1", "num_shards=1", "--runner=DirectRunner",
             "--direct_running_mode=in_memory"])
    print(f"shards at seq {seq}: data_prep in {time.perf_counter() - started:.0f} s", flush=True)


# ----------------------------------------------------------------------------------------------------------
# one case, in its own process

def run_case(case: Case, sizes: Sizes, work: Path) -> dict:
    import torch
    from gpu_probes import AttentionBackendProbe, peak_memory
    from gpu_step_profile import StepProfileProbe

    from pipeline.core.app import compose
    from pipeline.core.run.loggers import csv_metrics_path
    from pipeline.core.speed.throughput import ThroughputMonitor

    if sizes is CPU:
        torch.set_num_threads(1)   # a shared CI runner: more threads than free cores slow a step down many times
    out = work / case.name
    probe, step_profile = AttentionBackendProbe(), StepProfileProbe()
    overrides = [*case.overrides, f"output_dir={out}"]
    started = time.perf_counter()
    if case.program == "train":
        from pipeline.pretraining.run import train
        train(compose("train", overrides), extra_callbacks=[probe, step_profile])
    else:   # fine-tuning builds no throughput callback of its own
        from pipeline.finetuning.run import finetune
        finetune(compose("finetune", overrides),
                 extra_callbacks=[ThroughputMonitor(sizes.log_every), probe, step_profile])
    memory, memory_kind = peak_memory()
    return {"windows": throughput_windows(csv_metrics_path(out)), "attention": probe.backends,
            "profile": step_profile.summary,
            "peak_memory": memory, "peak_memory_kind": memory_kind, "seconds": time.perf_counter() - started,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
            "torch": torch.__version__, **peak_flops_sources()}


def throughput_windows(csv_path: Path) -> list[dict]:
    import csv

    with open(csv_path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("perf/sequences_per_s")]
    return [{key: float(value) for key, value in row.items() if key.startswith("perf/") and value} for row in rows]


def peak_flops_sources() -> dict:
    """The bf16 peak the throughput callback divides by (model/flops.py), and Lightning's figure for comparison."""
    import torch

    if not torch.cuda.is_available():
        return {"peak_flops": None, "lightning_peak_flops": None}
    from lightning_fabric.utilities.throughput import get_available_flops

    from model import peak_flops_for_device
    device = torch.device("cuda", torch.cuda.current_device())
    return {"peak_flops": peak_flops_for_device(torch.cuda.get_device_name(device)),
            "lightning_peak_flops": get_available_flops(device, torch.bfloat16)}


# ----------------------------------------------------------------------------------------------------------
# the table

def summarise(result: dict) -> dict:
    """Medians over the throughput windows after the first."""
    windows = result["windows"][1:] or result["windows"]
    if not windows:
        raise ValueError("the run logged no throughput window")
    return {key: statistics.median(w[key] for w in windows) for key in windows[0]}


def table(rows: list[tuple[Case, dict]], sizes: Sizes) -> str:
    lines = ["| run | model | seq | strategy | optimizer | micro-batch x accumulation | sequences/s | tokens/s "
             "(padded) | tokens/s (no padding) | MFU | peak memory | attention kernel (SDPA) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, result in rows:
        head = f"| {case.name} | {case.model} | {case.seq} | {case.strategy} | {case.optimizer} | {case.batch} |"
        if "error" in result:
            lines.append(f"{head} not run: {result['error']} | | | | | |")
            continue
        s = summarise(result)
        mfu = f"{s['perf/mfu']:.1%}" if "perf/mfu" in s else "n/a (no peak)"
        if "perf/mfu_bf16" in s:   # an FP8 run: against the FP8 peak, and its bf16-equivalent
            mfu += f" (FP8 peak; bf16-equivalent {s['perf/mfu_bf16']:.1%})"
        lines.append(f"{head} {s['perf/sequences_per_s']:,.1f} | {s['perf/padded_tokens_per_s']:,.0f} | "
                     f"{s['perf/tokens_per_s']:,.0f} | {mfu} | {result['peak_memory'] / 2**30:.2f} GiB | "
                     f"{result['attention']} |")
    return "\n".join(lines)


def profile_table(rows: list[tuple[str, dict]]) -> str:
    """Where step 2 of each run spent its time (benchmarks/gpu_step_profile.py)."""
    from gpu_step_profile import profile_lines

    lines = ["| run | GPU busy | kernel launches / micro-batch | host syncs / micro-batch | time by kernel class |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {profile_lines(result.get('profile'))} |" for name, result in rows if "error" not in result]
    return "\n".join(lines)


def header(rows: list[tuple[Case, dict]], sizes: Sizes, command: str) -> str:
    done = [result for _, result in rows if "error" not in result]
    device = f"{done[0]['device']}, torch {done[0].get('torch', '?')}" if done else "?"
    peak, theirs = (done[0].get("peak_flops"), done[0].get("lightning_peak_flops")) if done else (None, None)
    peak_line = (f"peak {peak / 1e12:,.0f} TFLOP/s dense bf16 (model/flops.py; Lightning's get_available_flops says "
                 f"{theirs / 1e12:,.0f} TFLOP/s)" if peak and theirs else
                 f"peak {peak / 1e12:,.0f} TFLOP/s dense bf16 (model/flops.py; Lightning's table has no figure)"
                 if peak else "no peak FLOP/s for this device: no MFU")
    memory = done[0]["peak_memory_kind"] if done else "?"
    return (f"{time.strftime('%Y-%m-%d %H:%M')}, {device}; `{command}`; precision {PRECISION}; {peak_line}; "
            f"{sizes.steps} optimizer steps a run, figures the median of the throughput windows of "
            f"{sizes.log_every} steps after the first; peak memory: {memory}.")


def verdict(rows: list[tuple[Case, dict]]) -> str:
    seq128 = [summarise(r).get("perf/mfu") for c, r in rows
              if c.program == "train" and c.seq == "128" and c.model == "large" and "error" not in r]
    seq128 = [m for m in seq128 if m is not None]
    if not seq128:
        return f"Goal MFU {GOAL_MFU:.0%} for BERT-Large at seq 128 on an H100: not measured here."
    best = max(seq128)
    return (f"Goal MFU {GOAL_MFU:.0%} for BERT-Large at seq 128 on an H100: best here {best:.1%}, "
            f"{'met' if best >= GOAL_MFU else 'not met'}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: the same code paths, for CI")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "outputs" / "gpu_check",
                        help="runs, shards and the table (default outputs/gpu_check)")
    parser.add_argument("--shards-128", type=Path, help="a phase-1 shard set to use instead of making one")
    parser.add_argument("--shards-512", type=Path, help="a phase-2 shard set to use instead of making one")
    parser.add_argument("--only", nargs="+", help="run only these rows (names as in the table)")
    parser.add_argument("--budget", type=float, help="seconds for the whole check, inputs included (default: 600 on "
                        "a GPU, none on the CPU); a row still running when they run out is stopped and reported, "
                        "one they leave under 30 s is not started")
    parser.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Hydra overrides added to every pre-training row, e.g. model.compile=true")
    parser.add_argument("--case", help=argparse.SUPPRESS)   # internal: run one row in this process
    args = parser.parse_args(argv)
    sizes = CPU if args.cpu else GPU
    work = args.workdir.resolve()
    plan = {case.name: case for case in cases(sizes, work, tuple(args.override))}

    if args.case:   # the child: one run, its figures as JSON, or why it could not run
        try:
            result = run_case(plan[args.case], sizes, work)
        except Exception as error:   # reported in the table; the check goes on with the next row
            first_line = (str(error).strip().splitlines() or [""])[0]
            (work / f"{args.case}.json").write_text(json.dumps({"error": f"{type(error).__name__}: {first_line}"}))
            raise
        (work / f"{args.case}.json").write_text(json.dumps(result))
        return 0

    import torch
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --cpu for the CPU rehearsal")
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: {command}", flush=True)
    prepare_inputs(sizes, work, args)
    rows = []
    for case in plan.values():
        if args.only and case.name not in args.only:
            continue
        rows.append((case, run_child(case, args, work, sizes, started)))
    text = "\n\n".join([header(rows, sizes, command), table(rows, sizes), verdict(rows),
                         "One optimizer step of each run, profiled (step 2):",
                         profile_table([(case.name, result) for case, result in rows])])
    print("\n" + text)
    (work / "gpu_check.md").write_text(text + "\n")
    print(f"\nwritten to {work / 'gpu_check.md'}; {time.perf_counter() - started:.0f} s in all")
    return 1 if any("error" in result for _, result in rows) else 0


def run_child(case: Case, args: argparse.Namespace, work: Path, sizes: Sizes, started: float,
              log: Path | None = None) -> dict:
    """One row in a process of its own. Its output goes to its log as it runs (work/<row>.log, or appended to `log`),
    so a row stopped by its limit, or a check killed from outside, leaves what the row printed so far."""
    result_file = work / f"{case.name}.json"
    result_file.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--case", case.name, "--workdir", str(work),
               *(["--cpu"] if args.cpu else []), *(["--override", *args.override] if args.override else [])]
    timeout = sizes.case_timeout_s
    budget = args.budget if args.budget is not None else sizes.budget_s
    print(f"{case.name}: {' '.join(case.overrides)}", flush=True)
    if budget is not None:
        left = budget - (time.perf_counter() - started)
        if left < MIN_ROW_S:   # no row starts that could not get through its start-up: the table is written in time
            print(f"  not run: {max(left, 0):.0f} s of the budget left", flush=True)
            return {"error": f"not started: {max(left, 0):.0f} s of the check's {budget:.0f} s budget left"}
        timeout = min(timeout, left)
    log = log or work / f"{case.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # On the CPU rehearsal: DeepSpeed's CPU accelerator (it picks one when first imported), and one thread, which
    # Lightning would otherwise raise to the core count where OMP_NUM_THREADS is unset.
    cpu_env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"} if args.cpu else {}
    env = checkout_env(PYTHONUNBUFFERED="1", **cpu_env)
    with open(log, "a") as handle:
        handle.write(f"===== {case.name}: {' '.join(case.overrides)}\n")
        handle.flush()
        start_of_row = handle.tell()
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"stopped at its time limit, {timeout:.0f} s (the row's limit or what was left of the "
                             "check's budget; a known hang that ends so: the lock file of an interrupted JIT build, "
                             f"left in $TORCH_EXTENSIONS_DIR, makes the next build wait for ever) (log: {log})"}
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    if done.returncode != 0 or result is None or "error" in result:
        if result is None or "error" not in result:   # died without saying why: its last words
            with open(log) as handle:
                handle.seek(start_of_row)
                last = [line for line in handle.read().splitlines() if line.strip()][-1:] or ["no output"]
            result = {"error": f"exit {done.returncode}: {last[0]}"}
        result["error"] = f"{result['error'][:300]} (log: {log})"
        print(f"  not run: {result['error']}", flush=True)
        return result
    print(f"  done in {result['seconds']:.0f} s; attention: {result['attention']}", flush=True)
    return result

if __name__ == "__main__":
    sys.exit(main())
