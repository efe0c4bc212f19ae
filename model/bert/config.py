"""BERT's hyperparameters, with the paper's sizes and the compact sizes of Turc et al. (2019) by name."""
from __future__ import annotations

import dataclasses

# (num_layers, hidden_size, num_heads). tiny..medium are the compact models of "Well-Read Students Learn
# Better" (Turc et al. 2019), base and large those of the BERT paper. All have intermediate = 4 * hidden and
# 64-dimensional heads.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# The uncased English WordPiece vocabulary of the original BERT (data_prep/vocab/bert-base-uncased-vocab.txt).
DEFAULT_VOCAB_SIZE = 30522


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0   # not special inside the model (as in google-research/bert); kept for exports

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range must be > 0, got {self.initializer_range!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id ({self.pad_token_id}) must be a token id "
                             f"below vocab_size ({self.vocab_size})")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> BertConfig:
        """A named size, e.g. ``BertConfig.from_preset("base", vocab_size=32000)``.

        intermediate_size follows 4 * hidden_size (an overridden hidden_size included) unless given.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown BERT preset {name!r}; known presets: {', '.join(PRESETS)}")
        unknown = set(overrides) - {field.name for field in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown BertConfig fields {sorted(unknown)}; "
                             f"fields are: {', '.join(field.name for field in dataclasses.fields(cls))}")
        num_layers, hidden_size, num_heads = PRESETS[name]
        values = dict(vocab_size=DEFAULT_VOCAB_SIZE, num_layers=num_layers, hidden_size=hidden_size,
                      num_heads=num_heads)
        values.update(overrides)
        values.setdefault("intermediate_size", 4 * values["hidden_size"])
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        return cls(**values)
