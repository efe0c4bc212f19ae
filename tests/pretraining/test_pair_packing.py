"""The collator's pair packing (max_pairs_per_row, pipeline/pretraining/data/pair_packing.py): first-fit-decreasing
packing of a micro-batch's sentence pairs, each pair's tokens, masks and labels moved whole into its packed row, and
the model's losses and gradients on real shard rows packed equal to those of the same rows one per row."""
import numpy as np
import pytest
import torch

from model import BertConfig, BertForPreTraining
from pipeline.pretraining.data.collator import PretrainingCollator
from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.pair_packing import first_fit_decreasing, packing_efficiency
from pipeline.pretraining.data.rows import RowGroupReader
from pipeline.pretraining.data.shard_set import ShardSet

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def wiki_set(wiki_shards):
    """Wikipedia's rows at seq 128: short articles make pairs of many lengths."""
    return ShardSet.open(wiki_shards, max_seq_length=128, vocab_size=30522)


@pytest.fixture(scope="module")
def rows(wiki_set):
    """32 rows of the first row group, the short ones among them (what packing has to work with)."""
    reader = RowGroupReader(wiki_set)
    group = reader.read([Piece(0, 0, int(wiki_set.row_groups.rows[0]))])
    short = np.flatnonzero(group.num_tokens < 100)[:20]
    full = np.flatnonzero(group.num_tokens == 128)[:12]
    assert len(short) == 20 and len(full) == 12
    return group.take(np.sort(np.concatenate([short, full])))


def test_first_fit_decreasing():
    lengths = np.array([60, 70, 30, 50, 10, 40, 128, 20])
    row, slot = first_fit_decreasing(lengths, capacity=128, max_per_row=3)
    # 128 | 70 50 | 60 40 20 | 30 10 ... checked as rows of items in the order they went in:
    rows = [[int(i) for i in sorted(np.flatnonzero(row == r), key=lambda i: slot[i])] for r in range(row.max() + 1)]
    assert [[int(lengths[i]) for i in r] for r in rows] == [[128], [70, 50], [60, 40, 20], [30, 10]]
    used = np.bincount(row, weights=lengths)
    assert used.max() <= 128 and np.bincount(row).max() <= 3
    # ties keep batch order, so the result is a function of the lengths alone
    row2, slot2 = first_fit_decreasing(np.array([5, 5, 5]), capacity=10, max_per_row=3)
    assert row2.tolist() == [0, 0, 1] and slot2.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_decreasing(np.array([129]), capacity=128, max_per_row=3)


def test_each_pair_moves_whole_into_its_packed_row(wiki_set, rows):
    unpacked = PretrainingCollator.for_shard_set(wiki_set, return_row_index=True).arrays(rows, epoch=0)
    packed = PretrainingCollator.for_shard_set(wiki_set, return_row_index=True,
                                               max_pairs_per_row=3).arrays(rows, epoch=0)
    R, K = packed["cls_positions"].shape
    assert K == 3 and R < len(rows)
    assert packed["masked_positions"].shape == (R, 3 * wiki_set.max_predictions_per_seq)
    seen = []
    for r in range(R):
        for k in range(K):
            index = int(packed["row_index"][r, k])
            if index < 0:
                assert packed["next_sentence_labels"][r, k] == -100 and not (packed["document_ids"][r] == k).any()
                continue
            b = int(np.flatnonzero(unpacked["row_index"] == index)[0])
            seen.append(index)
            n = int(unpacked["attention_mask"][b].sum())
            start = int(packed["cls_positions"][r, k])
            span = slice(start, start + n)
            for name in ("input_ids", "token_type_ids"):
                assert np.array_equal(packed[name][r, span], unpacked[name][b, :n]), name
            assert (packed["document_ids"][r, span] == k).all() and (packed["document_ids"][r] == k).sum() == n
            assert np.array_equal(packed["position_ids"][r, span], np.arange(n))
            assert packed["next_sentence_labels"][r, k] == unpacked["next_sentence_labels"][b]
            scored = unpacked["masked_lm_labels"][b] != -100
            in_pair = (packed["masked_positions"][r] >= start) & (packed["masked_positions"][r] < start + n)
            in_pair &= packed["masked_lm_labels"][r] != -100
            assert np.array_equal(packed["masked_positions"][r, in_pair] - start,
                                  unpacked["masked_positions"][b, scored])
            assert np.array_equal(packed["masked_lm_labels"][r, in_pair], unpacked["masked_lm_labels"][b, scored])
    assert sorted(seen) == sorted(unpacked["row_index"].tolist())
    assert (packed["masked_lm_labels"] != -100).sum() == (unpacked["masked_lm_labels"] != -100).sum()
    assert packed["attention_mask"].sum() == unpacked["attention_mask"].sum()
    assert (packed["document_ids"] >= 0).sum() == packed["attention_mask"].sum()


def test_packing_efficiency_rises(wiki_set, rows):
    unpacked = PretrainingCollator.for_shard_set(wiki_set).arrays(rows, epoch=0)
    packed = PretrainingCollator.for_shard_set(wiki_set, max_pairs_per_row=3).arrays(rows, epoch=0)
    before = packing_efficiency(unpacked["attention_mask"], 128)
    after = packing_efficiency(packed["attention_mask"], 128)
    print(f"\n{len(rows)} pairs: {len(unpacked['input_ids'])} rows, efficiency {before:.3f} -> "
          f"{len(packed['input_ids'])} rows, {after:.3f}")
    assert after > before and after > 0.9


@pytest.mark.parametrize("unpad", [False, True])
def test_packed_batch_trains_as_the_unpacked_batch(wiki_set, rows, unpad):
    """Real rows through the collator: the same losses, counts and gradients, packed or not (model in eval: no
    dropout); with unpad, the packed batch's layers run on its real tokens only."""
    unpacked = PretrainingCollator.for_shard_set(wiki_set)(rows, epoch=0)
    packed = PretrainingCollator.for_shard_set(wiki_set, max_pairs_per_row=3, unpad=unpad)(rows, epoch=0)
    assert ("token_index" in packed) == unpad
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", max_position_embeddings=128)).eval()
    results = []
    for batch in (unpacked, packed):
        model.zero_grad(set_to_none=True)
        out = model(**batch)
        out.loss.backward()
        results.append((out, {name: p.grad.clone() for name, p in model.named_parameters()}))
    (one_per_row, grads), (packed_out, packed_grads) = results
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(packed_out, name), getattr(one_per_row, name), rtol=1e-5, atol=1e-6)
    for name in ("mlm_correct", "mlm_total", "nsp_correct", "nsp_total"):
        assert int(getattr(packed_out, name)) == int(getattr(one_per_row, name)), name
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_pair_packing_and_document_layout_exclude_each_other(wiki_set):
    with pytest.raises(ValueError, match="one or the other"):
        PretrainingCollator.for_shard_set(wiki_set, max_pairs_per_row=3, document_layout=True)


@pytest.mark.parametrize("stream", ["epochs", "batch_warmup"])
def test_the_loaders_pack_each_micro_batch_of_the_same_rows(wiki_set, stream):
    """Through PretrainingDataset and, under batch warm-up, StepStreamDataset: each packed micro-batch holds exactly
    the rows of the unpacked one (the packing window is the micro-batch: epoch plan, resume and ramp unchanged)."""
    from pipeline.pretraining.data.batch_warmup import BatchWarmup
    from pipeline.pretraining.data.dataset import PretrainingDataset
    from pipeline.pretraining.data.step_stream import StepStreamDataset

    warmup = BatchWarmup(tokens=2 * 8 * 128, start_batch_size=8, increment=8, full_batch_size=16, tokens_per_row=128)

    def batches(max_pairs_per_row):
        if stream == "epochs":
            dataset = PretrainingDataset(wiki_set, 16, return_row_index=True, max_pairs_per_row=max_pairs_per_row)
        else:
            dataset = StepStreamDataset(wiki_set, warmup, 1, return_row_index=True,
                                        max_pairs_per_row=max_pairs_per_row)
        return [batch for _, batch in zip(range(6), iter(dataset))]

    unpacked, packed = batches(None), batches(3)
    sizes = [16] * 6 if stream == "epochs" else [warmup.batch_size(step) for step in range(6)]
    assert [len(b["input_ids"]) for b in unpacked] == sizes and (stream == "epochs" or sizes[0] < sizes[-1])
    for one_per_row, pairs in zip(unpacked, packed):
        index = pairs["row_index"][pairs["row_index"] >= 0]
        assert sorted(index.tolist()) == sorted(one_per_row["row_index"].tolist())
        assert int(pairs["attention_mask"].sum()) == int(one_per_row["attention_mask"].sum())
    assert sum(len(b["input_ids"]) for b in packed) < sum(len(b["input_ids"]) for b in unpacked)
