"""The one weight loader with ModernBERT checkpoints: a transformers ModernBERT directory, our pre-training .ckpt and
its run directory resolve to a ModernBertConfig and its weights; continued pre-training and phase 2 load them into
ModernBertForMaskedLM exactly; a checkpoint of the other family is refused, saying what to do; and the BPE tokenizer
beside them loads as it is."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from model import BertConfig, BertForPreTraining, BertForSequenceClassification  # noqa: E402
from model.modernbert import ModernBertConfig, ModernBertForMaskedLM, ModernBertForSequenceClassification  # noqa: E402
from pipeline.core.checkpoints.weights import (  # noqa: E402
    encoder_of,
    load_into_task_model,
    load_pretrained,
    load_pretraining_model,
    load_pretraining_weights,
)
from pipeline.finetuning.tokenizer import check_special_tokens, load_tokenizer  # noqa: E402
from tests.finetuning.modernbert_dirs import save_tiny_modernbert, tiny_modernbert_config  # noqa: E402

transformers = pytest.importorskip("transformers")
REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return save_tiny_modernbert(tmp_path_factory.mktemp("modernbert") / "hf")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    from model.bert.hf_files import export_hf

    torch.manual_seed(0)
    return export_hf(BertForPreTraining(BertConfig.from_preset("tiny")), tmp_path_factory.mktemp("bert") / "hf", VOCAB)


@pytest.fixture(scope="module")
def run_dir(hf_dir, tmp_path_factory) -> Path:
    """A finished ModernBERT pre-training run as Lightning leaves it: checkpoints/last.ckpt (the module's state dict
    under "model.", the config in hyper_parameters), .hydra/, and hf_export/ with the BPE tokenizer.json only."""
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(1)
    model = ModernBertForMaskedLM(tiny_modernbert_config())
    (run / "checkpoints").mkdir()
    torch.save({"state_dict": {f"model.{name}": tensor for name, tensor in model.state_dict().items()},
                "hyper_parameters": {"model_config": model.config.to_dict(), "next_sentence_prediction": False}},
               run / "checkpoints" / "last.ckpt")
    (run / ".hydra").mkdir()
    (run / "hf_export").mkdir()
    (run / "hf_export" / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    return run


def mlm_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).mlm_logits


def test_a_transformers_directory_resolves_to_its_config_encoder_and_bpe_tokenizer(hf_dir):
    pretrained = load_pretrained(hf_dir)
    assert pretrained.config == tiny_modernbert_config()
    assert sorted(pretrained.head_state) == ["decoder.bias", "head.dense.weight", "head.norm.weight"]
    assert pretrained.tokenizer_source == hf_dir and not pretrained.has_next_sentence_head
    tokenizer = load_tokenizer(pretrained.tokenizer_source, pretrained.config.vocab_size)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.lowercase) == (2, 3, 0, False)
    check_special_tokens(tokenizer, pretrained.config)


def test_continued_pretraining_from_a_transformers_directory_gives_its_logits(hf_dir):
    model = ModernBertForMaskedLM(tiny_modernbert_config()).eval()
    load_pretraining_weights(model, hf_dir)
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
    input_ids = torch.randint(5, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(input_ids=input_ids).logits
    torch.testing.assert_close(mlm_logits(model, input_ids), expected, atol=1e-5, rtol=1e-5)


def test_a_run_directory_and_its_checkpoint_give_phase_2_every_tensor(run_dir):
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    for init in (run_dir, run_dir / "checkpoints" / "last.ckpt"):
        pretrained = load_pretrained(init)
        assert isinstance(pretrained.config, ModernBertConfig) and pretrained.config == tiny_modernbert_config()
        assert pretrained.tokenizer_source == run_dir / "hf_export"   # a tokenizer.json without vocab.txt
    model = load_pretraining_model(run_dir / "checkpoints" / "last.ckpt")
    assert isinstance(model, ModernBertForMaskedLM)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, checkpoint["state_dict"][f"model.{name}"]), name
    phase2 = ModernBertForMaskedLM(tiny_modernbert_config())
    load_pretraining_weights(phase2, run_dir)
    assert all(torch.equal(a, b) for a, b in zip(phase2.state_dict().values(), model.state_dict().values()))


def test_a_checkpoint_of_the_other_family_is_refused_saying_what_to_do(hf_dir, bert_dir):
    with pytest.raises(ValueError, match=r"holds a BERT model \(BertConfig .*\); this run trains ModernBERT "
                                         r"\(model=modernbert_\*\): start from a ModernBERT checkpoint or choose a "
                                         r"BERT model"):
        load_pretraining_weights(ModernBertForMaskedLM(tiny_modernbert_config()), bert_dir)
    with pytest.raises(ValueError, match=r"holds a ModernBERT model \(ModernBertConfig .*\); this run trains BERT "
                                         r".*start from a BERT checkpoint or choose a ModernBERT model"):
        load_pretraining_weights(BertForPreTraining(BertConfig.from_preset("tiny"), next_sentence_prediction=False),
                                 hf_dir)
    with pytest.raises(ValueError, match="holds a ModernBERT model"):
        load_into_task_model(BertForSequenceClassification(BertConfig.from_preset("tiny"), 2), load_pretrained(hf_dir))


def test_a_task_model_gets_the_encoder_and_the_masked_lm_prediction_head(hf_dir):
    pretrained = load_pretrained(hf_dir)
    model = ModernBertForSequenceClassification(pretrained.config, num_labels=3)
    assert encoder_of(model) is model.encoder
    report = load_into_task_model(model, pretrained)
    assert report == "encoder; prediction head (head.dense.weight, head.norm.weight); new classifier"
    assert torch.equal(model.head.dense.weight, pretrained.head_state["head.dense.weight"])
    assert torch.equal(model.encoder.embeddings.tok_embeddings.weight,
                       pretrained.encoder_state["embeddings.tok_embeddings.weight"])
    bert = BertForSequenceClassification(BertConfig.from_preset("tiny"), 2)
    assert encoder_of(bert) is bert.bert


def test_the_bpe_tokenizer_trims_offsets_and_spaces_words_as_running_text(hf_dir):
    tokenizer = load_tokenizer(hf_dir, 512)
    encoding = tokenizer.tokenizer.encode("the film is great", add_special_tokens=False)
    text = "the film is great"
    assert all(not text[start:end].startswith(" ") for start, end in encoding.offsets)   # "Ġfilm" -> "film"
    running = tokenizer.encode(["the film"])[0]
    words = tokenizer.word_tokenizer.encode(["the", "film"], is_pretokenized=True, add_special_tokens=False).ids
    assert words[-len(running) + 1:] == running[1:]   # "film" as after a space ("Ġfilm"), as in running text
    # its vocab.txt only lists the BPE tokens: given as tokenizer=, the tokenizer.json beside it is read
    assert load_tokenizer(hf_dir / "vocab.txt", 512).fingerprint == tokenizer.fingerprint


def test_a_tokenizer_whose_special_ids_differ_from_the_config_is_refused(hf_dir, tmp_path):
    import dataclasses

    tokenizer = load_tokenizer(hf_dir, 512)
    with pytest.raises(ValueError, match="has cls id 2, but the model's config says cls_token_id=7"):
        check_special_tokens(tokenizer, dataclasses.replace(tiny_modernbert_config(), cls_token_id=7))
    check_special_tokens(load_tokenizer(VOCAB, 30522), BertConfig.from_preset("tiny", pad_token_id=5))   # BERT: none
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "modernbert"


@pytest.mark.slow
def test_a_deepspeed_checkpoint_of_a_modernbert_run_gives_the_consolidated_weights(hf_dir, tmp_path, shared_data,
                                                                                   tiny_overrides, training_process,
                                                                                   torch_extensions_dir, monkeypatch):
    """A ZeRO-2 ModernBERT run on the CPU leaves checkpoints/last.ckpt as a DeepSpeed directory (~40 s)."""
    pytest.importorskip("deepspeed")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from tests.finetuning.modernbert_dirs import bpe_shard_set, modernbert_model

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", torch_extensions_dir)
    shards = bpe_shard_set(shared_data, hf_dir / "tokenizer.json", tmp_path)
    out = tmp_path / "run"
    proc = training_process(tiny_overrides(shards, out, 3, *modernbert_model(shards), "strategy=deepspeed_stage_2"),
                            timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    checkpoint = out / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir()
    pretrained = load_pretrained(checkpoint)
    assert isinstance(pretrained.config, ModernBertConfig) and pretrained.tokenizer_source == out / "hf_export"
    consolidated = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    for name, tensor in pretrained.encoder_state.items():
        assert torch.equal(tensor, consolidated[f"model.encoder.{name}"]), name
    model = load_pretraining_model(checkpoint)   # the tied decoder, stored twice by DeepSpeed, checked and loaded
    assert torch.equal(model.decoder.bias, consolidated["model.decoder.bias"])
