"""ModernBERT's hyperparameters (Warner et al. 2024), with its two published sizes and two CPU-sized ones by name.

The fields mean what transformers' ModernBertConfig means by them, under our names where BertConfig has one
(num_layers, num_heads): intermediate_size is the GeGLU width (the input projection is twice that), local_attention
the full sliding window (a token sees local_attention // 2 tokens on each side, itself included in neither).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

# (num_layers, hidden_size, num_heads, intermediate_size). base and large are the published ModernBERT sizes
# (answerdotai/ModernBERT-base and -large). tiny (3 layers, 128 wide, 2 heads, GeGLU 192) and mini (6, 256, 4, 384)
# are ours, for CPU runs and tests: 64-dimensional heads like the published ones, and at least 3 layers so that with
# the default global_attn_every_n_layers=3 both a global (layer 0) and local layers (1, 2) exist.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "modernbert_tiny": (3, 128, 2, 192),
    "modernbert_mini": (6, 256, 4, 384),
    "modernbert_base": (22, 768, 12, 1152),
    "modernbert_large": (28, 1024, 16, 2624),
}

# ModernBERT's own vocabulary size (its OLMo-derived BPE, padded to a multiple of 64); a data-prep tokenizer of
# another size overrides it (ModernBertConfig.from_preset(name, vocab_size=...)).
DEFAULT_VOCAB_SIZE = 50368

CLASSIFIER_POOLINGS = ("cls", "mean")
ATTENTION_BACKENDS = ("auto", "sdpa", "flex")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    # Tells a config (or its to_dict()) apart from a BertConfig's, which has no such key.
    architecture: ClassVar[str] = "modernbert"

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 8192
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    # Ids in the vocabulary, by default our BERT vocabularies' order: [PAD] [UNK] [CLS] [SEP] [MASK].
    pad_token_id: int = 0
    cls_token_id: int = 2
    sep_token_id: int = 3
    mask_token_id: int = 4
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    attention_backend: str = "auto"  # "auto": flex on CUDA (sdpa with attention dropout), sdpa elsewhere

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "global_attn_every_n_layers", "local_attention"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.head_size % 2 != 0:
            raise ValueError(f"the head size hidden_size / num_heads = {self.head_size} must be even: rotary "
                             "embeddings rotate pairs of dimensions")
        if self.local_attention % 2 != 0:
            raise ValueError(f"local_attention must be even, got {self.local_attention}: it is the full sliding "
                             "window, local_attention // 2 tokens on each side of a token (as transformers reads it)")
        for name in ("global_rope_theta", "local_rope_theta", "norm_eps", "initializer_range",
                     "initializer_cutoff_factor"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name in ("embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} ({value!r}) must be a token id below vocab_size ({self.vocab_size})")
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            raise ValueError(f"classifier_pooling must be one of {CLASSIFIER_POOLINGS}, "
                             f"got {self.classifier_pooling!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.attention_backend == "flex" and self.attention_dropout > 0:
            raise ValueError(f"attention_backend='flex' has no attention dropout (flex_attention has none), but "
                             f"attention_dropout={self.attention_dropout}; use 'sdpa' or 'auto'")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    def layer_is_global(self, i: int) -> bool:
        """Whether layer i attends to its whole sequence (else to a sliding window): transformers' rule, so layer 0
        is always global."""
        return i % self.global_attn_every_n_layers == 0

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModernBertConfig:
        """A named size, e.g. ``ModernBertConfig.from_preset("modernbert_base", vocab_size=32768)``."""
        if name not in PRESETS:
            raise ValueError(f"unknown ModernBERT preset {name!r}; known presets: {', '.join(PRESETS)}")
        _check_fields(overrides)
        num_layers, hidden_size, num_heads, intermediate_size = PRESETS[name]
        values = dict(vocab_size=DEFAULT_VOCAB_SIZE, num_layers=num_layers, hidden_size=hidden_size,
                      num_heads=num_heads, intermediate_size=intermediate_size)
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, values: dict) -> ModernBertConfig:
        values = dict(values)
        architecture = values.pop("architecture", cls.architecture)
        if architecture != cls.architecture:
            raise ValueError(f"a config of architecture {architecture!r}, not {cls.architecture!r}")
        _check_fields(values)
        return cls(**values)


def _check_fields(values: dict) -> None:
    names = [field.name for field in dataclasses.fields(ModernBertConfig)]
    unknown = set(values) - set(names)
    if unknown:
        raise ValueError(f"unknown ModernBertConfig fields {sorted(unknown)}; fields are: {', '.join(names)}")
