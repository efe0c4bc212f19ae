"""The collator on real shard rows: padding, segments, attention mask, static labels, dynamic masking."""
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from data_prep.masking import mask_batch
from data_prep.seeding import mix_seeds, stable_seed
from model.shared.outputs import IGNORE_INDEX
from pipeline.pretraining.data.collator import PretrainingCollator, dynamic_masking_seeds
from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.rows import RowGroupReader
from pipeline.pretraining.data.shard_set import ShardSet
from tests.helpers.shard_sets import SMALL_BOOKS, shared_books_set


def books_set(tmp_path_factory, shared_data, masking):
    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    return ShardSet.open(shared_books_set(tmp_path_factory, masking, books, f"masking={masking}"), max_seq_length=128,
                         vocab_size=30522)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def static_set(tmp_path_factory, shared_data):
    return books_set(tmp_path_factory, shared_data, "static")


@pytest.fixture(scope="session")
def dynamic_set(tmp_path_factory, shared_data):
    return books_set(tmp_path_factory, shared_data, "dynamic")


def shard_rows(shard_set):
    """Every row of the set as Python lists, by global row index (the set has one row group per shard here)."""
    rows = []
    for shard in shard_set.shards:
        rows += pq.read_table(shard.path).to_pylist()
    return rows


def read_rows(shard_set, indices):
    """Rows (the loader's representation) of the first row group, in the order of `indices`."""
    reader = RowGroupReader(shard_set)
    return reader.read([Piece(0, 0, int(shard_set.row_groups.rows[0]))]).take(np.asarray(indices))


def test_static_batches_hold_the_shard_rows_padded_with_segments_mask_and_labels(static_set):
    rows = shard_rows(static_set)
    short = next(i for i in range(int(static_set.row_groups.rows[0])) if len(rows[i]["input_ids"]) < 120)
    indices = [5, 17, 3, 400, 250, 8, 13, short]   # one short row at least: a batch without padding has no mask
    batch = PretrainingCollator.for_shard_set(static_set)(read_rows(static_set, indices), epoch=0)
    expected = [rows[i] for i in indices]
    longest = max(len(row["input_ids"]) for row in expected)
    width = batch["input_ids"].shape[1]
    assert width == min(128, -(-longest // 8) * 8) and width % 8 == 0
    assert {name: tuple(t.shape) for name, t in batch.items()} == {
        "input_ids": (8, width), "token_type_ids": (8, width), "attention_mask": (8, width),
        "masked_positions": (8, 20), "masked_lm_labels": (8, 20), "next_sentence_labels": (8,)}
    assert all(t.dtype == torch.int64 for t in batch.values())
    for b, row in enumerate(expected):
        n, n_a, k = len(row["input_ids"]), row["num_tokens_a"], len(row["masked_lm_positions"])
        assert batch["input_ids"][b, :n].tolist() == row["input_ids"]
        assert (batch["input_ids"][b, n:] == static_set.special_tokens.pad).all()
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (width - n)
        assert batch["token_type_ids"][b].tolist() == [0] * (n_a + 2) + [1] * (n - n_a - 2) + [0] * (width - n)
        assert batch["masked_positions"][b].tolist() == row["masked_lm_positions"] + [0] * (20 - k)
        assert batch["masked_lm_labels"][b].tolist() == row["masked_lm_ids"] + [IGNORE_INDEX] * (20 - k)
        assert batch["next_sentence_labels"][b].item() == row["next_sentence_label"]


def test_a_batch_without_padding_has_no_attention_mask_and_the_same_loss(static_set):
    """No mask where no row is padded, so that SDPA may take its flash kernel; the model's losses are those of the
    all-ones mask the collator sent before (bitwise in training, with dropout: the CPU attention path draws the same
    masks; SDPA's kernels in evaluation may differ by rounding)."""
    from model import BertConfig, BertForPreTraining

    lengths = [len(row["input_ids"]) for row in shard_rows(static_set)[:int(static_set.row_groups.rows[0])]]
    full = [i for i, n in enumerate(lengths) if n == 128][:4]
    short = next(i for i, n in enumerate(lengths) if n < 120)
    collator = PretrainingCollator.for_shard_set(static_set)
    batch = collator(read_rows(static_set, full), epoch=0)
    assert "attention_mask" not in batch and batch["input_ids"].shape == (4, 128)
    padded = collator(read_rows(static_set, [*full, short]), epoch=0)
    assert padded["attention_mask"].shape == (5, 128) and padded["attention_mask"].sum(1).tolist() == \
        [128] * 4 + [lengths[short]]

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    with_mask = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    for training in (True, False):
        model.train(training)
        losses = []
        for inputs in (batch, with_mask):
            torch.manual_seed(1)
            losses.append(model(**inputs).loss)
        if training:
            assert torch.equal(losses[0], losses[1])
        else:
            torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=0)


def test_padding_rounds_up_to_the_multiple_and_never_beyond_max_seq_length(static_set):
    collator = PretrainingCollator.for_shard_set(static_set, pad_to_multiple_of=8)
    assert [collator.padded_length(np.array([n])) for n in (1, 8, 9, 121, 127, 128)] == [8, 8, 16, 128, 128, 128]
    odd = PretrainingCollator(max_seq_length=130, max_predictions_per_seq=20, pad_id=0, masking="static")
    assert odd.padded_length(np.array([129])) == 130      # 136 would pass max_seq_length
    with pytest.raises(ValueError, match="more than max_seq_length"):
        odd.padded_length(np.array([131]))


def test_dynamic_masking_is_data_preps_mask_batch_seeded_by_seed_epoch_and_row(dynamic_set):
    collator = PretrainingCollator.for_shard_set(dynamic_set, seed=7)
    rows = read_rows(dynamic_set, [11, 4, 250, 1000, 37, 2])
    batch = collator(rows, epoch=3)
    # The seeds, spelled out with data_prep.seeding.
    seeds = mix_seeds(np.full(len(rows), stable_seed(7, "dynamic-masking", 3), dtype=np.uint64), rows.row_index)
    assert np.array_equal(dynamic_masking_seeds(7, 3, rows.row_index), seeds)
    # The same rows, unmasked and padded to max_seq_length, through mask_batch itself.
    unmasked = np.zeros((len(rows), 128), dtype=np.int64)
    for b, row in enumerate(shard_rows(dynamic_set)[i] for i in rows.row_index):
        unmasked[b, :len(row["input_ids"])] = row["input_ids"]
    expected = mask_batch(unmasked, rows.num_tokens, rows.num_tokens_a, seeds, dynamic_set.masking_config,
                          dynamic_set.masking_vocab)
    width = batch["input_ids"].shape[1]
    assert np.array_equal(batch["input_ids"].numpy(), expected.input_ids[:, :width])
    assert np.array_equal(batch["masked_positions"].numpy(), expected.positions)
    is_label = np.arange(20)[None, :] < expected.num_masked[:, None]
    assert np.array_equal(batch["masked_lm_labels"].numpy(), np.where(is_label, expected.labels, IGNORE_INDEX))
    assert (batch["masked_lm_labels"] != IGNORE_INDEX).sum(1).tolist() == expected.num_masked.tolist()


def test_the_loader_masks_whole_row_groups_exactly_as_batches_are_masked(dynamic_set):
    from pipeline.pretraining.data.dataset import PretrainingDataset
    collator = PretrainingCollator.for_shard_set(dynamic_set, seed=3, return_row_index=True)
    data = PretrainingDataset(dynamic_set, 32, seed=3, epoch=2, return_row_index=True)
    for batch in list(data)[:3]:
        rows = read_rows(dynamic_set, batch["row_index"].numpy())   # the same rows, unmasked
        expected = collator(rows, epoch=2)                           # masked as one batch
        assert all(torch.equal(batch[name], expected[name]) for name in expected)


def test_a_row_is_masked_alike_in_any_batch_but_anew_each_epoch(dynamic_set):
    collator = PretrainingCollator.for_shard_set(dynamic_set)
    alone = collator(read_rows(dynamic_set, [250]), epoch=0)
    among = collator(read_rows(dynamic_set, [3, 250, 40, 41]), epoch=0)
    width = alone["input_ids"].shape[1]
    for name in ("input_ids", "masked_positions", "masked_lm_labels"):
        assert torch.equal(alone[name][0, :width], among[name][1, :width])
    epochs = [collator(read_rows(dynamic_set, range(64)), epoch=e)["masked_positions"] for e in (0, 1)]
    assert (epochs[0] != epochs[1]).any(dim=1).float().mean() > 0.9


def test_a_collated_batch_trains_the_model(static_set, dynamic_set):
    from model.bert.config import BertConfig
    from model.bert.model import BertForPreTraining
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    for shard_set in (static_set, dynamic_set):
        batch = PretrainingCollator.for_shard_set(shard_set)(read_rows(shard_set, range(4)), epoch=0)
        out = model(**batch)
        assert torch.isfinite(out.loss) and out.mlm_total.item() == (batch["masked_lm_labels"] != -100).sum()
