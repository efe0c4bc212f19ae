"""The two feature programs as functions: `extract_features(cfg)` (pipeline/extract_features.py: per-layer vectors of
a file of sentences) and `run_probe(cfg)` (pipeline/probe.py: how much of SST-2's sentiment a linear classifier reads
off each layer combination of a frozen BERT).

extract_features writes features.parquet (or features/ for numpy, features.jsonl) and report.json into its output
directory: what was extracted, skipped (empty lines, bad records), repaired (lines that were not UTF-8) and truncated,
with the first line numbers of each. run_probe writes probe.md (a table: layer combination x pooling -> test
accuracy), probe.json and probe.png (a bar chart).
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.core import app
from pipeline.extraction import probe
from pipeline.extraction.extractor import Extractor
from pipeline.extraction.inputs import InputReport, count_records, detect_format, read_records
from pipeline.extraction.writers import open_writer
from pipeline.finetuning.tasks import get_task

OUTPUT_NAMES = {"parquet": "features.parquet", "numpy": "features", "jsonl": "features.jsonl"}
log = logging.getLogger("pipeline.extraction")


def extract_features(cfg: DictConfig) -> dict[str, Any]:
    """Run as `cfg` says; returns the report written to report.json, with "output" (the features' path)."""
    for key in ("init", "input"):
        if not cfg.get(key):
            raise ValueError(f"{key}= is required: init= the weights (as fine-tuning takes them), input= the text")
    output_dir = app.output_dir(cfg, "extract_features")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    fmt = str(cfg.output_format)
    if fmt not in OUTPUT_NAMES:
        raise ValueError(f"output_format={fmt} is not one of {', '.join(OUTPUT_NAMES)}")
    input_path = Path(str(cfg.input)).expanduser()
    input_format = detect_format(input_path, cfg.get("format"))

    per_token = bool(cfg.per_token) or fmt == "jsonl"   # the reference's layout is per token
    extractor = Extractor.from_init(str(cfg.init), list(cfg.layers or []), list(cfg.combinations or []),
                                    tokenizer=cfg.get("tokenizer"),
                                    poolings=list(cfg.pooling), per_token=per_token,
                                    max_seq_length=int(cfg.max_seq_length), batch_size=int(cfg.batch_size),
                                    chunk_size=int(cfg.chunk_size))
    report = InputReport()
    records = read_records(input_path, report, input_format, cfg.get("column"), cfg.get("column_b"))
    output_dir.mkdir(parents=True, exist_ok=True)
    views = extractor.views
    writer = open_writer(fmt, output_dir / OUTPUT_NAMES[fmt], views, extractor.poolings, per_token)
    started = time.perf_counter()
    sentences = 0
    with tqdm(total=count_records(input_path, input_format), unit=" lines", disable=not cfg.progress,
              desc="extracting") as progress:
        last_index = -1
        for sentence in extractor.extract(records, report):
            writer.write(sentence, extractor.tokens(sentence.input_ids) if per_token else None)
            sentences += 1
            progress.update(sentence.line_index - last_index)   # skipped lines count as done too
            last_index = sentence.line_index
    output = writer.close()
    seconds = time.perf_counter() - started

    summary = {"init": extractor.source, "input": str(input_path), "input_format": input_format,
               "output": str(output), "output_format": fmt, "views": views, "pooling": list(extractor.poolings),
               "per_token": per_token, "max_seq_length": extractor.max_seq_length, "sentences": sentences,
               "seconds": round(seconds, 3), "sentences_per_second": round(sentences / seconds, 1) if seconds else None,
               **report.as_dict()}
    (output_dir / "report.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    noted = {k: v for k, v in report.counts.items() if k != "extracted" and v}
    log.info("%d sentences -> %s%s", sentences, output,
             f" ({', '.join(f'{k} {v}' for k, v in sorted(noted.items()))})" if noted else "")
    return summary


def read_sst2_sentences(data_dir: str | Path, count: int, cache_dir: str | None = None) -> tuple[list[str], list[int]]:
    """The first `count` sentences of SST-2's training split and their labels, through the task's own reader."""
    task = get_task("sst2")
    path = Path(data_dir).expanduser()
    if not (path / task.splits["train"]).is_file():
        raise FileNotFoundError(f"no SST-2 {task.splits['train']} in {path}: pass data_dir=<an SST-2 folder>")
    rows = task.read("train", str(path), cache_dir=cache_dir)
    if len(rows) < count:
        raise ValueError(f"{path} holds {len(rows):,} training sentences, fewer than sentences={count:,}")
    rows = rows.select(range(count))
    return list(rows["text_a"]), [int(label) for label in rows["label"]]


def run_probe(cfg: DictConfig) -> dict[str, Any]:
    """Run as `cfg` says; returns what probe.json holds, with the table."""
    if not cfg.get("init"):
        raise ValueError("init= is required: the weights to probe (anything fine-tuning's init= takes)")
    output_dir = app.output_dir(cfg, "probe")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    texts, labels = read_sst2_sentences(cfg.data_dir, int(cfg.sentences), cfg.get("cache_dir"))
    extractor = Extractor.from_init(str(cfg.init), layers=None, tokenizer=cfg.get("tokenizer"),
                                    poolings=list(cfg.pooling), per_token=False,
                                    max_seq_length=int(cfg.max_seq_length), batch_size=int(cfg.batch_size))
    result = probe.probe(probe.embed(extractor, texts, labels), int(cfg.seed), float(cfg.test_fraction))
    result["table"] = probe.table(result["accuracy"])
    result["settings"] = {"init": extractor.source, "data_dir": str(cfg.data_dir), "sentences": len(texts),
                          "test_fraction": float(cfg.test_fraction), "seed": int(cfg.seed)}
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "probe.md").write_text(result["table"] + "\n", encoding="utf-8")
    (output_dir / "probe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    result["chart"] = str(probe.bar_chart(
        result["accuracy"], output_dir / "probe.png",
        f"SST-2 linear probe: {len(texts):,} sentences, {result['train']:,} train / {result['test']:,} test"))
    result["output_dir"] = str(output_dir)
    return result


def extraction_summary(summary: dict[str, Any]) -> str:
    """The lines `python pipeline/extract_features.py` prints at the end."""
    counts = summary["counts"]
    outcomes = ", ".join(f"{key} {counts[key]:,}" for key in ("empty", "repaired", "truncated", "bad_record")
                         if counts.get(key))
    return (f"{summary['sentences']:,} sentences ({summary['sentences_per_second']:,} /s) -> {summary['output']}"
            + (f"\n{outcomes} (first line numbers in report.json)" if outcomes else ""))


def probe_summary(result: dict[str, Any]) -> str:
    """The lines `python pipeline/probe.py` prints at the end."""
    return (f"SST-2 probe ({result['train']:,} train / {result['test']:,} test sentences, {result['settings']['init']})"
            f"\n\n{result['table']}\n\nlearned scalar-mix weights (embeddings first): "
            + "; ".join(f"{p} {w}" for p, w in result["mix_weights"].items())
            + f"\noutputs in {result['output_dir']}")
