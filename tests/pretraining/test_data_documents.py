"""Packed documents in training batches: document_ids and position_ids from the rows' document_starts (manifest
format 3), format 2 sets still read, the tokenizer.json checked, and the loader's masking rate override."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.pretraining.data.collator import PretrainingCollator, document_layout
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.rows import RowGroupReader, Rows
from pipeline.pretraining.data.shard_set import ShardSet

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BOOK = Path(__file__).resolve().parents[2] / "data_prep" / "sample_corpus" / "books" / "austen-persuasion.txt"
SEQ, PREDICTIONS = 64, 19          # round(64 * 0.3) = 19


def prepare(root: Path, name: str, *overrides: str) -> Path:
    """An MLM-only set of many short documents (runs of the bundled book's paragraphs), made by the data job."""
    from data_prep.run import run
    corpus = root / "documents.jsonl"
    if not corpus.exists():
        paragraphs = [" ".join(p.split()) for p in BOOK.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        sizes = np.random.default_rng(0).integers(1, 4, size=len(paragraphs))
        with open(corpus, "w", encoding="utf-8") as out:
            begin = 0
            for size in sizes:
                if begin >= 400:
                    break
                out.write(json.dumps({"text": "\n\n".join(paragraphs[begin:begin + size])}) + "\n")
                begin += size
    run([f"inputs=['{corpus}']", f"output_dir={root / name}", "preset=phase1", "num_shards=2", "objective=mlm",
         f"max_seq_length={SEQ}", "masked_lm_prob=0.3", f"max_predictions_per_seq={PREDICTIONS}", "dupe_factor=1",
         *overrides, "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return root / name


@pytest.fixture(scope="module")
def sets_root(tmp_path_factory):
    return tmp_path_factory.mktemp("documents")


@pytest.fixture(scope="module")
def dynamic_path(sets_root):
    return prepare(sets_root, "dynamic", "masking=dynamic")


@pytest.fixture(scope="module")
def dynamic_set(dynamic_path):
    return ShardSet.open(dynamic_path, max_seq_length=SEQ, vocab_size=30522)


@pytest.fixture(scope="module")
def format_2_set(dynamic_path, sets_root):
    """The dynamic set as data_prep wrote MLM-only sets before document boundaries: no document_starts column, format
    2, the tokenizer section without kind and tokenizer_sha256."""
    target = sets_root / "format2"
    shutil.copytree(dynamic_path, target)
    manifest = json.loads((target / "manifest.json").read_text())
    for shard in manifest["shards"]:
        path = target / shard["parquet"]["path"]
        pq.write_table(pq.read_table(path).drop_columns(["document_starts"]), path, compression="zstd")
        data = path.read_bytes()
        shard["parquet"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest.update(format_version=2, schema={"input_ids": "list<item: int16>"})
    for key in ("kind", "tokenizer_sha256"):
        manifest["tokenizer"].pop(key)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return ShardSet.open(target, max_seq_length=SEQ, vocab_size=30522, verify_checksums=True)


def recorded_starts(shard_set) -> list[list[int]]:
    """document_starts of every row, by global row index."""
    return [starts for shard in shard_set.shards
            for starts in pq.read_table(shard.path, columns=["document_starts"]).column(0).to_pylist()]


def test_document_ids_and_position_ids_follow_the_starts_and_ignore_padding():
    rows = Rows(np.arange(100, dtype=np.int16), np.array([0, 10]), np.array([10, 6]), np.array([8, 4]),
                np.zeros(2, np.int8), np.array([0, 1]), document_start_values=np.array([0, 4, 7, 0, 2], np.int16),
                document_start_offsets=np.array([0, 3]), num_documents=np.array([3, 2]))
    document_ids, position_ids = document_layout(rows, np.arange(12)[None, :] < rows.num_tokens[:, None])
    assert document_ids.tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1], [0, 0, 1, 1, 1, 1] + [-1] * 6]
    assert position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 0, 0], [0, 1, 0, 1, 2, 3] + [0] * 6]


def test_loader_batches_carry_each_rows_documents_and_never_mask_cls_or_sep(dynamic_set):
    assert dynamic_set.has_document_boundaries and dynamic_set.columns == ("input_ids", "document_starts")
    starts = recorded_starts(dynamic_set)
    assert sum(len(s) > 1 for s in starts) > len(starts) // 5     # many rows hold several documents
    dataset = PretrainingDataset(dynamic_set, 8, num_workers=2, return_row_index=True, document_layout=True,
                                 masked_lm_prob=0.25, shuffle_buffer_row_groups=1)
    cls, sep = dynamic_set.special_tokens.cls, dynamic_set.special_tokens.sep
    batches = list(dataset)
    for batch in batches:
        document_ids, position_ids = batch["document_ids"].numpy(), batch["position_ids"].numpy()
        is_token = document_ids >= 0
        assert batch["document_ids"].dtype == batch["position_ids"].dtype == batch["input_ids"].dtype
        for row, index in enumerate(batch["row_index"].tolist()):
            begins = np.flatnonzero(is_token[row] & (position_ids[row] == 0))
            assert begins.tolist() == starts[index]
            assert document_ids[row, begins].tolist() == list(range(len(begins)))
        labels = batch["masked_lm_labels"].numpy()
        assert ((labels >= 0).sum(axis=1) == round(SEQ * 0.25)).all()        # the override's rate: 16 of 64
        assert not np.isin(labels, [cls, sep]).any()
    # resuming mid-epoch continues with the same batches, documents and masks
    dataset.set_epoch(0, batches_to_skip=3)
    resumed = list(dataset)
    assert len(resumed) == len(batches) - 3
    for one, two in zip(batches[3:], resumed):
        assert one.keys() == two.keys() and all((one[k] == two[k]).all() for k in one)


def test_without_document_layout_batches_are_what_they_were(dynamic_set, format_2_set):
    assert not format_2_set.has_document_boundaries and format_2_set.columns == ("input_ids",)
    new = PretrainingCollator.for_shard_set(dynamic_set)
    rows = RowGroupReader(dynamic_set).read([Piece(0, 0, 32)])
    old_rows = RowGroupReader(format_2_set).read([Piece(0, 0, 32)])
    assert rows.has_documents and not old_rows.has_documents
    batch = new.arrays(rows, epoch=1)
    old = PretrainingCollator.for_shard_set(format_2_set).arrays(old_rows, epoch=1)
    assert "document_ids" not in batch and batch.keys() == old.keys()
    assert all((batch[k] == old[k]).all() for k in batch)                  # same rows, same masks
    assert ((batch["masked_lm_labels"] >= 0).sum(axis=1) == PREDICTIONS).all()   # the manifest's rate
    # a set that records no boundaries: with document_layout, every row is one document
    laid_out = PretrainingCollator.for_shard_set(format_2_set, document_layout=True).arrays(old_rows, epoch=1)
    assert (laid_out["document_ids"] == 0).all() and (laid_out["position_ids"] == np.arange(SEQ)).all()


def test_an_edited_tokenizer_json_is_refused(dynamic_path, tmp_path):
    edited = tmp_path / "edited"
    shutil.copytree(dynamic_path, edited)
    tokenizer = json.loads((edited / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (edited / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match=r"tokenizer.json differs from the tokenizer \(wordpiece\)"):
        ShardSet.open(edited, max_seq_length=SEQ, vocab_size=30522)
    (edited / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json is missing"):
        ShardSet.open(edited, max_seq_length=SEQ, vocab_size=30522)


def test_a_masking_rate_the_set_cannot_take_is_refused(dynamic_set, sets_root, dynamic_path):
    with pytest.raises(ValueError, match=r"masks 26 tokens.*data.max_predictions_per_seq.*max_predictions_per_seq=26"):
        PretrainingCollator.for_shard_set(dynamic_set, masked_lm_prob=0.4)
    static = ShardSet.open(prepare(sets_root, "static", "masking=static"), max_seq_length=SEQ, vocab_size=30522)
    assert static.has_document_boundaries and static.columns[-2:] == ("masked_lm_positions", "masked_lm_ids")
    with pytest.raises(ValueError, match="static shards carry their masking: re-prepare with masking=dynamic"):
        PretrainingCollator.for_shard_set(static, masked_lm_prob=0.3)

    from pipeline.pretraining.data.datamodule import PretrainingDataModule
    module = PretrainingDataModule(sets_root / "static", SEQ, 30522, micro_batch_size=4, num_workers=0,
                                   masked_lm_prob=0.3)
    with pytest.raises(ValueError, match="static shards carry their masking"):
        module.setup()   # refused when the sets are opened, before any loader exists
    module = PretrainingDataModule(dynamic_path, SEQ, 30522, micro_batch_size=4, num_workers=0,
                                   document_layout=True, masked_lm_prob=0.2)
    batch = next(iter(module.train_dataloader()))
    assert batch["document_ids"].shape == batch["position_ids"].shape == batch["input_ids"].shape
    assert ((batch["masked_lm_labels"] >= 0).sum(dim=1) == round(SEQ * 0.2)).all()
