"""Entry point: raw text -> tokenized, masked sentence-pair shards, on any Beam runner.

    python data_prep/run.py                                   # bundled sample, local, all cores
    python data_prep/run.py preset=phase1 inputs='[/data/wiki/*.bz2,/data/books/]' output_dir=/data/shards
    python data_prep/run.py preset=phase1 ... --runner=DataflowRunner --project=P --region=R \
        --temp_location=gs://B/tmp --setup_file=./setup.py
    python data_prep/run.py preset=sample dask.cluster=local dask.workers=2   # Dask cluster started and stopped here

Arguments of the form key=value are Hydra overrides of the preset in conf/data_prep/ (preset=NAME picks it);
arguments starting with -- are Beam pipeline options, passed through untouched.

The tokenized documents are spilled under the output directory while the job runs (data_prep.spill). Ctrl-C or a
killed launcher stops the waiting, not a remote job: its spill stays until the job has ended, and a run of the same
output refuses while that job may still run (data_prep.spill_owner says whose a spill is and removes it).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time

from data_prep.known_noise import silence_known_noise, worker_stderr_filtered  # noqa: E402

silence_known_noise()   # before Beam's import logs its own

import apache_beam as beam  # noqa: E402
from apache_beam.io.filesystems import FileSystems  # noqa: E402
from apache_beam.metrics.metric import MetricsFilter  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from data_prep.config import KEYS_NOT_IN_PRESETS, PrepConfig  # noqa: E402
from data_prep.dask_cluster import (  # noqa: E402
    DaskSettings,
    check_runner_choice,
    dask_runner_args,
    release_runner_client,
    started_cluster,
)
from data_prep.layout import MANIFEST_NAME, NO_INSTANCES_NAME, TOKENIZER_NAME, VOCAB_NAME  # noqa: E402
from data_prep.manifest import existing_manifest, read_manifest  # noqa: E402
from data_prep.no_instances import NoInstances, check_instances_made  # noqa: E402
from data_prep.pipeline import build_pipeline  # noqa: E402
from data_prep.plan import JobPlan, make_plan, tokenizer_json_text  # noqa: E402
from data_prep.presets import DEFAULT_PRESET, PRESET_DIR, compose_config, split_preset  # noqa: E402
from data_prep.spill_owner import (  # noqa: E402
    SpillOwner,
    check_leftover_spill,
    owner_of_this_launcher,
    record_job,
    settle_spill,
    write_owner,
)
from data_prep.vocab import text_sha256, vocab_text  # noqa: E402
from data_prep.where_skipped import input_problem_lines  # noqa: E402

log = logging.getLogger("data_prep")


def load_settings(overrides: list[str]) -> tuple[PrepConfig, DaskSettings]:
    """The data settings (they go into the manifest) and the Dask cluster settings (they shape nothing)."""
    preset, rest = split_preset(overrides)
    try:
        cfg = compose_config(PRESET_DIR, preset, rest)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise ValueError(f"config: {error}") from error
    dask = DaskSettings.from_dict(raw.pop("dask", None))
    return PrepConfig.from_dict(raw), dask


def load_config(overrides: list[str]) -> PrepConfig:
    return load_settings(overrides)[0]


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    overrides = [a for a in argv if not a.startswith("-")]
    beam_args = [a for a in argv if a.startswith("-")]
    return overrides, beam_args


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    if not any(a.startswith("--runner") for a in beam_args):
        # Local default: Beam's DirectRunner on every core, one worker process each.
        beam_args = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                     f"--direct_num_workers={os.cpu_count() or 1}", *beam_args]
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # Worker processes: our progress lines, not the harness's own chatter.
        beam_args = ["--default_sdk_harness_log_level=WARNING",
                     '--sdk_harness_log_level_overrides='
                     '{"data_prep": "INFO", "apache_beam.options.pipeline_options": "ERROR"}', *beam_args]
    return PipelineOptions(beam_args)


def prepare_output(plan: JobPlan, tokens: list[str], owner: SpillOwner) -> None:
    """Remove a previous run's shards (a smaller re-run must not leave stale ones), claim the spill for this job and
    write the tokenizer."""
    tokenizer = tokenizer_json_text(plan.config, tokens)
    if text_sha256(tokenizer) != plan.tokenizer_sha256:   # the manifest records the plan's hash
        raise RuntimeError(f"{plan.config.tokenizer.file} changed since the job was planned; run it again")
    out = plan.config.output_dir
    if "://" not in out:
        os.makedirs(out, exist_ok=True)
    report_leftover_spill(out)   # again: another launcher may have started since the plan
    stale = FileSystems.match([FileSystems.join(out, name) for name in ("shard-*", MANIFEST_NAME, NO_INSTANCES_NAME)])
    old = [m.path for result in stale for m in result.metadata_list]
    if old:
        log.info("removing %d files of a previous run in %s", len(old), out)
        FileSystems.delete(old)
    write_owner(out, owner)
    with FileSystems.create(FileSystems.join(out, VOCAB_NAME)) as handle:
        handle.write(vocab_text(tokens).encode("utf-8"))
    with FileSystems.create(FileSystems.join(out, TOKENIZER_NAME)) as handle:
        handle.write(tokenizer.encode("utf-8"))


def plan_job(overrides: list[str], beam_args: list[str]) -> tuple[JobPlan, list[str], DaskSettings]:
    """Config, runner choice and inputs checked, vocabulary ready: everything that can fail before the pipeline
    (or a Dask cluster) starts."""
    config, dask = load_settings(overrides)
    check_runner_choice(dask, beam_args)
    report_leftover_spill(config.output_dir)
    plan, tokens = make_plan(config, existing_manifest(config.output_dir))
    return plan, tokens, dask


def report_leftover_spill(output_dir: str) -> None:
    """An earlier run's spill: removed (and said) when its job has ended; SpillInUse when it may still run."""
    removed = check_leftover_spill(output_dir)
    if removed:
        log.warning("%s", removed)


def execute_on_cluster(plan: JobPlan, tokens: list[str], dask: DaskSettings, beam_args: list[str],
                       started: float) -> dict:
    """`execute` on the Dask cluster that dask.cluster asks for (started here, closed afterwards), or with the
    Beam options as given when dask.cluster=none."""
    with started_cluster(dask) as scheduler_address:
        workers = dask.workers if scheduler_address is not None else None
        options = pipeline_options(dask_runner_args(beam_args, scheduler_address, len(plan.files), workers))
        return execute(plan, tokens, options, started)


def execute(plan: JobPlan, tokens: list[str], options: PipelineOptions, started: float | None = None) -> dict:
    """Run the pipeline to completion; returns the manifest it wrote, with the wall time since `started`.
    Raises NoInstances (data_prep.no_instances) when the job made no instance: it wrote no manifest."""
    started = time.perf_counter() if started is None else started
    log.info("%d input files, %d shards, vocabulary of %d (%s) -> %s", len(plan.files), plan.num_shards,
             plan.vocab_size, plan.vocab_source, plan.config.output_dir)
    owner = owner_of_this_launcher(options)
    prepare_output(plan, tokens, owner)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, plan)
    result, error = None, None
    try:
        result = pipeline.run()
        owner = record_job(plan.config.output_dir, owner, result)
        try:
            result.wait_until_finish()
        finally:
            release_runner_client(result)
    except BaseException as raised:   # Ctrl-C too: a remote job it leaves running keeps its spill
        error = raised
        raise
    finally:
        # The tokenized documents go once the job has ended (the shards hold what was made of them), not before.
        settle_spill(plan.config.output_dir, owner, result, error)
    check_instances_made(plan.config.output_dir)
    manifest = read_manifest(plan.config.output_dir)
    manifest["wall_seconds"] = time.perf_counter() - started
    manifest["beam_counters"] = beam_counters(result)
    return manifest


def beam_counters(result) -> dict[str, int]:
    """The job's counters as the runner committed them (Dataflow shows the same ones in its console)."""
    try:
        query = result.metrics().query(MetricsFilter().with_namespace("data_prep"))
    except NotImplementedError:   # the DaskRunner collects no metrics; the manifest has the same counts
        return {}
    return {counter.key.metric.name: counter.committed for counter in query["counters"]}


def run(argv: list[str]) -> dict:
    """The whole job, for tests and notebooks: same arguments as the command line."""
    started = time.perf_counter()
    overrides, beam_args = split_arguments(argv)
    pipeline_options(beam_args)   # bad Beam options fail here, before a cluster starts
    plan, tokens, dask = plan_job(overrides, beam_args)
    return execute_on_cluster(plan, tokens, dask, beam_args, started)


def format_summary(manifest: dict) -> str:
    totals, stats = manifest["totals"], manifest["statistics"]
    seconds = manifest.get("wall_seconds", float("nan"))
    lines = [
        f"documents read      {totals['documents']:>12,}   from {totals['files']} files",
        f"documents skipped   {sum(manifest['skipped'].values()):>12,}   "
        + (", ".join(f"{k}: {v:,}" for k, v in manifest["skipped"].items()) or "none"),
        *(f"  {line}" for line in input_problem_lines(manifest.get("skipped_where", {}))),
        "repaired            " + (", ".join(f"{k}: {v:,}" for k, v in manifest["repaired"].items()) or "none"),
        f"sentences           {totals['sentences']:>12,}",
        f"input tokens        {totals['input_tokens']:>12,}",
        f"instances           {totals['instances']:>12,}   in {len(manifest['shards'])} shards",
        f"output tokens       {totals['tokens']:>12,}",
        f"masked token share  {stats['masked_token_share']:>12.4f}",
        f"mean length         {stats['mean_instance_length']:>12.2f}   tokens per instance",
    ]
    if "random_next_share" in stats:   # sentence pairs (objective mlm_nsp)
        lines += [
            f"short-target share  {stats['short_target_share']:>12.4f}",
            f"random-next share   {stats['random_next_share']:>12.4f}   (NSP label 1; expected "
            f"{stats.get('expected_random_next_share', float('nan')):.4f})",
            f"  B from A's document {totals.get('random_next_from_same_document', 0):>10,}   "
            "(bucket of one document: B at least a sequence away from A)",
            f"  no random B found   {totals.get('chunks_without_random_document', 0):>10,}   "
            "chunks (took the actual next)",
        ]
    else:
        lines.append("objective           MLM only: contiguous text packed into full sequences, no NSP labels")
    lines += [
        f"wall time           {seconds:>12.1f} s   (vocabulary and pipeline start-up included)",
        f"throughput          {totals['tokens'] / seconds:>12,.0f}   output tokens/s",
    ]
    lines += [f"WARNING: {warning}" for warning in manifest.get("warnings", [])]
    return "\n".join(lines)


def help_text() -> str:
    """What --help prints: the presets, the keys a preset sets, and how Beam's options pass through."""
    presets = []
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
        presets.append(f"  {path.stem:<20}{'(default) ' if path.stem == DEFAULT_PRESET else ''}{first}")
    keys = []
    for field in dataclasses.fields(PrepConfig):
        if field.name in ("vocab", "tokenizer"):
            continue
        default = "required" if field.default is dataclasses.MISSING else f"default {field.default!r}"
        how = f"   (not in the presets: +{field.name}=...)" if field.name in KEYS_NOT_IN_PRESETS else ""
        keys.append(f"  {field.name:<26}{default}{how}")
    return "\n".join([
        "usage: python data_prep/run.py [preset=NAME] [key=value ...] [--beam_option=value ...]",
        "",
        "Raw text (Wikipedia dumps, books, sentence files, JSONL/Parquet) -> tokenized, masked sentence-pair shards",
        "and manifest.json, on any Apache Beam runner.",
        "",
        "presets (conf/data_prep/):",
        *presets,
        "",
        "keys (Hydra overrides of the preset, e.g. inputs='[/data/wiki/, {path: /data/b/*.txt, format: books}]'):",
        *keys,
        "  vocab.file, vocab.size, vocab.lowercase, vocab.sample_mb, vocab.min_frequency   (the vocabulary)",
        "  tokenizer.file   (any tokenizer.json instead, e.g. ModernBERT's; with vocab.file=null)",
        "  dask.cluster=none|local|slurm, dask.workers, dask.slurm.{partition,account,cores,processes,memory,",
        "    walltime,job_extra_directives,interface,log_directory,startup_timeout_s}   (a Dask cluster started and",
        "    stopped by the job, running Beam's DaskRunner; they shape no data)",
        "",
        "Beam pipeline options: every argument starting with -- is passed to Beam untouched, e.g.",
        "  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp --setup_file=./setup.py",
        "  --runner=FlinkRunner --flink_master=HOST:8081",
        "  --runner=apache_beam.runners.dask.dask_runner.DaskRunner --dask_client_address=HOST:PORT   (a running Dask)",
        "With no --runner: the DirectRunner with one worker process per core.",
    ])


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.WARNING)   # per-worker start/stop lines of a Dask cluster
    # Relayed worker warnings about options meant for the launcher; not the user's concern.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    overrides, beam_args = split_arguments(argv)
    try:
        pipeline_options(beam_args)
        plan, tokens, dask = plan_job(overrides, beam_args)
    except (ValueError, FileNotFoundError) as error:  # bad options, config, inputs or a spill in use: nothing started
        print(f"data_prep: error: {error}", file=sys.stderr)
        return 2
    try:
        with worker_stderr_filtered():
            manifest = execute_on_cluster(plan, tokens, dask, beam_args, started)
    except NoInstances as error:   # the job ran and made nothing to train on
        print(f"data_prep: error: {error}", file=sys.stderr)
        return 1
    print(format_summary(manifest))
    print(f"shards, tokenizer and {MANIFEST_NAME} in {plan.config.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
