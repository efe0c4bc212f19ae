"""A job that made no training instance fails, saying why, and leaves nothing that looks like a shard set.

Inputs that are all empty, binary or unreadable (or that give no document an instance is made of) used to end in
exit 0, "0 instances in 0 shards" and a manifest of no shards that training refused only later. Now WriteManifest
writes no manifest then: it removes any shard file of no rows and writes no_instances.json (what was read, what was
skipped and in which files), and the launcher raises NoInstances from it, naming the inputs; the exit is not 0.
"""
from __future__ import annotations

import json
from typing import Any

from apache_beam.io.filesystems import FileSystems

from data_prep.layout import MANIFEST_NAME, NO_INSTANCES_NAME
from data_prep.manifest_writer import counts_by_reason
from data_prep.plan import JobPlan
from data_prep.where_skipped import SkipNote, input_problem_lines, skipped_where
from data_prep.whole_files import write_whole

_TOTALS = ("files", "documents", "sentences", "input_tokens")


class NoInstances(RuntimeError):
    """The job ran to its end and made no training instance: there is nothing to train on."""


def write_no_instances_report(shards: list[dict], plan: JobPlan, counts: dict[str, int], notes: list[SkipNote]
                              ) -> str:
    """Remove the shard files of no rows, write no_instances.json in the output directory; returns its path."""
    out = plan.config.output_dir
    empty_shards = [FileSystems.join(out, entry["path"]) for shard in shards for entry in shard["files"].values()]
    if empty_shards:
        FileSystems.delete(empty_shards)
    report = {
        "inputs": [spec.path for spec in plan.config.inputs],
        "totals": {name: counts.get(name, 0) for name in _TOTALS},
        "skipped": counts_by_reason(counts, "skipped"),
        "skipped_where": skipped_where(notes),
        "repaired": counts_by_reason(counts, "repaired"),
    }
    path = FileSystems.join(out, NO_INSTANCES_NAME)
    write_whole(path, json.dumps(report, indent=2).encode("utf-8"))
    return path


def check_instances_made(output_dir: str) -> None:
    """Raises NoInstances, saying why, where the job wrote its no-instance report instead of a manifest."""
    path = FileSystems.join(output_dir, NO_INSTANCES_NAME)
    if not FileSystems.exists(path):
        return
    with FileSystems.open(path) as handle:
        report = json.loads(handle.read().decode("utf-8"))
    raise NoInstances(no_instances_message(report, output_dir))


def no_instances_message(report: dict[str, Any], output_dir: str) -> str:
    """What the job read and skipped, the files of each input problem, and where the report lies."""
    totals = report["totals"]
    files = f"{totals['files']:,} file{'' if totals['files'] == 1 else 's'} read"
    documents = (f"{totals['documents']:,} documents ({totals['input_tokens']:,} tokens) gave none"
                 if totals["documents"] else "no document")
    skipped = ", ".join(f"{reason}: {count:,}" for reason, count in report["skipped"].items()) or "nothing"
    return "\n".join([
        f"no training instance made from inputs {report['inputs']}: {files}, {documents}; skipped: {skipped}",
        *(f"  {line}" for line in input_problem_lines(report["skipped_where"])),
        f"No shard set was written (no {MANIFEST_NAME} in {output_dir}); what was read and skipped is in "
        f"{FileSystems.join(output_dir, NO_INSTANCES_NAME)}.",
    ])
