"""Entry point: per-layer feature vectors of any BERT checkpoint fine-tuning accepts, for a file of sentences.

    python pipeline/extract_features.py init=outputs/train/demo input=sentences.txt layers=[-1,-2,-3,-4]
    python pipeline/extract_features.py init=<run> input=pipeline/finetuning/sample_data/SST-2/dev.tsv \
        column=sentence combinations=[sum_last_four,concat_last_four] per_token=false output_format=numpy
    python pipeline/extract_features.py init=<run> input=in.txt output_format=jsonl   # the reference's layout

A run writes features.parquet (or features/ for numpy, features.jsonl) and report.json into its output directory:
what was extracted, skipped (empty lines, bad records), repaired (lines that were not UTF-8) and truncated, with the
first line numbers of each. `extract_features(cfg)` is the same run as a function. See pipeline/extraction/.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import InterpolationResolutionError  # noqa: E402

CONFIG_DIR = REPO_ROOT / "conf"
OUTPUT_NAMES = {"parquet": "features.parquet", "numpy": "features", "jsonl": "features.jsonl"}
log = logging.getLogger("pipeline.extract_features")


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python pipeline/extract_features.py <overrides>` would run (pass output_dir=...)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="extract_features", overrides=list(overrides))


def extract_features(cfg: DictConfig) -> dict[str, Any]:
    """Run as `cfg` says; returns the report written to report.json, with "output" (the features' path)."""
    import torch
    from tqdm import tqdm

    from pipeline.extraction.extractor import Extractor
    from pipeline.extraction.inputs import InputReport, count_records, detect_format, read_records
    from pipeline.extraction.writers import open_writer

    for key in ("init", "input"):
        if not cfg.get(key):
            raise ValueError(f"{key}= is required: init= the weights (as fine-tuning takes them), input= the text")
    try:
        output_dir = Path(cfg.output_dir).resolve()
    except (InterpolationResolutionError, ValueError) as error:
        raise ValueError("output_dir is not set: pass output_dir=<directory> when calling extract_features()") \
            from error
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


@hydra.main(config_path="../conf", config_name="extract_features", version_base="1.3")
def main(cfg: DictConfig) -> None:
    summary = extract_features(cfg)
    counts = summary["counts"]
    outcomes = ", ".join(f"{key} {counts[key]:,}" for key in ("empty", "repaired", "truncated", "bad_record")
                         if counts.get(key))
    print(f"{summary['sentences']:,} sentences ({summary['sentences_per_second']:,} /s) -> {summary['output']}"
          + (f"\n{outcomes} (first line numbers in report.json)" if outcomes else ""))


if __name__ == "__main__":
    main()
