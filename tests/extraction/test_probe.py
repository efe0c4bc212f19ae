"""The SST-2 probe end to end on a small sample, and the scalar mix it learns."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
SST2_SAMPLE = REPO_ROOT / "pipeline" / "finetuning" / "sample_data" / "SST-2"


def test_the_probe_runs_on_a_small_sample_and_writes_table_json_and_chart(tmp_path):
    from model import BertConfig, BertForPreTraining
    from model.bert.hf_files import export_hf
    from pipeline.core.app import compose
    from pipeline.extraction.probe import PROBE_ROWS
    from pipeline.extraction.run import run_probe

    torch.manual_seed(0)
    init = export_hf(BertForPreTraining(BertConfig.from_preset("tiny")), tmp_path / "hf", VOCAB)
    result = run_probe(compose("probe", [f"init={init}", f"output_dir={tmp_path / 'probe'}", "sentences=120",
                                       f"cache_dir={tmp_path / 'cache'}"]))
    assert (result["train"], result["test"]) == (90, 30)
    for pooling in ("cls", "mean"):
        assert set(result["accuracy"][pooling]) == set(PROBE_ROWS)
        assert all(0.0 <= acc <= 1.0 for acc in result["accuracy"][pooling].values())
        assert len(result["mix_weights"][pooling]) == 3 and abs(sum(result["mix_weights"][pooling]) - 1) < 1e-3
    out = tmp_path / "probe"
    assert json.loads((out / "probe.json").read_text())["accuracy"] == result["accuracy"]
    assert (out / "probe.md").read_text().startswith("| layers | cls accuracy | mean accuracy |")
    assert (out / "probe.png").read_bytes()[:4] == b"\x89PNG"


def test_the_scalar_mix_finds_the_layer_that_holds_the_signal():
    from pipeline.extraction.probe import fit_scalar_mix

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    layers = rng.normal(size=(400, 3, 8)).astype(np.float32)
    layers[:, 2, 0] += 3.0 * (2 * labels - 1)   # only state 2 separates the classes
    weights = fit_scalar_mix(layers, labels, seed=0)
    assert weights.argmax() == 2 and weights[2] > 0.6


def test_pooled_combinations_equal_combinations_pooled():
    """The probe combines pooled states; the extractor pools combined states: the same thing (both linear)."""
    from pipeline.extraction.layers import COMBINATIONS, apply_view
    from pipeline.extraction.probe import combination

    hidden = torch.randn(5, 4, 6, 8)   # (states, batch, tokens, C): 4 layers + embeddings
    mean_pooled = hidden.mean(dim=2).permute(1, 0, 2).numpy()   # (batch, states, C)
    for name in COMBINATIONS:
        pooled_after = apply_view(name, list(hidden), 4).mean(dim=1).numpy()
        np.testing.assert_allclose(combination(name, mean_pooled, 4), pooled_after, atol=1e-5)
