"""The statistics the reference is compared on, summed per shard and merged for the manifest."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class InstanceStats:
    instances: int = 0
    tokens: int = 0                 # output tokens, [CLS]/[SEP] included, padding excluded
    masked_tokens: int = 0
    short_target_instances: int = 0  # made under a target length below max_seq_length - 3
    random_next_instances: int = 0
    chunks_without_random_document: int = 0

    def merge(self, other: "InstanceStats") -> "InstanceStats":
        return InstanceStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def summary(self) -> dict[str, float]:
        """The ratios the reference is judged by (0 where there is nothing to divide)."""
        per_instance = max(self.instances, 1)
        return {
            "masked_token_share": self.masked_tokens / max(self.tokens, 1),
            "mean_instance_length": self.tokens / per_instance,
            "short_target_share": self.short_target_instances / per_instance,
            "random_next_share": self.random_next_instances / per_instance,
        }
