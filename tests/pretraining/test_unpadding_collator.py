"""The collator's unpadding option (unpad=True): the indices of the real tokens, made on the host from the rows'
lengths, beside an otherwise unchanged batch; and the model's losses on such a batch of real shard rows."""
import numpy as np
import pytest
import torch

from pipeline.pretraining.data.collator import PretrainingCollator, unpadded_token_index
from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.packed_batch import PackedBatch
from pipeline.pretraining.data.rows import RowGroupReader
from pipeline.pretraining.data.shard_set import ShardSet

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def wiki_set(wiki_shards):
    """Wikipedia's rows: short articles make rows of many lengths (a book's are nearly all 128 tokens)."""
    return ShardSet.open(wiki_shards, max_seq_length=128, vocab_size=30522)


@pytest.fixture(scope="module")
def lengths(wiki_set):
    """Every row's length in the first row group, by row index."""
    return read_rows(wiki_set, np.arange(int(wiki_set.row_groups.rows[0]))).num_tokens.tolist()


def read_rows(shard_set, indices):
    reader = RowGroupReader(shard_set)
    return reader.read([Piece(0, 0, int(shard_set.row_groups.rows[0]))]).take(np.asarray(indices))


def padded_rows(lengths, count=8):
    """`count` rows, a few of them short: a padded batch."""
    short = [i for i, n in enumerate(lengths) if n < 100][:3]
    full = [i for i, n in enumerate(lengths) if n == 128][:count - len(short)]
    return [*full[:2], *short, *full[2:]]


def test_unpadding_adds_the_real_tokens_indices_and_changes_nothing_else(wiki_set, lengths):
    indices = padded_rows(lengths)
    rows = read_rows(wiki_set, indices)
    padded = PretrainingCollator.for_shard_set(wiki_set).arrays(rows, epoch=0)
    unpadded = PretrainingCollator.for_shard_set(wiki_set, unpad=True).arrays(rows, epoch=0)
    token_index = unpadded.pop("token_index")
    assert unpadded.keys() == padded.keys() and all(np.array_equal(unpadded[k], padded[k]) for k in padded)
    assert token_index.dtype == np.int64

    is_token = padded["attention_mask"].astype(bool)
    B, T = is_token.shape
    real = int(is_token.sum())
    assert real == sum(lengths[i] for i in indices) < B * T
    assert len(token_index) == -(-real // 16) * 16   # rounded up to a multiple of pad_to_multiple_of (8) and 16 (FP8)
    assert np.array_equal(token_index[:real], np.flatnonzero(is_token))   # row by row, in order
    assert not is_token.ravel()[token_index[real:]].any()                 # the rest: padding positions
    assert len(np.unique(token_index)) == len(token_index)


def test_a_batch_without_padding_gets_neither_mask_nor_index(wiki_set, lengths):
    full = [i for i, n in enumerate(lengths) if n == 128][:4]
    batch = PretrainingCollator.for_shard_set(wiki_set, unpad=True)(read_rows(wiki_set, full), epoch=0)
    assert "attention_mask" not in batch and "token_index" not in batch   # SDPA may take its flash kernel


def test_fixed_width_rounds_to_whole_rows(wiki_set, lengths):
    """The fixed width of a compiled model (pad_to_multiple_of >= max_seq_length): always a mask and an index, whose
    length is a multiple of the row width, so that a compiled model meets few shapes."""
    collator = PretrainingCollator.for_shard_set(wiki_set, pad_to_multiple_of=128, unpad=True)
    padded = collator(read_rows(wiki_set, padded_rows(lengths)), epoch=0)
    real = int(padded["attention_mask"].sum())
    assert len(padded["token_index"]) == -(-real // 128) * 128 < 8 * 128
    full = collator(read_rows(wiki_set, [i for i, n in enumerate(lengths) if n == 128][:4]), epoch=0)
    assert torch.equal(full["token_index"], torch.arange(4 * 128))


def test_rounding_never_passes_the_batch():
    is_token = np.array([[True, True, True, False], [True, False, False, False]])
    assert unpadded_token_index(is_token, 1).tolist() == [0, 1, 2, 4]
    assert unpadded_token_index(is_token, 3).tolist() == [0, 1, 2, 4, 3, 5]
    assert unpadded_token_index(is_token, 64).tolist() == [0, 1, 2, 4, 3, 5, 6, 7]   # B * T = 8, not 64


def test_the_model_gives_the_padded_losses_on_a_collated_batch(wiki_set, lengths):
    """Through a loader worker's packing too (PackedBatch), with the tiny model in evaluation (no dropout)."""
    from model import BertConfig, BertForPreTraining

    collator = PretrainingCollator.for_shard_set(wiki_set, unpad=True)
    arrays = collator.arrays(read_rows(wiki_set, padded_rows(lengths)), epoch=0)
    batch = PackedBatch.pack(arrays).unpack()
    assert torch.equal(batch["token_index"], torch.from_numpy(arrays["token_index"]))
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522)).eval()
    with torch.no_grad():
        unpadded = model(**batch)
        padded = model(**{k: v for k, v in batch.items() if k != "token_index"})
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(unpadded, name), getattr(padded, name), rtol=1e-5, atol=0)
