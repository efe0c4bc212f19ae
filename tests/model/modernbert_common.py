"""What the ModernBERT tests share: a tiny config whose local layers really differ from its global ones, transformers
models built from it with random weights, and padded or packed batches."""
import dataclasses

import torch

from model.modernbert import ModernBertConfig
from model.modernbert.hf_conversion import hf_config_from

# Eager flex_attention (the CPU's) warns that it is not compiled: expected in these tests.
FLEX_WARNING = "ignore:flex_attention called without torch.compile"
VOCAB = 320
ATOL = 1e-5
# 4 layers: global 0 and 3, local 1 and 2. A window of 8 (4 on each side) in rows of 48: local layers see a sixth.
CONFIG = ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB, hidden_size=64, num_layers=4,
                                      local_attention=8)
T = 48
LENGTHS = (48, 37, 19)  # padded to T = 48


def with_backend(config: ModernBertConfig, backend: str) -> ModernBertConfig:
    return dataclasses.replace(config, attention_backend=backend)


def hf_model(cls_name: str, config: ModernBertConfig = CONFIG, attn_implementation: str = "sdpa", seed: int = 0,
             **hf_kwargs):
    """transformers.<cls_name> of our config, random weights (seeded), eval mode."""
    import transformers

    torch.manual_seed(seed)
    hf_config = hf_config_from(config, attn_implementation=attn_implementation, **hf_kwargs)
    return getattr(transformers, cls_name)(hf_config).eval()


def padded_batch(lengths=LENGTHS, seq_len: int = T, seed: int = 0) -> dict:
    """input_ids and attention_mask (B, T) of rows of these lengths ([CLS] first), and their token_index."""
    generator = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    attention_mask = (torch.arange(seq_len)[None, :] < lengths_t[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (len(lengths), seq_len), generator=generator)
    input_ids[:, 0] = CONFIG.cls_token_id
    input_ids[attention_mask == 0] = CONFIG.pad_token_id
    token_index = torch.nonzero(attention_mask.flatten()).flatten()  # row by row, as the collator sends it
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_index": token_index}


def packed_batch(documents_per_row=((24, 18), (48,), (10, 16, 12)), seq_len: int = T, seed: int = 1) -> dict:
    """Rows packing several documents ([CLS] doc [SEP] each), padded to T: input_ids, attention_mask,
    document_ids (-1 at padding), position_ids (restarting at each document), token_index."""
    generator = torch.Generator().manual_seed(seed)
    B = len(documents_per_row)
    input_ids = torch.full((B, seq_len), CONFIG.pad_token_id)
    document_ids = torch.full((B, seq_len), -1)
    position_ids = torch.zeros((B, seq_len), dtype=torch.long)
    for b, lengths in enumerate(documents_per_row):
        start = 0
        for d, n in enumerate(lengths):
            tokens = torch.randint(5, VOCAB, (n,), generator=generator)
            tokens[0], tokens[-1] = CONFIG.cls_token_id, CONFIG.sep_token_id
            input_ids[b, start:start + n] = tokens
            document_ids[b, start:start + n] = d
            position_ids[b, start:start + n] = torch.arange(n)
            start += n
    attention_mask = (document_ids >= 0).long()
    token_index = torch.nonzero(attention_mask.flatten()).flatten()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "document_ids": document_ids,
            "position_ids": position_ids, "token_index": token_index, "documents_per_row": documents_per_row}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()

