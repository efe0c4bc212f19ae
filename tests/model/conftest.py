import os

# Before transformers / huggingface_hub are imported anywhere: nothing in these tests may reach a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest
import torch

# 2 cores shared with other work.
torch.set_num_threads(1)

CLS_ID, SEP_ID, PAD_ID = 2, 3, 0


def make_batch(vocab_size: int, lengths=(16, 11, 7), max_predictions: int = 4, seed: int = 0) -> dict:
    """A padded batch of sentence pairs with masked positions, in the layout of the training collator.

    masked_positions / masked_lm_labels are (B, P) with padding slots (position 0, label -100);
    full_mlm_labels is the same targets in transformers' (B, T) layout, -100 where nothing is predicted.
    """
    generator = torch.Generator().manual_seed(seed)
    B, T, P = len(lengths), max(lengths), max_predictions
    lengths_t = torch.tensor(lengths)
    attention_mask = (torch.arange(T)[None, :] < lengths_t[:, None]).long()
    input_ids = torch.randint(5, vocab_size, (B, T), generator=generator)
    input_ids[:, 0] = CLS_ID
    input_ids[attention_mask == 0] = PAD_ID
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    masked_positions = torch.zeros(B, P, dtype=torch.long)
    masked_lm_labels = torch.full((B, P), -100, dtype=torch.long)
    full_mlm_labels = torch.full((B, T), -100, dtype=torch.long)
    for b, n in enumerate(lengths):
        token_type_ids[b, n // 2:n] = 1
        k = min(P, max(1, n // 5))   # fewer than P for short rows: padding slots
        positions = torch.sort(torch.randperm(n - 2, generator=generator)[:k] + 1).values
        labels = torch.randint(5, vocab_size, (k,), generator=generator)
        masked_positions[b, :k] = positions
        masked_lm_labels[b, :k] = labels
        full_mlm_labels[b, positions] = labels
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "masked_positions": masked_positions,
        "masked_lm_labels": masked_lm_labels,
        "full_mlm_labels": full_mlm_labels,
        "next_sentence_labels": torch.randint(0, 2, (B,), generator=generator),
    }


@pytest.fixture
def batch_factory():
    return make_batch
