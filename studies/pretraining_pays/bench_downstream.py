"""Does our pre-training pay on real text? The pre-registered study of study_protocol.md, a command per stage.

    python studies/pretraining_pays/bench_downstream.py corpora --shared-data ../shared/data    # split, shard sets
    python studies/pretraining_pays/bench_downstream.py calibrate --shared-data ../shared/data  # steps/min per shape
    python studies/pretraining_pays/bench_downstream.py search --shared-data ../shared/data     # tries, then recipes
    python studies/pretraining_pays/bench_downstream.py pretrain --shared-data ../shared/data   # five runs (resumes)
    python studies/pretraining_pays/bench_downstream.py finetune --shared-data ../shared/data   # arms, tasks, seeds
    python studies/pretraining_pays/bench_downstream.py report --shared-data ../shared/data     # table, figures
    python studies/pretraining_pays/bench_downstream.py --quick --shared-data ../shared/data    # all, tiny scale

Every stage keeps what it made under --out (outputs/study; outputs/study_quick with --quick) and skips what is done,
so a stage can run in several sittings; `pretrain --arms domain_120` runs some arms only. One stage runs at a time per
--out: a second invocation stops, naming the first (<out>/.running). The study's own outputs/study is also kept in
record/ (study_record.py): each stage restores from it what outputs/study lacks, and copies into it each arm and
stage it finishes, so that a sitting on a new machine goes on where the last one stopped.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from benchmarks_common import REPO_ROOT, add_shared_data_flag, shared_path  # silences the known noise, before Beam
from study_corpora import build_corpora, shard_sets
from study_recipe import (
    CORPORA,
    SMALL_SHAPE,
    TRIES,
    TRY_MINUTES,
    budget_steps,
    calibrate,
    choose,
    heldout_mlm_accuracy,
    search,
    train_for,
)
from study_record import RECORD, keep, restore
from study_report import HELDOUT_FILE

STAGES = ("corpora", "calibrate", "search", "pretrain", "finetune", "report")
# (arm, corpus, minutes, the other objective than the chosen one), in the protocol's order
PRETRAINING_ARMS = (("domain_120", "domain", 120, False), ("general_120", "general", 120, False),
                    ("domain_60", "domain", 60, False), ("general_60", "general", 60, False),
                    ("domain_60_other", "domain", 60, True))
PRETRAINING_NAMES = tuple(arm for arm, *_ in PRETRAINING_ARMS)
# what --arms may name in each stage: the fine-tuning arms (downstream_arms) and the bag-of-words baseline
ARM_NAMES = {"pretrain": PRETRAINING_NAMES,
             "finetune": ("random_domain", "random_general") + PRETRAINING_NAMES + ("baseline",)}
QUICK_TRIES = ("tiny_v16k_s128_mlm_lr1e-3", "tiny_v16k_s128_nsp_lr1e-3")   # both objectives; choose() says "not run"
QUICK_MINUTES = 0.1           # of the quick chain's calibration: a handful of steps


def _other(objective: str) -> str:
    return "mlm_nsp" if objective == "mlm" else "mlm"


def _tries(quick: bool) -> dict[str, dict]:
    return {name: TRIES[name] for name in QUICK_TRIES} if quick else TRIES


def _recipe(out: Path, corpus: str, other: bool) -> dict:
    recipe = dict(json.loads((out / "search" / corpus / "choice.json").read_text())["recipe"])
    if other:
        recipe["objective"] = _other(recipe["objective"])
    return recipe


def stage_corpora(out: Path, shared_data: Path, quick: bool) -> None:
    build_corpora(shared_data, out, quick)
    for corpus in CORPORA:
        for recipe in _tries(quick).values():
            shard_sets(out, corpus, recipe["vocab"], recipe["seq"], recipe["objective"])


def stage_calibrate(out: Path, quick: bool) -> None:
    recipes = list(_tries(quick).values()) + ([] if quick else [SMALL_SHAPE])
    calibrate(out, recipes, quick)


def stage_search(out: Path, shared_data: Path, quick: bool) -> None:
    search(out, shared_data, _tries(quick), QUICK_MINUTES if quick else TRY_MINUTES, quick)
    for corpus in CORPORA:
        choice = choose(out, corpus, _tries(quick))
        print(f"{corpus}: {choice['recipe']}\n  " + "\n  ".join(choice["reasons"]), flush=True)


def keep_in_record(out: Path, record: Path | None) -> None:
    if record is not None:
        kept = keep(out, record)
        print(f"record: {len(kept)} file(s) kept in {record}", flush=True)


def stage_pretrain(out: Path, quick: bool, only: list[str] | None, record: Path | None = None) -> None:
    for arm, corpus, minutes, other in PRETRAINING_ARMS:
        if only and arm not in only:
            continue
        recipe = _recipe(out, corpus, other)
        calibrate(out, [recipe], quick)               # a chosen shape that was not a try
        steps = budget_steps(out, recipe, QUICK_MINUTES * minutes / 60 if quick else minutes)
        result = train_for(out, corpus, recipe, out / "pretrain" / arm, steps, checkpoints=True)
        print(f"{arm}: {steps} steps of {recipe}, held-out MLM accuracy {result['heldout_mlm_acc']:.4f}", flush=True)
        keep_in_record(out, record)
    compare_objectives(out)


def compare_objectives(out: Path) -> None:
    """Secondary: the 60-minute domain runs of both objectives on one yardstick, the MLM-only held-out set."""
    runs = [out / "pretrain" / arm for arm in ("domain_60", "domain_60_other")]
    if not all((run / "DONE").exists() for run in runs):
        return
    recipe = _recipe(out, "domain", other=False)
    _, heldout = shard_sets(out, "domain", recipe["vocab"], recipe["seq"], "mlm")
    result = {run.name: heldout_mlm_accuracy(run / "hf_export", heldout) for run in runs}
    (out / HELDOUT_FILE).write_text(json.dumps(result, indent=1))   # study_report reads it
    print(f"MLM accuracy on the domain corpus's MLM-only held-out set: {result}", flush=True)


def downstream_arms(out: Path) -> list[dict]:
    """The protocol's arms, as study_tasks takes them; random arms copy a pre-trained arm's config and tokenizer."""
    export = {arm: out / "pretrain" / arm / "hf_export" for arm in PRETRAINING_NAMES}
    arms = [{"name": "random_domain", "random_like": export["domain_120"]},
            {"name": "domain_120", "init": export["domain_120"]},
            {"name": "random_general", "random_like": export["general_120"]},
            {"name": "general_120", "init": export["general_120"]}]
    return arms + [{"name": arm, "init": export[arm]} for arm in ("domain_60", "general_60", "domain_60_other")]


def stage_finetune(out: Path, shared_data: Path, quick: bool, only: list[str] | None,
                   record: Path | None = None) -> None:
    from study_baseline import run_baseline
    from study_tasks import run_arm

    for arm in downstream_arms(out):
        if only and arm["name"] not in only:
            continue
        run = Path(arm.get("init") or arm["random_like"]).parent
        if not (run / "DONE").is_file():   # said, not passed over: a sitting that fine-tunes nothing must say why
            print(f"{arm['name']}: skipped, the pre-training run it needs has not finished "
                  f"(no {run / 'DONE'}); run the pretrain stage for {run.name} first", flush=True)
            continue
        run_arm(arm, shared_data, out, quick=quick)
        keep_in_record(out, record)
    if not only or "baseline" in only:
        run_baseline(shared_data, out, quick=quick)


def stage_report(out: Path) -> None:
    from study_report import build_report

    runs = {arm: out / "pretrain" / arm for arm, *_ in PRETRAINING_ARMS if (out / "pretrain" / arm).is_dir()}
    report = build_report(out, runs)
    print(report.read_text())
    print(f"report: {report}")


def hold_the_study(out: Path):
    """One study process per --out at a time: two would train the same arm's run folder at once, and on a small
    machine each runs many times slower (two processes of 2 threads on 2 cores: general_120 went from 386 to 32 steps
    a minute while a fine-tuning ran beside it). The lock is the kernel's (flock): it goes when its process does."""
    import fcntl
    import os

    handle = open(out / ".running", "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        sys.exit(f"{out} is in use by {holder}: one stage of the study at a time; wait for it or stop it")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} ({Path(sys.argv[0]).name} {' '.join(sys.argv[1:])})\n")
    handle.flush()
    return handle   # held open, and so locked, until this process ends


def run_stage(stage: str, out: Path, shared_data: Path, args: argparse.Namespace, record: Path | None) -> None:
    if stage == "corpora":
        stage_corpora(out, shared_data, args.quick)
    elif stage == "calibrate":
        stage_calibrate(out, args.quick)
    elif stage == "search":
        stage_search(out, shared_data, args.quick)
    elif stage == "pretrain":
        stage_pretrain(out, args.quick, args.arms, record)
    elif stage == "finetune":
        stage_finetune(out, shared_data, args.quick, args.arms, record)
    else:
        stage_report(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", nargs="?", choices=STAGES, help="one stage (with --quick: default all of them)")
    parser.add_argument("--quick", action="store_true", help="every stage at a tiny scale, in minutes")
    parser.add_argument("--arms", nargs="+", help="pretrain / finetune: only these arms (finetune: 'baseline' too)")
    parser.add_argument("--out", type=Path, default=None, help="default outputs/study (outputs/study_quick)")
    parser.add_argument("--record", type=Path, default=None,
                        help="where finished results are kept and restored from (default: the study's record/ for "
                             "the study's own outputs/study; none for another --out or --quick)")
    parser.add_argument("--no-record", action="store_true", help="outputs/study without the study's record/")
    add_shared_data_flag(parser)
    args = parser.parse_args()
    if args.stage is None and not args.quick:
        parser.error("name a stage, or --quick for the whole chain")
    known = [name for stage in ([args.stage] if args.stage else STAGES) for name in ARM_NAMES.get(stage, ())]
    if args.arms and not known:
        parser.error(f"--arms: the {args.stage} stage has no arms (pretrain and finetune have)")
    if args.arms and (unknown := [name for name in args.arms if name not in known]):
        parser.error(f"--arms {' '.join(unknown)}: not an arm of {args.stage or 'the chain'}; "
                     f"its arms are {', '.join(dict.fromkeys(known))}")
    shared_data = shared_path(args, "corpora").parent
    out = (args.out or REPO_ROOT / "outputs" / ("study_quick" if args.quick else "study")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lock = hold_the_study(out)  # noqa: F841  (kept for the process's lifetime)
    record = args.record or (None if args.quick or args.out is not None or args.no_record else RECORD)
    if record is not None:
        print(f"record: {len(restore(out, record))} file(s) restored from {record}", flush=True)
    if args.quick:
        (out / "QUICK").write_text("the quick chain's outputs: tiny corpora and budgets, not the study's\n")
        import torch
        torch.set_num_threads(1)   # everything runs in this process; one thread is faster on a shared small machine
    # A sitting stopped with SIGTERM (kill, the end of a machine's loan) still copies what it finished to the record.
    signal.signal(signal.SIGTERM, lambda number, _: sys.exit(f"stopped by signal {number}"))
    try:
        for stage in [args.stage] if args.stage else STAGES:
            print(f"== {stage}", flush=True)
            run_stage(stage, out, shared_data, args, record)
    finally:
        keep_in_record(out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
