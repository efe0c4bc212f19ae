"""What the launcher settles before the pipeline starts: the input files, the shard count, the vocabulary.

Everything that can be wrong with the request (a missing path, a bad vocabulary) fails here, with a clear
message, before a single worker starts.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import glob
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

from apache_beam.io.filesystems import FileSystems

from data_prep.config import InputSpec, PrepConfig
from data_prep.documents import Document
from data_prep.layout import TOKENIZER_NAME, VOCAB_NAME
from data_prep.readers import detect_format, read_documents
from data_prep.shard_sizing import size_shards
from data_prep.vocab import (
    TOKENIZER_JSON,
    WORDPIECE,
    build_tokenizer,
    parse_vocab,
    text_sha256,
    tokenizer_json_tokens,
    train_vocab,
    vocab_sha256,
    whole_word_problem,
)

log = logging.getLogger(__name__)

_GLOB_CHARS = "*?["
_SNIFF_THREADS = 16


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    format: str
    source_name: str     # stable name: the path below the input's base, so moving the corpus changes nothing
    text_column: str
    size_bytes: int


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """Everything workers need, and small: Beam pickles it into every step, so the vocabulary itself stays out
    (workers read it from the output directory, where the launcher writes it before the pipeline starts)."""

    config: PrepConfig
    files: tuple[InputFile, ...]
    num_shards: int
    vocab_source: str    # the vocab.txt it was loaded from, or "trained"
    vocab_size: int
    vocab_sha256: str
    sizing: dict = dataclasses.field(default_factory=dict, hash=False)   # how num_shards was chosen (shard_sizing)
    tokenizer_kind: str = WORDPIECE    # WORDPIECE (built from the vocabulary) or TOKENIZER_JSON (tokenizer.file)
    tokenizer_sha256: str = ""         # of the tokenizer.json the set holds

    @property
    def vocab_path(self) -> str:
        return FileSystems.join(self.config.output_dir, VOCAB_NAME)

    def vocab_tokens(self) -> list[str]:
        return list(_read_vocab(self.vocab_path, self.vocab_sha256))

    def tokenizer_json(self) -> str:
        """The set's tokenizer.json, as the launcher wrote it (workers of a tokenizer.file job encode with it)."""
        return _read_checked(FileSystems.join(self.config.output_dir, TOKENIZER_NAME), self.tokenizer_sha256)


@functools.lru_cache(maxsize=4)
def _read_vocab(path: str, expected_sha256: str) -> tuple[str, ...]:
    with FileSystems.open(path) as handle:
        tokens = parse_vocab(handle.read().decode("utf-8"))
    if vocab_sha256(tokens) != expected_sha256:
        raise RuntimeError(f"{path} changed while the job ran (sha256 differs from the plan's)")
    return tuple(tokens)


@functools.lru_cache(maxsize=2)
def _read_checked(path: str, expected_sha256: str) -> str:
    with FileSystems.open(path) as handle:
        text = handle.read().decode("utf-8")
    if text_sha256(text) != expected_sha256:
        raise RuntimeError(f"{path} changed while the job ran (sha256 differs from the plan's)")
    return text


class InputError(ValueError):
    pass


def expand_inputs(specs: tuple[InputSpec, ...]) -> tuple[InputFile, ...]:
    """Every input file, once, with its format and its stable name (see `source_names`)."""
    matched_per_input: list[tuple[InputSpec, str, list]] = []
    seen: set[str] = set()
    for spec in specs:
        pattern, base = _pattern_and_base(spec.path)
        matched = [m for m in _match(pattern) if not os.path.basename(m.path).startswith(".")]
        if not matched:
            raise InputError(f"input {spec.path!r} matched no files")
        fresh = [m for m in sorted(matched, key=lambda m: m.path) if m.path not in seen]
        seen.update(m.path for m in fresh)
        matched_per_input.append((spec, base, fresh))
    names = source_names([(base, [m.path for m in fresh]) for _, base, fresh in matched_per_input])
    auto = [m.path for spec, _, fresh in matched_per_input if spec.format == "auto" for m in fresh]
    with concurrent.futures.ThreadPoolExecutor(_SNIFF_THREADS) as pool:   # reads a few KB of each: I/O bound
        detected = dict(zip(auto, pool.map(detect_format, auto)))
    return tuple(InputFile(m.path, detected.get(m.path, spec.format), names[m.path], spec.text_column,
                           m.size_in_bytes)
                 for spec, _, fresh in matched_per_input for m in fresh)


def source_names(inputs: list[tuple[str, list[str]]]) -> dict[str, str]:
    """Each file's stable name (its documents' identity): its path below its input's base directory, so moving
    the corpus changes nothing. Where inputs hold files of the same relative name (two WikiExtractor runs, each
    with AA/wiki_00), every file of those inputs is named below the last components of its base that tell the
    bases apart (enwiki/AA/wiki_00, simplewiki/AA/wiki_00); inputs that share no name keep their plain names."""
    relative = {path: _relative_name(path, base) for base, paths in inputs for path in paths}
    owners: dict[str, set[int]] = {}
    for index, (_, paths) in enumerate(inputs):
        for path in paths:
            owners.setdefault(relative[path], set()).add(index)
    clashing = sorted({i for holders in owners.values() if len(holders) > 1 for i in holders})
    labels = _distinguishing_labels([inputs[i][0] for i in clashing])
    names = dict(relative)
    for index, label in zip(clashing, labels):
        for path in inputs[index][1]:
            names[path] = f"{label}/{relative[path]}"
    counts = collections.Counter(names.values())
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:   # only where a qualified name meets a plain one of a third input
        raise InputError(f"inputs from different places give files the same name {duplicates[:5]}: document "
                         "identities would collide; pass the inputs from directories with distinct names")
    return names


def _relative_name(path: str, base: str) -> str:
    return os.path.relpath(path, base) if "://" not in path else path[len(base):].lstrip("/")


def _distinguishing_labels(bases: list[str]) -> list[str]:
    """The fewest trailing components of each base that make all of them distinct ('/x/enwiki', '/y/enwiki' ->
    'x/enwiki', 'y/enwiki')."""
    parts = [[p for p in base.replace("://", "/").split("/") if p not in ("", ".")] for base in bases]
    for depth in range(1, max((len(p) for p in parts), default=0) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return ["/".join(p) for p in parts]


def _pattern_and_base(path: str) -> tuple[str, str]:
    """A glob for the files, and the directory that file names are taken relative to."""
    if any(char in path for char in _GLOB_CHARS):
        prefix = path[: min(path.index(c) for c in _GLOB_CHARS if c in path)]
        return path, prefix.rsplit("/", 1)[0] if "/" in prefix else "."
    if "://" not in path and os.path.isdir(path):
        return os.path.join(path, "**"), path
    if "://" in path and path.endswith("/"):
        return path + "**", path
    return path, os.path.dirname(path) or "."


def _match(pattern: str):
    if "://" in pattern:
        return FileSystems.match([pattern])[0].metadata_list
    # Local files: Python's glob (recursive **), then Beam's metadata for sizes.
    paths = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
    return [FileSystems.match([glob.escape(p)])[0].metadata_list[0] for p in paths]


def load_or_train_vocab(config: PrepConfig, files: tuple[InputFile, ...]) -> tuple[list[str], str]:
    if config.tokenizer.file is not None:
        return tokenizer_json_tokens(read_tokenizer_file(config)), config.tokenizer.file
    if config.vocab.file is not None:
        with FileSystems.open(config.vocab.file) as handle:
            return parse_vocab(handle.read().decode("utf-8")), config.vocab.file
    log.info("training a %d-token WordPiece vocabulary on up to %.0f MB of the corpus",
             config.vocab.size, config.vocab.sample_mb)
    tokens = train_vocab(_vocab_sample(files, config.vocab.sample_mb, config.max_line_chars), config.vocab.size,
                         config.vocab.lowercase, config.vocab.min_frequency)
    return tokens, "trained"


def _vocab_sample(files: tuple[InputFile, ...], sample_mb: float, max_line_chars: int) -> Iterator[str]:
    """Paragraphs from the start of every file, an equal share of the budget each, so all sources are seen; read as
    the job reads them (lines over max_line_chars left out)."""
    per_file = sample_mb * 1e6 / max(len(files), 1)
    for input_file in files:
        taken = 0
        documents = (item for item in read_documents(input_file.path, input_file.format, input_file.source_name,
                                                     text_column=input_file.text_column, max_line_chars=max_line_chars)
                     if isinstance(item, Document))
        for paragraph in itertools.chain.from_iterable(doc.paragraphs for doc in documents):
            yield paragraph
            taken += len(paragraph)
            if taken >= per_file:
                break


def read_tokenizer_file(config: PrepConfig) -> str:
    """The text of tokenizer.file, refused here if whole-word masking cannot use it."""
    with FileSystems.open(config.tokenizer.file) as handle:
        text = handle.read().decode("utf-8")
    problem = whole_word_problem(text) if config.whole_word_masking else None
    if problem:
        raise ValueError(f"tokenizer.file {config.tokenizer.file}: {problem}")
    return text


def tokenizer_json_text(config: PrepConfig, tokens: list[str]) -> str:
    """What the set's tokenizer.json holds: tokenizer.file as it is, else BERT's tokenizer built from the vocabulary."""
    if config.tokenizer.file is not None:
        return read_tokenizer_file(config)
    return build_tokenizer(tokens, config.vocab.lowercase).to_str()


def make_plan(config: PrepConfig, existing_manifest: dict[str, Any] | None = None) -> tuple[JobPlan, list[str]]:
    """The plan, and the vocabulary for the launcher to write where the plan says workers will read it.
    `existing_manifest`: the shard set already in the output directory, whose shard count a re-run keeps."""
    files = expand_inputs(config.inputs)
    num_shards, sizing = size_shards(config, files, existing_manifest)
    tokens, source = load_or_train_vocab(config, files)
    kind = TOKENIZER_JSON if config.tokenizer.file is not None else WORDPIECE
    return JobPlan(config, files, num_shards, source, len(tokens), vocab_sha256(tokens), sizing, kind,
                   text_sha256(tokenizer_json_text(config, tokens))), tokens
