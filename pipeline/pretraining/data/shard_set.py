"""A shard set written by data_prep, opened for training: its manifest checked against the model's settings.

Everything that would make training silently wrong (another sequence length, another vocabulary, a format this
reader does not know, missing or truncated shards) is refused here, when the DataModule is set up, before a
single step runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from data_prep.layout import MANIFEST_NAME, TOKENIZER_NAME, VOCAB_NAME, set_file
from data_prep.manifest import read_manifest
from data_prep.masking import MaskingConfig, MaskingVocab
from data_prep.vocab import SPECIAL_TOKENS, parse_vocab, vocab_sha256

# Manifest format versions this reader understands. Not data_prep.manifest_writer.FORMAT_VERSION itself: a newer
# data_prep must be refused until this reader has learnt its format.
# 2: the MLM-only objective's rows (no sentence pair, no NSP label); 3: the same with each row's document_starts.
SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)
DOCUMENT_BOUNDARY_VERSION = 3   # MLM-only sets from this version on record where each row's documents start
MASKING_MODES = ("static", "dynamic")
OBJECTIVES = ("mlm_nsp", "mlm")
BASE_COLUMNS = ("input_ids", "num_tokens_a", "next_sentence_label")
MLM_COLUMNS = ("input_ids",)
DOCUMENT_COLUMNS = ("document_starts",)
STATIC_COLUMNS = ("masked_lm_positions", "masked_lm_ids")
WORDPIECE = "wordpiece"   # the tokenizer kind of a manifest that names none
# The data_prep presets that write each sequence length (for the messages below).
_PRESET_FOR_LENGTH = {128: "phase1", 512: "phase2"}
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SpecialTokenIds:
    pad: int
    cls: int
    sep: int
    mask: int


@dataclasses.dataclass(frozen=True)
class ShardFile:
    path: str   # absolute (or URI)
    rows: int


@dataclasses.dataclass(frozen=True, eq=False)
class RowGroups:
    """Every Parquet row group of the set, in set order (shards as the manifest lists them, then file order).

    Arrays rather than objects: a set of the full corpus has tens of thousands of groups, and this table is
    sent to every loader worker.
    """

    file: np.ndarray        # index into ShardSet.shards
    index: np.ndarray       # row group index within that file
    rows: np.ndarray        # rows in the group
    first_row: np.ndarray   # global index of its first row: a row's identity for dynamic masking seeds

    def __len__(self) -> int:
        return len(self.rows)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardSet:
    path: str
    manifest: dict[str, Any]
    shards: tuple[ShardFile, ...]
    row_groups: RowGroups
    special_tokens: SpecialTokenIds
    masking_vocab: MaskingVocab   # what dynamic masking needs: [MASK], replacement ids, '##' pieces

    @property
    def parameters(self) -> dict[str, Any]:
        return self.manifest["parameters"]

    @property
    def objective(self) -> str:
        """'mlm_nsp' (sentence pairs with next-sentence labels) or 'mlm' (contiguous text, no NSP): what the
        model trains on, read from the manifest so that it is never set twice."""
        return objective_of(self.manifest)

    @property
    def has_next_sentence_labels(self) -> bool:
        return self.objective == "mlm_nsp"

    @property
    def has_document_boundaries(self) -> bool:
        """True when every row records where its packed documents start (MLM-only rows of format 3 on): what a
        model that attends within documents needs."""
        return has_document_boundaries(self.manifest)

    @property
    def tokenizer_kind(self) -> str:
        """'wordpiece' (BERT's, from vocab.txt) or 'tokenizer.json' (any tokenizer, given as it is)."""
        return self.manifest["tokenizer"].get("kind", WORDPIECE)

    @property
    def masking(self) -> str:
        """'static' (shards hold masked rows and their labels) or 'dynamic' (the collator masks)."""
        return self.parameters["masking"]

    @property
    def max_seq_length(self) -> int:
        return int(self.parameters["max_seq_length"])

    @property
    def max_predictions_per_seq(self) -> int:
        return int(self.parameters["max_predictions_per_seq"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def masking_config(self) -> MaskingConfig:
        """The masking data_prep used (or would use): the loader masks dynamic sets with exactly this."""
        p = self.parameters
        return MaskingConfig(p["masked_lm_prob"], p["max_predictions_per_seq"], p["whole_word_masking"],
                             packed=self.objective == "mlm")

    def masking_config_at(self, masked_lm_prob: float | None) -> MaskingConfig:
        """masking_config at another rate (None: the manifest's), for the loader's dynamic masking. The masked
        positions stay max_predictions_per_seq wide (the batch shape the manifest fixes), so a rate that would mask
        more of a full row is refused rather than silently capped; static sets carry their masking."""
        if masked_lm_prob is None:
            return self.masking_config
        if self.masking != "dynamic":
            raise ValueError(f"data.masked_lm_prob={masked_lm_prob}: shard set {self.path} is statically masked "
                             f"(at masked_lm_prob={self.parameters['masked_lm_prob']}); static shards carry their "
                             "masking: re-prepare with masking=dynamic, or leave data.masked_lm_prob unset")
        wanted = round(self.max_seq_length * masked_lm_prob)
        if wanted > self.max_predictions_per_seq:
            raise ValueError(f"data.masked_lm_prob={masked_lm_prob} masks {wanted} tokens of a full "
                             f"{self.max_seq_length}-token row, more than the {self.max_predictions_per_seq} masked "
                             f"positions of shard set {self.path} (data.max_predictions_per_seq, from its manifest): "
                             f"lower the rate, or re-run data_prep with max_predictions_per_seq={wanted} (and "
                             f"train with data.max_predictions_per_seq={wanted})")
        return dataclasses.replace(self.masking_config, masked_lm_prob=masked_lm_prob)

    @property
    def total_rows(self) -> int:
        return int(self.row_groups.rows.sum())

    @property
    def columns(self) -> tuple[str, ...]:
        return columns_of(self.manifest)

    @classmethod
    def open(cls, path: str | os.PathLike, *, max_seq_length: int, vocab_size: int,
             verify_checksums: bool | str = False, verification_record: str | os.PathLike | None = None
             ) -> ShardSet:
        """Open the set at `path` for a model of `vocab_size` tokens trained on sequences of `max_seq_length`.

        Raises FileNotFoundError for a missing set or shard, ValueError for a set that does not fit.
        verify_checksums: also hash every shard against the manifest (reads the whole set once, in parallel);
        with verification_record (a JSON file), only the shards that changed since it recorded them as verified
        (verify.py); "full": every shard, whatever the record says.
        """
        path = str(path)
        manifest = _read_manifest(path, max_seq_length)
        _check_fits(path, manifest, max_seq_length, vocab_size)
        from pipeline.pretraining.data.verify import checksum_mode, verify_shard_set
        mode = checksum_mode(verify_checksums)
        if mode is not None:
            record = Path(verification_record) if verification_record is not None else None
            result = verify_shard_set(path, manifest, record=record, full=mode == "full")
            if result.bad_files:
                raise ValueError(f"shard set {path}: {result.bad_files} differ from the sizes and sha256 in its "
                                 "manifest (corrupted or rewritten); restore them from a copy or re-run data_prep. "
                                 "Nothing was trained.")
            log.info("shard set %s: %s", path, result.describe())
        tokens = _read_vocab(path, manifest)
        _check_tokenizer_file(path, manifest)
        shards = tuple(ShardFile(set_file(path, s["parquet"]["path"]), int(s["rows"])) for s in manifest["shards"])
        row_groups = _row_groups(shards, manifest)
        if int(row_groups.rows.sum()) == 0:
            raise ValueError(f"shard set {path} holds no rows: its inputs gave no instances (see the manifest's "
                             "'skipped' counts)")
        special = SpecialTokenIds(*(tokens.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")))
        return cls(path, manifest, shards, row_groups, special,
                   MaskingVocab.from_tokens(tokens, set(SPECIAL_TOKENS)))


def objective_of(manifest: dict[str, Any]) -> str:
    return manifest["parameters"].get("objective", "mlm_nsp")   # manifests before the MLM-only objective: pairs


def has_document_boundaries(manifest: dict[str, Any]) -> bool:
    return objective_of(manifest) == "mlm" and manifest.get("format_version", 1) >= DOCUMENT_BOUNDARY_VERSION


def columns_of(manifest: dict[str, Any]) -> tuple[str, ...]:
    base = BASE_COLUMNS if objective_of(manifest) == "mlm_nsp" else MLM_COLUMNS
    documents = DOCUMENT_COLUMNS if has_document_boundaries(manifest) else ()
    return base + documents + (STATIC_COLUMNS if manifest["parameters"]["masking"] == "static" else ())


def _prepare_command(path: str, max_seq_length: int) -> str:
    preset = _PRESET_FOR_LENGTH.get(max_seq_length)
    preset_args = f"preset={preset}" if preset else f"preset=phase1 max_seq_length={max_seq_length}"
    return f"python data_prep/run.py {preset_args} inputs='[...]' output_dir={path}"


def _read_manifest(path: str, max_seq_length: int) -> dict[str, Any]:
    if "://" not in path and not os.path.isdir(path):
        raise FileNotFoundError(f"no shard set at {path}: the directory does not exist. Prepare one with "
                                f"`{_prepare_command(path, max_seq_length)}`")
    try:
        return read_manifest(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no shard set at {path}: {MANIFEST_NAME} is missing (data_prep writes it last, "
                                f"so the job never ran there or did not finish). Prepare the set with "
                                f"`{_prepare_command(path, max_seq_length)}`") from None


def _check_fits(path: str, manifest: dict[str, Any], max_seq_length: int, vocab_size: int) -> None:
    version = manifest.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ValueError(f"shard set {path} has manifest format_version {version!r}; this loader reads versions "
                         f"{list(SUPPORTED_FORMAT_VERSIONS)}. Re-run data_prep from this checkout, or update "
                         "pipeline/pretraining/data/ to read the new format.")
    data_length = int(manifest["parameters"]["max_seq_length"])
    if data_length != max_seq_length:
        raise ValueError(
            f"shard set {path} was prepared with max_seq_length={data_length}, but training is configured for "
            f"max_seq_length={max_seq_length}. Either set data.max_seq_length={data_length} in the training config "
            f"(PretrainingDataModule(max_seq_length=...)), or prepare a set of {max_seq_length}-token sequences: "
            f"`{_prepare_command('<new output_dir>', max_seq_length)}`.")
    data_vocab = int(manifest["tokenizer"]["vocab_size"])
    if data_vocab != vocab_size:
        raise ValueError(
            f"shard set {path} was tokenized with a vocabulary of {data_vocab} tokens ({VOCAB_NAME} in the set), "
            f"but the model has vocab_size={vocab_size}. Either set model.vocab_size={data_vocab} in the training "
            f"config, or re-run data_prep with a {vocab_size}-token vocabulary (vocab.file=<its vocab.txt>, or "
            f"vocab.file=null vocab.size={vocab_size} to train one).")
    masking = manifest["parameters"].get("masking")
    if masking not in MASKING_MODES:
        raise ValueError(f"shard set {path} has masking={masking!r}; this loader knows {list(MASKING_MODES)}")
    if objective_of(manifest) not in OBJECTIVES:
        raise ValueError(f"shard set {path} has objective={objective_of(manifest)!r}; this loader knows "
                         f"{list(OBJECTIVES)}")


def filesystem_and_path(path: str):
    """The pyarrow filesystem for a local path or a URI (gs://, s3://, hdfs://), and the path within it."""
    from pyarrow import fs as pafs
    return pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)


def _read_vocab(path: str, manifest: dict[str, Any]) -> list[str]:
    vocab_path = set_file(path, manifest["tokenizer"].get("vocab_file", VOCAB_NAME))
    filesystem, inner = filesystem_and_path(vocab_path)
    try:
        with filesystem.open_input_stream(inner) as handle:
            tokens = parse_vocab(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{vocab_path} is missing: the shard set is incomplete; re-run data_prep") from None
    # A vocabulary edited after the job would give ids that no longer mean what the shards were written with.
    if vocab_sha256(tokens) != manifest["tokenizer"]["vocab_sha256"]:
        raise ValueError(f"{vocab_path} differs from the vocabulary the shards were written with (sha256 in "
                         f"{MANIFEST_NAME}); restore it or re-run data_prep")
    if len(tokens) != int(manifest["tokenizer"]["vocab_size"]):
        raise ValueError(f"{vocab_path} has {len(tokens)} tokens but {MANIFEST_NAME} says "
                         f"{manifest['tokenizer']['vocab_size']}")
    return tokens


def _check_tokenizer_file(path: str, manifest: dict[str, Any]) -> None:
    """The set's tokenizer.json against the sha256 its manifest records (sets that record one: all but BERT's
    sentence pairs of a WordPiece vocabulary, whose tokenizer.json is built from the vocab.txt checked above). A
    tokenizer.json edited after the job would tokenize fine-tuning text into ids the model never learnt."""
    section = manifest["tokenizer"]
    expected = section.get("tokenizer_sha256")
    if expected is None:
        return
    tokenizer_path = set_file(path, section.get("tokenizer_file", TOKENIZER_NAME))
    filesystem, inner = filesystem_and_path(tokenizer_path)
    try:
        with filesystem.open_input_stream(inner) as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        raise FileNotFoundError(f"{tokenizer_path} is missing: the shard set is incomplete; re-run data_prep") from None
    if digest != expected:
        raise ValueError(f"{tokenizer_path} differs from the tokenizer ({section.get('kind', WORDPIECE)}) the shards "
                         f"were written with (sha256 {expected} in {MANIFEST_NAME}, the file's is {digest}); restore "
                         "it or re-run data_prep")


def _row_groups(shards: tuple[ShardFile, ...], manifest: dict[str, Any]) -> RowGroups:
    """Row group sizes from each shard's Parquet footer (a few KB read per file), checked against the manifest."""
    files, indices, rows = [], [], []
    required = columns_of(manifest)
    for file_index, shard in enumerate(shards):
        filesystem, inner = filesystem_and_path(shard.path)
        try:
            metadata = pq.read_metadata(inner, filesystem=filesystem)
        except FileNotFoundError:
            raise FileNotFoundError(f"{shard.path} is listed in the manifest but missing: the shard set is "
                                    "incomplete; re-run data_prep or restore the file") from None
        names = set(metadata.schema.to_arrow_schema().names)
        missing = [c for c in required if c not in names]
        if missing:
            raise ValueError(f"{shard.path} lacks the columns {missing} that its manifest promises")
        sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        if sum(sizes) != shard.rows:
            raise ValueError(f"{shard.path} holds {sum(sizes)} rows but the manifest says {shard.rows}: the file was "
                             "truncated or replaced; re-run data_prep")
        files += [file_index] * len(sizes)
        indices += range(len(sizes))
        rows += sizes
    rows_array = np.array(rows, dtype=np.int64)
    first_row = np.zeros(len(rows_array), dtype=np.int64)
    np.cumsum(rows_array[:-1], out=first_row[1:])
    return RowGroups(np.array(files, dtype=np.int64), np.array(indices, dtype=np.int64), rows_array, first_row)
