"""Feature extraction and the probe from a ModernBERT checkpoint: every hidden state equals transformers'
ModernBertModel's for the same weights, and both programs run end to end on a transformers ModernBERT directory."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline.extraction.extractor import Extractor  # noqa: E402
from pipeline.extraction.inputs import TextRecord  # noqa: E402
from tests.finetuning.modernbert_dirs import save_tiny_modernbert  # noqa: E402

# the last two are longer than the sliding window of the tiny model's local layers (16 tokens)
SENTENCES = ["the movie was wonderful .", "ok",
             "a dull , lifeless and overlong film that nobody should sit through , not even the director himself",
             "who knew that a film about nothing could keep an audience guessing for two whole hours ?"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return save_tiny_modernbert(tmp_path_factory.mktemp("modernbert") / "hf")


def test_every_layer_equals_transformers_modernbert_model(hf_dir):
    transformers = pytest.importorskip("transformers")
    extractor = Extractor.from_init(hf_dir, layers=None, batch_size=3)   # batches of mixed length: padding
    assert extractor.views == ["layer_0", "layer_1", "layer_2", "layer_3"]
    reference = transformers.ModernBertModel.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
    for sentence in extractor.extract(TextRecord(i, text) for i, text in enumerate(SENTENCES)):
        assert extractor.tokens(sentence.input_ids)[0] == "[CLS]"
        with torch.no_grad():
            theirs = reference(input_ids=torch.tensor([sentence.input_ids]), output_hidden_states=True).hidden_states
        assert len(theirs) == 4
        for position, state in enumerate(theirs):
            torch.testing.assert_close(torch.from_numpy(sentence.per_token[f"layer_{position}"]), state[0],
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.from_numpy(sentence.pooled["mean"][f"layer_{position}"]),
                                       state[0].mean(dim=0), atol=1e-5, rtol=1e-5)


def test_extract_features_and_the_probe_run_on_a_modernbert_directory(hf_dir, tmp_path):
    from pipeline.core.app import compose
    from pipeline.extraction.run import extract_features, run_probe

    text = tmp_path / "input.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    summary = extract_features(compose("extract_features", [f"init={hf_dir}", f"input={text}",
                                                            f"output_dir={tmp_path / 'features'}", "progress=false",
                                                            "combinations=[sum_last_four]"]))
    assert summary["sentences"] == 4 and summary["views"][-1] == "sum_last_four"
    assert json.loads((tmp_path / "features" / "report.json").read_text())["sentences"] == 4

    result = run_probe(compose("probe", [f"init={hf_dir}", f"output_dir={tmp_path / 'probe'}", "sentences=80",
                                         f"cache_dir={tmp_path / 'cache'}"]))
    assert (result["train"], result["test"]) == (60, 20)
    assert all(len(weights) == 4 for weights in result["mix_weights"].values())   # embeddings + 3 layers
    assert (tmp_path / "probe" / "probe.md").read_text().startswith("| layers |")
