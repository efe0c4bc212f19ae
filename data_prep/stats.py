"""The statistics the reference is compared on, summed per shard and merged for the manifest."""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class InstanceStats:
    instances: int = 0
    tokens: int = 0                 # output tokens, [CLS]/[SEP] included, padding excluded
    masked_tokens: int = 0
    short_target_instances: int = 0  # made under a target length below max_seq_length - 3
    random_next_instances: int = 0
    one_sentence_chunk_instances: int = 0    # B had to be random (P = 1 instead of random_next_prob)
    random_next_from_same_document: int = 0  # one-document buckets: B from far away in A's own document
    chunks_without_random_document: int = 0  # wanted a random B, found none: took the actual next

    def merge(self, other: InstanceStats) -> InstanceStats:
        return InstanceStats(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                for f in dataclasses.fields(self)})

    def summary(self) -> dict[str, float]:
        """The ratios the reference is judged by (0 where there is nothing to divide)."""
        per_instance = max(self.instances, 1)
        return {
            "masked_token_share": self.masked_tokens / max(self.tokens, 1),
            "mean_instance_length": self.tokens / per_instance,
            "short_target_share": self.short_target_instances / per_instance,
            "random_next_share": self.random_next_instances / per_instance,
        }

    def expected_random_next_share(self, random_next_prob: float) -> float:
        """The share the reference's rule gives these chunks: 1 for one-sentence chunks, random_next_prob else."""
        others = self.instances - self.one_sentence_chunk_instances
        return (self.one_sentence_chunk_instances + random_next_prob * others) / max(self.instances, 1)

    def random_next_warning(self, random_next_prob: float) -> str | None:
        """A warning when the realised random-next share is not a plausible draw around the expected one.

        The tolerance is four binomial standard deviations plus 0.01 (one-sentence chunks are decided by the
        target-length draws, which are few), so a correct job warns in far fewer than one run in a thousand.
        """
        if self.instances == 0:
            return None
        expected = self.expected_random_next_share(random_next_prob)
        realised = self.random_next_instances / self.instances
        others = self.instances - self.one_sentence_chunk_instances
        tolerance = 4 * math.sqrt(random_next_prob * (1 - random_next_prob) * others) / self.instances + 0.01
        if abs(realised - expected) <= tolerance:
            return None
        return (f"random-next share {realised:.4f} is outside the expected {expected:.4f} +- {tolerance:.4f}: "
                f"{self.chunks_without_random_document:,} chunks found no random B (their bucket had one "
                "document, too short to give a B far from A) and took the actual next. A model trained on this "
                "learns less NSP: add documents, or lower num_shards / raise shard_target_mb so buckets hold more")
