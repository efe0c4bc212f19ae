"""Rows -> the model's batch: padded, with segment ids, attention mask and masked-LM targets.

The output is BertForPreTraining.forward's keyword arguments, as int64 tensors:
  input_ids, token_type_ids, attention_mask   (B, T), T = the longest row rounded up to pad_to_multiple_of
                                              (tensor-core friendly shapes), at most max_seq_length; no
                                              attention_mask where no row is padded (see below)
  masked_positions, masked_lm_labels          (B, P), P = max_predictions_per_seq; padding slots hold
                                              position 0 and label -100 (ignored by the loss)
  next_sentence_labels                        (B,), 1 = B is random; absent for MLM-only sets (no NSP)
  document_ids, position_ids                  (B, T), with document_layout=True only: the ordinal of the packed
                                              document each token belongs to in its row (0, 0, ..., 1, 1, ...;
                                              -1 at padding), and its position within that document (0 at each
                                              document start, 0 at padding), so that a model that attends
                                              within documents (ModernBERT-class) never attends across one. From
                                              the rows' document_starts (MLM-only sets, manifest format 3 on);
                                              a row of a set that records none is one document
  token_index                                 (N,) with unpad=True, where a batch has an attention_mask: the flat
                                              indices b * T + t of the real tokens, row by row, then of the first
                                              padding positions up to a rounded N (below); the model's layers
                                              compute on these only (model/shared/unpadding.py)
  with max_pairs_per_row=K, the micro-batch's sentence pairs packed into fewer rows, up to K a row (MLPerf's 3),
  each pair attending within itself: document_ids, position_ids, cls_positions, and per-pair NSP labels and
  masked positions (pair_packing.py)
Static sets carry their masking in the shards. Dynamic sets are masked here by data_prep.masking.mask_batch,
the very code data_prep uses for static sets, seeded per row from (seed, epoch, global row index): a row is
masked the same way whatever batch, worker or rank it lands in, and differently every epoch. The rate is the
manifest's unless for_shard_set is given another (masked_lm_prob; ShardSet.masking_config_at says which are
allowed); never [CLS] nor any [SEP], documents' separators included. Because a row's
masking does not depend on its batch, the loader masks the rows of many batches at once (mask_rows: the
per-call numpy overhead of mask_batch is then shared by 64 batches, which makes masking about twice as fast)
and collates them like static rows; unmasked rows given to the collator are masked per batch, with the same
result.

Fixed shapes: pad_to_multiple_of >= max_seq_length pads every batch to max_seq_length and always gives the
attention_mask, so that every batch of a phase has one shape (what model.compile's single graph and CUDA graphs
need: pipeline/pretraining/run.py sets it there). The padding is masked, so the losses are those of narrower batches.

Otherwise, a batch whose rows all fill its width has no attention_mask: the model then passes no mask to
scaled_dot_product_attention, which can take its flash kernel only without one (any mask, even all ones, sends it to
the memory-efficient or math kernel). Decided here, on the host, from the rows' lengths: the model would need a
device-to-host read (mask.all()) to find out. It applies to small micro-batches only: on the bundled sample (seq
128, Wikipedia pages and books) 80% of the rows are full (google-research/bert draws a short target length for 10%
of the documents, and a document's last instance is often short), and 17% of random micro-batches of 8 have no
padding, 0.06% of 32, none of 64. Larger batches would need unpadding for the flash kernel, and torch 2.13's varlen
attention (torch.nn.attention.varlen.varlen_attn, CUDA only) has no dropout, which BERT's attention trains with.

Unpadding (unpad=True): the collator knows each row's length, so the model gets the real tokens' indices without
reading the mask on the device, and N, a shape, is known to the host. N is rounded up (at most to B * T) to a
multiple of 16 and of pad_to_multiple_of, the granularity of the shapes the model runs at. 16: FP8 training
(model.fp8) contracts over the tokens in its weight gradients, and torch._scaled_mm on CUDA takes no dimension there
that is not a multiple of 16; at most 15 padding tokens computed. Under the fixed width of a compiled model,
max_seq_length, i.e. whole rows: the compiled graph is symbolic in N (pipeline/pretraining/compiled.py marks it
dynamic; with a static N, fullgraph=True raised FailOnRecompileLimitHit at the 9th distinct N), but CUDA graphs record
one capture per distinct N, and whole rows bound them: with 30% of the rows of random length (~15% padding at seq
512), whole rows give about 4 common N for 8 rows a pass, 8 for 32 and 12 for 64, where multiples of 128 give 14, 27
and 36 (simulated), for half a row of padding per pass on average. The padding positions added compute what the
padded model computes there, unread.

Everything is whole-array numpy: gathers with (B, T) index arrays, no loop over rows.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from data_prep.masking import MaskingConfig, MaskingVocab, mask_batch
from data_prep.seeding import mix_seeds, stable_seed
from model.shared.outputs import IGNORE_INDEX
from pipeline.pretraining.data.pair_packing import pack_pairs
from pipeline.pretraining.data.rows import Rows, concat, gather_lists
from pipeline.pretraining.data.shard_set import ShardSet

MASK_CHUNK_ROWS = 8192   # at most this many rows per mask_batch call: bounds its (rows, seq) temporaries
FP8_TOKEN_MULTIPLE = 16  # an unpadded batch's token count is a multiple of this (see the module docstring)


def dynamic_masking_seeds(seed: int, epoch: int, row_index: np.ndarray) -> np.ndarray:
    """The instance seed of each row for dynamic masking in `epoch` (mask_batch's `instance_seeds`)."""
    return _row_seeds(_epoch_seed(seed, epoch), row_index)


@functools.lru_cache(maxsize=4)
def _epoch_seed(seed: int, epoch: int) -> int:
    return stable_seed(seed, "dynamic-masking", epoch)


def _row_seeds(epoch_seed: int, row_index: np.ndarray) -> np.ndarray:
    return mix_seeds(np.full(len(row_index), epoch_seed, dtype=np.uint64), np.asarray(row_index, dtype=np.uint64))


class PretrainingCollator:
    def __init__(self, *, max_seq_length: int, max_predictions_per_seq: int, pad_id: int, masking: str,
                 masking_config: MaskingConfig | None = None, masking_vocab: MaskingVocab | None = None,
                 seed: int = 0, pad_to_multiple_of: int = 8, return_row_index: bool = False,
                 next_sentence_labels: bool = True, unpad: bool = False, document_layout: bool = False,
                 max_pairs_per_row: int | None = None):
        if masking not in ("static", "dynamic"):
            raise ValueError(f"masking must be 'static' or 'dynamic', got {masking!r}")
        if masking == "dynamic" and (masking_config is None or masking_vocab is None):
            raise ValueError("dynamic masking needs masking_config and masking_vocab")
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        if max_pairs_per_row is not None and document_layout:
            raise ValueError("max_pairs_per_row packs BERT's sentence pairs; document_layout describes rows of packed "
                             "documents already (ModernBERT's sets): one or the other")
        if max_pairs_per_row is not None and max_pairs_per_row < 1:
            raise ValueError(f"max_pairs_per_row must be >= 1, got {max_pairs_per_row}")
        self.max_seq_length = max_seq_length
        self.fixed_width = pad_to_multiple_of >= max_seq_length   # every batch max_seq_length wide, always masked
        self.max_predictions_per_seq = max_predictions_per_seq
        self.pad_id = pad_id
        self.masking = masking
        self.masking_config = masking_config
        self.masking_vocab = masking_vocab
        self.seed = seed
        self.pad_to_multiple_of = pad_to_multiple_of
        self.return_row_index = return_row_index   # adds "row_index" (B,): for tests and debugging only
        self.next_sentence_labels = next_sentence_labels
        self.unpad = unpad   # adds "token_index" to padded batches (see the module docstring)
        self.document_layout = document_layout   # adds "document_ids" and "position_ids" (see the module docstring)
        self.max_pairs_per_row = max_pairs_per_row   # packs the batch's pairs into fewer rows (pair_packing.py)

    @classmethod
    def for_shard_set(cls, shard_set: ShardSet, masked_lm_prob: float | None = None, **kwargs) -> PretrainingCollator:
        """The collator of the set's rows; masked_lm_prob: dynamic masking at this rate instead of the manifest's."""
        return cls(max_seq_length=shard_set.max_seq_length, max_predictions_per_seq=shard_set.max_predictions_per_seq,
                   pad_id=shard_set.special_tokens.pad, masking=shard_set.masking,
                   masking_config=shard_set.masking_config_at(masked_lm_prob), masking_vocab=shard_set.masking_vocab,
                   next_sentence_labels=shard_set.has_next_sentence_labels, **kwargs)

    def padded_length(self, num_tokens: np.ndarray) -> int:
        longest = int(num_tokens.max())
        if longest > self.max_seq_length:
            raise ValueError(f"a row has {longest} tokens, more than max_seq_length={self.max_seq_length}")
        multiple = self.pad_to_multiple_of
        return min(self.max_seq_length, -(-longest // multiple) * multiple)

    def mask_rows(self, rows: Rows, epoch: int) -> Rows:
        """Dynamic masking of any number of rows, returned with their masking (the layout of static rows)."""
        if rows.is_masked:
            raise ValueError("these rows are masked already")
        return concat([self._mask_chunk(rows.take(np.arange(begin, min(begin + MASK_CHUNK_ROWS, len(rows)))), epoch)
                       for begin in range(0, len(rows), MASK_CHUNK_ROWS)])

    def _mask_chunk(self, rows: Rows, epoch: int) -> Rows:
        num_tokens = rows.num_tokens
        width = self.padded_length(num_tokens)
        is_token = np.arange(width)[None, :] < num_tokens[:, None]
        # Stored dtype (int16 for BERT's vocabularies): masking copies these arrays, so narrow is faster.
        input_ids = _gather_padded(rows.token_values, rows.token_starts, is_token, 0, rows.token_values.dtype)
        masked = mask_batch(input_ids, num_tokens, rows.num_tokens_a,
                            dynamic_masking_seeds(self.seed, epoch, rows.row_index), self.masking_config,
                            self.masking_vocab)
        is_masked = np.arange(masked.positions.shape[1])[None, :] < masked.num_masked[:, None]
        num_masked = masked.num_masked.astype(np.int64)
        return Rows(masked.input_ids[is_token], np.cumsum(num_tokens) - num_tokens, num_tokens, rows.num_tokens_a,
                    rows.next_sentence_label, rows.row_index, masked_positions=masked.positions[is_masked],
                    masked_ids=masked.labels[is_masked], masked_starts=np.cumsum(num_masked) - num_masked,
                    num_masked=num_masked, document_start_values=rows.document_start_values,
                    document_start_offsets=rows.document_start_offsets, num_documents=rows.num_documents)

    def __call__(self, rows: Rows, epoch: int) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(array) for name, array in self.arrays(rows, epoch).items()}

    def arrays(self, rows: Rows, epoch: int) -> dict[str, np.ndarray]:
        """The batch as int64 numpy arrays (what __call__ wraps in tensors)."""
        num_tokens = rows.num_tokens
        width = self.padded_length(num_tokens)
        columns = np.arange(width)
        is_token = columns[None, :] < num_tokens[:, None]                               # (B, T)
        input_ids = _gather_padded(rows.token_values, rows.token_starts, is_token, self.pad_id)
        token_type_ids = (columns[None, :] >= (rows.num_tokens_a + 2)[:, None]) & is_token

        slots = np.arange(self.max_predictions_per_seq)
        if rows.is_masked:    # a static set's rows, or a dynamic set's after mask_rows
            is_masked = slots[None, :] < rows.num_masked[:, None]                          # (B, P)
            positions = _gather_padded(rows.masked_positions, rows.masked_starts, is_masked, 0)
            labels = _gather_padded(rows.masked_ids, rows.masked_starts, is_masked, IGNORE_INDEX)
        else:
            seeds = dynamic_masking_seeds(self.seed, epoch, rows.row_index)
            masked = mask_batch(input_ids, num_tokens, rows.num_tokens_a, seeds, self.masking_config,
                                self.masking_vocab)
            input_ids, positions = masked.input_ids, masked.positions
            labels = np.where(slots[None, :] < masked.num_masked[:, None], masked.labels, IGNORE_INDEX)

        batch = {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids.astype(np.int64),
            "attention_mask": is_token.astype(np.int64),
            "masked_positions": positions,
            "masked_lm_labels": labels,
        }
        if self.next_sentence_labels:
            batch["next_sentence_labels"] = rows.next_sentence_label
        if self.document_layout:
            batch["document_ids"], batch["position_ids"] = document_layout(rows, is_token)
        if self.return_row_index:
            batch["row_index"] = rows.row_index
        if self.max_pairs_per_row is not None:
            batch = pack_pairs(batch, self.max_seq_length, self.max_pairs_per_row, self.padded_length, self.pad_id)
            is_token = batch["attention_mask"].astype(bool)
            width = is_token.shape[1]
        if is_token.all() and not self.fixed_width:   # no row is padded: no mask (see the module docstring)
            del batch["attention_mask"]
        if self.unpad and "attention_mask" in batch:
            multiple = math.lcm(FP8_TOKEN_MULTIPLE, min(self.pad_to_multiple_of, width))
            batch["token_index"] = unpadded_token_index(is_token, multiple)
        return {name: np.ascontiguousarray(array, dtype=np.int64) for name, array in batch.items()}


def document_layout(rows: Rows, is_token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(document_ids, position_ids), each (B, T): see the module docstring."""
    n_rows, width = is_token.shape
    starts = np.zeros((n_rows, width), dtype=bool)                                      # (B, T)
    if rows.has_documents:
        positions, _ = gather_lists(rows.document_start_values, rows.document_start_offsets, rows.num_documents)
        starts[np.repeat(np.arange(n_rows), rows.num_documents), positions] = True
    else:   # a set that records no boundaries: each row is one document
        starts[:, 0] = True
    document_ids = np.cumsum(starts, axis=1) - 1
    columns = np.arange(width)
    document_begins = np.maximum.accumulate(np.where(starts, columns[None, :], 0), axis=1)   # (B, T)
    return np.where(is_token, document_ids, -1), np.where(is_token, columns[None, :] - document_begins, 0)


def unpadded_token_index(is_token: np.ndarray, multiple: int) -> np.ndarray:
    """(N,) flat indices into the (B, T) batch: its real tokens' (is_token) in row order, then as many of its first
    padding positions as make N a multiple of `multiple`, or B * T, whichever is less. No index twice."""
    flat = is_token.ravel()
    real = np.flatnonzero(flat)
    size = min(-(-len(real) // multiple) * multiple, flat.size)
    return np.concatenate([real, np.flatnonzero(~flat)[:size - len(real)]])


def _gather_padded(values: np.ndarray, starts: np.ndarray, valid: np.ndarray, fill: int,
                   dtype: np.dtype = np.int64) -> np.ndarray:
    """(B, W): row b is values[starts[b]:starts[b] + its length], then `fill` where `valid` is False."""
    if len(values) == 0:
        return np.full(valid.shape, fill, dtype=dtype)
    index = starts[:, None] + np.arange(valid.shape[1])[None, :]
    np.minimum(index, len(values) - 1, out=index)   # padding slots may point past the end; they are overwritten
    return np.where(valid, values[index], fill).astype(dtype, copy=False)
