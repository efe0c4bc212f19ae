"""Deterministic randomness: every random choice derives from (seed, document identity, copy index).

Nothing here depends on arrival order, process or worker count, so any runner produces the same instances.
Two kinds of generator are used:
- ``random.Random(stable_seed(...))`` for the sequential, branchy instance algorithm (fast scalar draws);
- ``uniform_keys(...)``, a counter-based hash (splitmix64), for masking: each token position's random number
  is a pure function of (instance seed, position, stream), so masking is vectorised over any batch and gives
  the same result whether one instance or a whole shard is masked at once.
"""
from __future__ import annotations

import hashlib

import numpy as np

_MASK64 = (1 << 64) - 1


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from any printable parts; stable across processes and Python versions (unlike hash())."""
    text = "\x1f".join(str(part) for part in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def mix_seeds(seeds: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """Derive one new 64-bit seed per element from (seed, counter) with the splitmix64 finaliser."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = seeds + (np.asarray(counter, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_at(seeds: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """Uniform floats in [0, 1) that depend only on (seed, position, stream), elementwise (broadcasting)."""
    bits = mix_seeds(mix_seeds(np.asarray(seeds, dtype=np.uint64), stream), np.asarray(positions, dtype=np.uint64))
    # 53 high bits -> a double in [0, 1), as numpy's own generators do.
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def uniform_keys(instance_seeds: np.ndarray, width: int, stream: int) -> np.ndarray:
    """(N, width) uniforms: entry (i, j) is uniform_at(instance_seeds[i], j, stream)."""
    seeds = np.asarray(instance_seeds, dtype=np.uint64)
    return uniform_at(seeds[:, None], np.arange(width, dtype=np.uint64)[None, :], stream)
