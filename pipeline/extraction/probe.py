"""Linear probes: which layers of a frozen BERT (or ModernBERT-class encoder) carry a sentence-level signal (the paper's
feature-based approach).

The seed example (SST-2 with a frozen encoder and a logistic regression): embed N training sentences, split them
75/25, fit scikit-learn's LogisticRegression on the first part, report accuracy on the second; then the same for
every layer combination of layers.py, for each pooling ([CLS], mean over tokens).

Each sentence is encoded once: the pooled vector of every hidden state, (N, L + 1, C). A combination of pooled
states equals the pooled combination (both are linear), so every row of the table comes from that one array.

The learned scalar mix (ELMo's, layers.ScalarMix) is fitted on the training part only: softmax weights over the
hidden states and a linear classifier, jointly, by gradient descent; the mix it finds is then frozen and scored with
the same LogisticRegression as every other row, so the rows differ only in their features.

Features are standardised (StandardScaler, fitted on the training part) before the regression: sums of layers
have a larger scale than single layers, and the same regularisation strength should mean the same for all.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from pipeline.extraction.layers import COMBINATIONS, SCALAR_MIX, ScalarMix, apply_view

PROBE_ROWS = (*COMBINATIONS, SCALAR_MIX)


@dataclasses.dataclass
class EmbeddedSentences:
    layers: dict[str, np.ndarray]   # pooling -> (N, L + 1, C) float32: every hidden state, embeddings first
    labels: np.ndarray              # (N,)
    num_layers: int


def embed(extractor, texts: Sequence[str], labels: Sequence[int]) -> EmbeddedSentences:
    """Pooled vectors of every hidden state for each text. The extractor must give every layer (layers=None)."""
    from pipeline.extraction.inputs import TextRecord

    num_layers = extractor.encoder.config.num_layers
    expected = [f"layer_{i}" for i in range(num_layers + 1)]
    if extractor.views != expected:
        raise ValueError(f"the probe needs every hidden state (Extractor.from_init(..., layers=None)), got "
                         f"{extractor.views}")
    stacks: dict[str, list[np.ndarray]] = {pooling: [] for pooling in extractor.poolings}
    for sentence in extractor.extract(TextRecord(i, text) for i, text in enumerate(texts)):
        for pooling in extractor.poolings:
            stacks[pooling].append(np.stack([sentence.pooled[pooling][view] for view in expected]))
    if any(len(stack) != len(texts) for stack in stacks.values()):
        raise ValueError("some probe sentences are empty: the probe needs a vector for every sentence")
    return EmbeddedSentences({p: np.stack(s) for p, s in stacks.items()}, np.asarray(labels), num_layers)


def combination(name: str, layers: np.ndarray, num_layers: int, mix_weights: np.ndarray | None = None) -> np.ndarray:
    """(N, L + 1, C) pooled states -> (N, C') features of one probe row."""
    states = torch.from_numpy(layers)
    if name == SCALAR_MIX:
        return np.einsum("s,nsc->nc", mix_weights, layers)
    return apply_view(name, [states[:, s] for s in range(states.shape[1])], num_layers).numpy()


def fit_scalar_mix(layers: np.ndarray, labels: np.ndarray, seed: int, steps: int = 300) -> np.ndarray:
    """Softmax weights over the hidden states, learned with a linear classifier on (N, S, C) training states."""
    torch.manual_seed(seed)
    states = torch.from_numpy(layers).float()
    states = (states - states.mean(dim=0)) / (states.std(dim=0) + 1e-6)   # per state and unit, as the scaler does
    targets = torch.from_numpy(labels).long()
    mix = ScalarMix(states.shape[1])
    classifier = torch.nn.Linear(states.shape[2], int(targets.max()) + 1)
    optimizer = torch.optim.Adam([*mix.parameters(), *classifier.parameters()], lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(classifier(mix(states)), targets)
        # the classifier's L2, as LogisticRegression's C=1 penalty (per example); the mix weights are free
        (loss + 0.5 * classifier.weight.pow(2).sum() / len(targets)).backward()
        optimizer.step()
    return mix.weights().detach().numpy()


def logistic_regression_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                                 test_y: np.ndarray, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    model.fit(train_x, train_y)
    return float(model.score(test_x, test_y))


def probe(embedded: EmbeddedSentences, seed: int, test_fraction: float = 0.25) -> dict:
    """{"accuracy": {pooling: {row: test accuracy}}, "mix_weights": {pooling: [...]}, "train", "test"}."""
    from sklearn.model_selection import train_test_split

    train_rows, test_rows = train_test_split(np.arange(len(embedded.labels)), test_size=test_fraction,
                                             random_state=seed)
    y_train, y_test = embedded.labels[train_rows], embedded.labels[test_rows]
    accuracy, mix_weights = {}, {}
    for pooling, layers in embedded.layers.items():
        weights = fit_scalar_mix(layers[train_rows], y_train, seed)
        mix_weights[pooling] = [round(float(w), 4) for w in weights]
        accuracy[pooling] = {}
        for row in PROBE_ROWS:
            features = combination(row, layers, embedded.num_layers, weights)
            accuracy[pooling][row] = logistic_regression_accuracy(features[train_rows], y_train, features[test_rows],
                                                                  y_test, seed)
    return {"accuracy": accuracy, "mix_weights": mix_weights, "train": len(train_rows), "test": len(test_rows)}


def table(accuracy: dict[str, dict[str, float]]) -> str:
    """A Markdown table: one row per layer combination, one column per pooling."""
    poolings = list(accuracy)
    lines = ["| layers | " + " | ".join(f"{p} accuracy" for p in poolings) + " |",
             "|---|" + "---|" * len(poolings)]
    for row in PROBE_ROWS:
        lines.append(f"| {row} | " + " | ".join(f"{accuracy[p][row]:.4f}" for p in poolings) + " |")
    return "\n".join(lines)


def bar_chart(accuracy: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")   # no display needed
    import matplotlib.pyplot as plt

    poolings = list(accuracy)
    width = 0.8 / len(poolings)
    fig, ax = plt.subplots(figsize=(9, 4))
    positions = np.arange(len(PROBE_ROWS))
    for k, pooling in enumerate(poolings):
        values = [accuracy[pooling][row] for row in PROBE_ROWS]
        bars = ax.bar(positions + (k - (len(poolings) - 1) / 2) * width, values, width, label=pooling)
        ax.bar_label(bars, labels=[f"{v:.3f}" for v in values], fontsize=7)
    ax.set_xticks(positions, [row.replace("_", " ") for row in PROBE_ROWS], rotation=20)
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")   # chance on a balanced binary task
    ax.set_title(title)
    ax.legend(title="pooling")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
