"""Evidence that holds up: the second protocol (evidence_protocol.md), a command per stage.

    python studies/pretraining_pays/bench_evidence.py corpora --shared-data ../shared/data       # clean corpora
    python studies/pretraining_pays/bench_evidence.py sensitivity --shared-data ../shared/data   # (c) without overlaps
    python studies/pretraining_pays/bench_evidence.py replicate --shared-data ../shared/data     # domain_120 x 3 seeds
    python studies/pretraining_pays/bench_evidence.py plateau --shared-data ../shared/data       # tries, remedy arm
    python studies/pretraining_pays/bench_evidence.py report --shared-data ../shared/data        # every table

Every stage keeps what it made under --out (outputs/evidence) and skips what is done, so a stage runs in several
sittings (a pre-training run resumes from its newest checkpoint). Finished results are copied into record/evidence/
(study_record.py, lighter than the first study's: weights only for the arms an endpoint compares) and restored from
it on a machine that lacks them. One stage at a time per --out, as for the first study.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from bench_downstream import hold_the_study
from benchmarks_common import REPO_ROOT, add_shared_data_flag, shared_path
from study_corpora import build_corpora, shard_sets
from study_decontamination import SecondCheck
from study_record import EVIDENCE_KEPT, EVIDENCE_RECORD, RECORD, keep, restore

STAGES = ("corpora", "sensitivity", "replicate", "plateau", "report")
# The shard sets the second protocol trains on: the domain recipe at the length it is fine-tuned at (its
# vocabulary made by the (128, mlm) set first, as study_corpora does), the general recipe.
SHARD_SETS = (("domain", 16000, 128, "mlm"), ("domain", 16000, 128, "mlm_nsp"), ("general", 8000, 128, "mlm"))


def stage_corpora(out: Path, shared_data: Path) -> None:
    build_corpora(shared_data, out, check=SecondCheck)
    for corpus in ("domain", "general"):
        counts = json.loads((out / "corpora" / corpus / "DONE").read_text())
        print(f"corpus {corpus}: {counts}", flush=True)
    for corpus, vocab, seq, objective in SHARD_SETS:
        train, heldout = shard_sets(out, corpus, vocab, seq, objective)
        print(f"shard set {train.parent.name}: {train}, {heldout}", flush=True)


def stage_sensitivity(out: Path, shared_data: Path) -> None:
    from study_sensitivity import run_sensitivity

    summary = run_sensitivity(shared_data, out, RECORD)
    for name in ("gain_all", "gain_clean"):
        gain = summary[name]
        print(f"{name}: {gain['mean']:+.4f} [{gain['low']:+.4f}, {gain['high']:+.4f}] over seeds {gain['seeds']}",
              flush=True)
    print(f"left out: {summary['left_out']} scored reviews (against the pool: {summary['left_out_against_pool']}); "
          f"re-runs differing from the record: {summary['reruns_differing_from_record']}", flush=True)


def run_stage(stage: str, out: Path, shared_data: Path, args: argparse.Namespace, record: Path | None) -> None:
    from study_evidence import PRETRAINING_SEEDS, plateau, replicate

    def finished() -> None:   # each finished run and pairing into the record at once, not at the stage's end
        if record is not None:
            print(f"record: {len(keep(out, record, EVIDENCE_KEPT))} file(s) kept in {record}", flush=True)

    if stage in ("replicate", "plateau"):
        stage_corpora(out, shared_data)   # made once; a sitting on a fresh machine makes them again
    if stage == "corpora":
        stage_corpora(out, shared_data)
    elif stage == "sensitivity":
        stage_sensitivity(out, shared_data)
    elif stage == "replicate":
        from study_baseline import run_baseline
        from study_evidence import finetune_seeds

        # the bag of words on the same subsets, reported beside (c'): seconds, so first
        run_baseline(shared_data, out, seeds=[seed for run in PRETRAINING_SEEDS for seed in finetune_seeds(run)])
        replicate(out, shared_data, tuple(args.runs or PRETRAINING_SEEDS), finished)
    elif stage == "plateau":
        plateau(out, shared_data, finished)
    else:
        from study_evidence_report import build_evidence_report

        report = build_evidence_report(out, RECORD)
        print(report.read_text(), flush=True)
        print(f"report: {report}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--runs", type=int, nargs="+", choices=(1, 2, 3),
                        help="replicate: only these pre-training seeds (default 1 2 3, in that order)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "evidence")
    parser.add_argument("--record", type=Path, default=None,
                        help="where finished results are kept and restored from (default: record/evidence/ for the "
                             "default --out; none for another --out)")
    add_shared_data_flag(parser)
    args = parser.parse_args()
    shared_data = shared_path(args, "corpora").parent
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The report only reads: it may run beside a stage (e.g. while a replication run trains), and keeps nothing.
    lock = None if args.stage == "report" else hold_the_study(out)  # noqa: F841  (held for the process's lifetime)
    default_out = out == (REPO_ROOT / "outputs" / "evidence").resolve()
    record = args.record or (EVIDENCE_RECORD if default_out else None)
    if record is not None:
        print(f"record: {len(restore(out, record))} file(s) restored from {record}", flush=True)
    signal.signal(signal.SIGTERM, lambda number, _: sys.exit(f"stopped by signal {number}"))
    try:
        print(f"== {args.stage}", flush=True)
        run_stage(args.stage, out, shared_data, args, record if lock is not None else None)
    finally:
        if record is not None and lock is not None:
            print(f"record: {len(keep(out, record, EVIDENCE_KEPT))} file(s) kept in {record}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
