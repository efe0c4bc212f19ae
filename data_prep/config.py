"""The data-prep job's settings: a typed view of the Hydra config in conf/data_prep/, validated up front.

Everything that shapes the data lives here and is written into the manifest; runner settings are Beam's
own pipeline options and do not change the output.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from data_prep.readers import FORMATS, MAX_LINE_CHARS

OUTPUT_FORMATS = ("parquet", "tfrecord")
OBJECTIVES = ("mlm_nsp", "mlm")
INTERPOLATION_ONLY_KEYS = ("corpus_root",)  # presets may define these to build paths; they shape nothing
# Keys the presets leave at their default, so that a workflow's stage identity (its composed config) stays what it
# was before they existed; Hydra sets them with a leading '+' (+max_line_chars=N).
KEYS_NOT_IN_PRESETS = ("max_line_chars",)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    path: str                 # a file, a directory, or a glob; local or any Beam filesystem (gs://, s3://)
    format: str = "auto"      # auto | wikipedia | books | sentences | jsonl | parquet
    text_column: str = "text"  # for jsonl and parquet


@dataclasses.dataclass(frozen=True)
class VocabSpec:
    file: str | None = None       # a vocab.txt to load; None trains one
    size: int = 30522             # for training
    lowercase: bool = True
    sample_mb: float = 100.0      # text read (spread over the input files) to train on
    min_frequency: int = 2


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    file: str | None = None       # any tokenizer.json (e.g. ModernBERT's byte-level BPE), instead of vocab.file


@dataclasses.dataclass(frozen=True)
class PrepConfig:
    inputs: tuple[InputSpec, ...]
    output_dir: str
    vocab: VocabSpec = VocabSpec()
    tokenizer: TokenizerSpec = TokenizerSpec()
    objective: str = "mlm_nsp"    # mlm_nsp: BERT's sentence pairs; mlm: contiguous text, no NSP (data_prep/packing.py)
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    random_next_prob: float = 0.5
    whole_word_masking: bool = False
    masking: str = "static"       # static | dynamic
    dupe_factor: int = 5
    seed: int = 12345
    num_shards: int | None = None  # None: one per `shard_target_mb` of (estimated) raw text
    shard_target_mb: float = 64.0
    output_formats: tuple[str, ...] = ("parquet",)
    # Longer lines (and sentences) are not prose, and tokenizing one takes ~16 bytes per byte: skipped and counted
    # (line_too_long, sentence_too_long; data_prep.readers._io.MAX_LINE_CHARS says why this default).
    max_line_chars: int = MAX_LINE_CHARS

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PrepConfig:
        raw = {k: v for k, v in raw.items() if k not in INTERPOLATION_ONLY_KEYS}
        missing = sorted(k for k, v in raw.items() if v == "???")
        if missing:
            raise ValueError(f"data_prep: {missing} must be given "
                             "(e.g. inputs='[/data/wiki/]' output_dir=/data/shards)")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown data_prep option(s) {unknown}; known: {sorted(known)}")
        inputs = raw.get("inputs") or []
        if isinstance(inputs, (str, dict)):
            inputs = [inputs]
        raw["inputs"] = tuple(InputSpec(path=i) if isinstance(i, str) else InputSpec(**i) for i in inputs)
        raw["vocab"] = VocabSpec(**(raw.get("vocab") or {}))
        raw["tokenizer"] = TokenizerSpec(**(raw.get("tokenizer") or {}))
        raw["output_formats"] = tuple(raw.get("output_formats") or ("parquet",))
        config = cls(**raw)
        config.validate()
        return config

    def validate(self) -> None:
        problems = []
        if not self.inputs:
            problems.append("no inputs given (inputs=[path, ...])")
        for spec in self.inputs:
            if spec.format != "auto" and spec.format not in FORMATS:
                problems.append(f"input {spec.path!r}: unknown format {spec.format!r}; "
                                f"one of auto, {', '.join(FORMATS)}")
        if not self.output_dir:
            problems.append("output_dir is empty")
        if self.max_seq_length < 5 or self.max_seq_length > 32767:
            problems.append(f"max_seq_length must be in [5, 32767], got {self.max_seq_length}")
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length - 3:
            problems.append("max_predictions_per_seq must be in [1, max_seq_length - 3], "
                            f"got {self.max_predictions_per_seq}")
        for name in ("masked_lm_prob",):
            if not 0.0 < getattr(self, name) < 1.0:
                problems.append(f"{name} must be in (0, 1), got {getattr(self, name)}")
        for name in ("short_seq_prob", "random_next_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.masking not in ("static", "dynamic"):
            problems.append(f"masking must be 'static' or 'dynamic', got {self.masking!r}")
        if self.dupe_factor < 1:
            problems.append(f"dupe_factor must be >= 1, got {self.dupe_factor}")
        if self.num_shards is not None and self.num_shards < 1:
            problems.append(f"num_shards must be >= 1 or null (auto), got {self.num_shards}")
        if self.max_line_chars < 1:
            problems.append(f"max_line_chars must be >= 1, got {self.max_line_chars}")
        if self.shard_target_mb <= 0:
            problems.append(f"shard_target_mb must be > 0, got {self.shard_target_mb}")
        bad_formats = [f for f in self.output_formats if f not in OUTPUT_FORMATS]
        if bad_formats or "parquet" not in self.output_formats:
            problems.append(f"output_formats must include 'parquet' and only {OUTPUT_FORMATS}, "
                            f"got {list(self.output_formats)}")
        if self.objective not in OBJECTIVES:
            problems.append(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        elif self.objective == "mlm":
            problems += self._mlm_problems()
        if self.masking == "dynamic" and "tfrecord" in self.output_formats:
            problems.append("tfrecord output needs static masking (the reference's format stores masked instances)")
        if self.vocab.file is None and self.vocab.size < 100:
            problems.append(f"vocab.size must be >= 100, got {self.vocab.size}")
        if self.vocab.file is not None and not _exists(self.vocab.file):
            problems.append(f"vocab.file {self.vocab.file!r} does not exist")
        if self.tokenizer.file is not None:
            problems += self._tokenizer_file_problems()
        if problems:
            raise ValueError("invalid data_prep config:\n  - " + "\n  - ".join(problems))

    def _tokenizer_file_problems(self) -> list[str]:
        # Its content (special tokens, whole-word masking's '##' pieces) is checked where it is read: data_prep.plan
        problems = []
        if self.vocab.file is not None:
            problems.append(f"tokenizer.file and vocab.file are exclusive (one tokenizer makes the set); with "
                            f"tokenizer.file={self.tokenizer.file} set vocab.file=null")
        if not _exists(self.tokenizer.file):
            problems.append(f"tokenizer.file {self.tokenizer.file!r} does not exist")
        return problems

    def _mlm_problems(self) -> list[str]:
        problems = []
        if "tfrecord" in self.output_formats:
            problems.append("tfrecord output holds the reference's sentence pairs with next-sentence labels; "
                            "objective=mlm writes parquet only")
        # Every MLM-only instance is full: a cap below its share would lower the masking rate without a word.
        wanted = max(1, round(self.max_seq_length * self.masked_lm_prob))
        if self.max_predictions_per_seq < wanted:
            problems.append(f"max_predictions_per_seq={self.max_predictions_per_seq} masks fewer than "
                            f"masked_lm_prob={self.masked_lm_prob} of a full {self.max_seq_length}-token sequence "
                            f"({wanted}); set max_predictions_per_seq={wanted}")
        return problems

    def data_parameters(self) -> dict[str, Any]:
        """Everything that shapes the instances, for the manifest (and for training to check against)."""
        params = dataclasses.asdict(self)
        params.pop("output_dir")
        if self.tokenizer.file is None:   # WordPiece from vocab.*: the parameters stay what they were before
            params.pop("tokenizer")
        return params


def _exists(path: str) -> bool:
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems
        return FileSystems.exists(path)
    return os.path.exists(path)
