"""Which hidden states make a feature: single layers and the combinations of the BERT paper's Table 7.

Hidden states are indexed as transformers' `output_hidden_states` gives them: 0 is the embeddings, i the output of
layer i, and negative indices count from the last layer (-1 is the last), which is also what google-research/bert's
extract_features.py means by `--layers=-1,-2,-3,-4`.

The paper's combinations (its "sum all 12 layers" sums the Transformer layers, not the embeddings):

    embeddings         the embedding layer's output (after its LayerNorm)
    last               the last layer
    second_to_last     the layer before it
    sum_last_four      the sum of the last four layers
    concat_last_four   the last four side by side (4 x hidden size), last first as in the paper's code
    sum_all            the sum of every Transformer layer
    scalar_mix         ELMo's gamma * sum_j softmax(s)_j h_j over every hidden state, embeddings included: the
                       weights are learned (by the probe, pipeline/extraction/probe.py), so it is not a fixed view

For a model with four layers (BERT-mini) sum_last_four and sum_all are the same thing.

Every fixed view is linear in the hidden states, and so are both poolings ([CLS], mean over tokens): pooling the
view of every token equals the view of the pooled layers. The probe relies on that to pool once per layer.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

COMBINATIONS = ("embeddings", "last", "second_to_last", "sum_last_four", "concat_last_four", "sum_all")
SCALAR_MIX = "scalar_mix"


def hidden_index(index: int, num_layers: int) -> int:
    """A layer index as the user gives it (0 = embeddings, -1 = last) -> a position in the num_layers + 1 states."""
    if not -num_layers - 1 <= index <= num_layers:
        raise ValueError(f"layer {index} does not exist in a model with {num_layers} layers: use 0 (embeddings) to "
                         f"{num_layers}, or -1 (last) to {-num_layers - 1}")
    return index % (num_layers + 1)


def view_positions(view: str, num_layers: int) -> list[int]:
    """The hidden-state positions a view reads."""
    if view.startswith("layer_"):
        return [hidden_index(int(view.removeprefix("layer_")), num_layers)]
    last = num_layers
    positions = {"embeddings": [0], "last": [last], "second_to_last": [last - 1],
                 "sum_last_four": list(range(last, max(last - 4, 0), -1)),
                 "concat_last_four": list(range(last, max(last - 4, 0), -1)),
                 "sum_all": list(range(1, last + 1))}
    if view not in positions:
        raise ValueError(f"unknown layer combination {view!r}; known: {', '.join(COMBINATIONS)} "
                         f"({SCALAR_MIX} is learned by the probe, not extracted)")
    if view == "second_to_last" and num_layers < 2:
        raise ValueError("second_to_last needs a model with at least two layers")
    return positions[view]


def view_names(layers: Sequence[int], combinations: Sequence[str], num_layers: int) -> list[str]:
    """Output names: layer_<index> for each requested layer (as given), then the combinations; checked."""
    names = [f"layer_{int(index)}" for index in layers] + list(combinations)
    for name in names:
        view_positions(name, num_layers)
    if len(set(names)) != len(names):
        raise ValueError(f"a layer or combination is asked for twice: {names}")
    return names


def apply_view(view: str, hidden: Sequence[torch.Tensor], num_layers: int) -> torch.Tensor:
    """hidden: the num_layers + 1 states, each (..., C) -> the view's (..., C) or (..., 4C) for concat_last_four."""
    states = [hidden[p] for p in view_positions(view, num_layers)]
    if view == "concat_last_four":
        return torch.cat(states, dim=-1)
    return states[0] if len(states) == 1 else torch.stack(states).sum(dim=0)


class ScalarMix(torch.nn.Module):
    """ELMo's scalar mix (Peters et al. 2018): gamma * sum_j softmax(s)_j * h_j over the hidden states."""

    def __init__(self, num_states: int):
        super().__init__()
        self.scalars = torch.nn.Parameter(torch.zeros(num_states))   # equal weights to start with
        self.gamma = torch.nn.Parameter(torch.ones(()))

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.scalars, dim=0)

    def forward(self, stacked: torch.Tensor) -> torch.Tensor:
        """stacked: (..., S, C) with S the hidden states -> (..., C)."""
        return self.gamma * torch.einsum("s,...sc->...c", self.weights(), stacked)
