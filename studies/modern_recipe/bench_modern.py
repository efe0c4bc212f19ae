"""Does the modern recipe make general text pay? The pre-registered study of protocol.md, a command per stage.

    python studies/modern_recipe/bench_modern.py data --shared-data ../shared/data       # corpora and shard sets
    python studies/modern_recipe/bench_modern.py calibrate --shared-data ../shared/data  # each arm's steps a minute
    python studies/modern_recipe/bench_modern.py arms --shared-data ../shared/data       # each run, then its pairing
    python studies/modern_recipe/bench_modern.py report --shared-data ../shared/data     # the tables, the verdict
    python studies/modern_recipe/bench_modern.py --quick --shared-data ../shared/data    # all of it, tiny scale

Every stage keeps what it made under --out (outputs/modern_recipe; outputs/modern_recipe_quick with --quick) and
skips what is done, so a stage runs in several sittings (a pre-training run resumes from its newest checkpoint);
`arms --runs modern:2` runs one run only. Finished results are copied into record/ beside this file as they are made
and restored from it on a machine that lacks them (the first study's study_record.keep and restore). One stage at a
time per --out (the first study's lock).
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import earlier_study  # noqa: F401  (the first studies' modules on the path)
from bench_downstream import hold_the_study
from benchmarks_common import REPO_ROOT, add_shared_data_flag, shared_path
from modern_arms import ARMS, ORDER, QUICK_ORDER, build_data, calibrate_arms, pairing, pretrain
from study_pairing import run_pairing
from study_record import keep, restore

STAGES = ("data", "calibrate", "arms", "report")
RECORD = earlier_study.ROOM / "record"
# What the record keeps, relative to <out> (study_record.keep adds each finished pre-training run's DONE, curve and
# Hugging Face export): the calibration, the corpora's counts, the vocabulary (modern_arms.PINNED_VOCAB), every
# fine-tuning result and rate choice.
KEPT = ("calibration.json", "corpora/general/stats.json", "vocab/*.txt", "finetune/*/*/*/seed*.json",
        "finetune/*/rates/*.json", "finetune/*/rates/*/*.json", "report/results.json", "report/report.md")


def _runs(args: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    order = QUICK_ORDER if args.quick else ORDER
    if not args.runs:
        return order
    wanted = [tuple(item.split(":")) for item in args.runs]
    chosen = tuple((arm, int(run)) for arm, run in wanted)
    unknown = [f"{arm}:{run}" for arm, run in chosen if (arm, run) not in order]
    if unknown:
        sys.exit(f"--runs {' '.join(unknown)}: not a run of the protocol; its runs are "
                 f"{' '.join(f'{a}:{r}' for a, r in order)}")
    return chosen


def run_stage(stage: str, out: Path, shared_data: Path, args: argparse.Namespace, record: Path | None) -> None:
    def finished() -> None:   # each run and pairing into the record at once, not at the stage's end
        if record is not None:
            print(f"record: {len(keep(out, record, KEPT))} file(s) kept in {record}", flush=True)

    if stage in ("data", "calibrate", "arms"):
        made = build_data(out, shared_data, args.quick)   # made once; a fresh machine makes them again
        finished()                                          # the vocabulary into the record before any run reads it
        if stage == "data":
            print("\n".join(f"{name}: {path}" for name, path in made.items()), flush=True)
    if stage == "calibrate":
        calibrate_arms(out, list(ARMS.values()), args.quick)
        finished()                                          # the calibration into the record before any run reads it
    elif stage == "arms":
        calibrate_arms(out, list(ARMS.values()), args.quick)   # nothing to do once calibration.json holds both
        for name, run in _runs(args):
            pretrain(out, ARMS[name], run, args.quick)
            finished()
            run_pairing(pairing(out, ARMS[name], run, args.quick), shared_data, out, args.quick)
            finished()
    elif stage == "report":
        from modern_report import build_report

        report = build_report(out, args.quick)
        print(report.read_text(), flush=True)
        print(f"report: {report}", flush=True)
        finished()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", nargs="?", choices=STAGES, help="one stage (with --quick: default all of them)")
    parser.add_argument("--quick", action="store_true", help="every stage at a tiny scale, in minutes")
    parser.add_argument("--runs", nargs="+", help="arms: only these runs, as arm:seed (e.g. modern:1 tiny:1)")
    parser.add_argument("--out", type=Path, default=None, help="default outputs/modern_recipe (_quick with --quick)")
    parser.add_argument("--record", type=Path, default=None,
                        help="where finished results are kept and restored from (default: record/ beside this file "
                             "for the default --out; none for another --out or --quick)")
    add_shared_data_flag(parser)
    args = parser.parse_args()
    if args.stage is None and not args.quick:
        parser.error("name a stage, or --quick for the whole chain")
    shared_data = shared_path(args, "corpora").parent
    out = (args.out or REPO_ROOT / "outputs" / ("modern_recipe_quick" if args.quick else "modern_recipe")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lock = hold_the_study(out)  # noqa: F841  (held for the process's lifetime)
    record = args.record or (None if args.quick or args.out is not None else RECORD)
    if record is not None:
        print(f"record: {len(restore(out, record))} file(s) restored from {record}", flush=True)
    if args.quick:
        (out / "QUICK").write_text("the quick chain's outputs: tiny corpora and budgets, not the study's\n")
        import torch
        torch.set_num_threads(1)   # everything runs in this process; one thread is faster on a shared small machine
    signal.signal(signal.SIGTERM, lambda number, _: sys.exit(f"stopped by signal {number}"))
    for stage in [args.stage] if args.stage else STAGES:
        print(f"== {stage}", flush=True)
        run_stage(stage, out, shared_data, args, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
