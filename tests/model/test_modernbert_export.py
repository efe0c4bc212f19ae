"""Exported directories load in transformers (AutoModel*, AutoTokenizer, offline) and give our outputs; transformers'
own save_pretrained directories read back into ours."""
import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")

from model.modernbert import (  # noqa: E402
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from model.modernbert.hf_conversion import load_task_from_hf_state_dict  # noqa: E402
from model.modernbert.hf_files import export_modernbert_hf, read_modernbert_hf  # noqa: E402
from model.shared.hf_checkpoints import read_hf_checkpoint  # noqa: E402
from tests.model.modernbert_common import ATOL, CONFIG, hf_model, max_abs_diff, padded_batch  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0-4, our vocabularies' order
TEXTS = ["The cat sat on the mat.", "Hello, world! Über naïve café: 42 cats?", "  two  spaces and\ttabs\n"]


def train_bpe(directory) -> str:
    """A tiny byte-level BPE tokenizer with [CLS] text [SEP] around each encoding, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    directory.mkdir()
    tokenizer.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    assert [tokenizer.token_to_id(token) for token in SPECIALS] == [0, 1, 2, 3, 4]
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_export_loads_in_transformers(tmp_path):
    train_bpe(tmp_path / "tok_src")
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(CONFIG).eval()
    out = export_modernbert_hf(ours, tmp_path / "export", tokenizer_dir=tmp_path / "tok_src")
    from model.modernbert.hf_conversion import export_modernbert_hf as via_conversion
    assert via_conversion is export_modernbert_hf  # importable from either module

    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf) is transformers.ModernBertForMaskedLM
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).mlm_logits
    assert max_abs_diff(mine[real], theirs[real]) <= ATOL

    # and back: the same config and weights
    config, state = read_modernbert_hf(out)
    assert config == CONFIG
    again = ModernBertForMaskedLM(config)
    again.load_state_dict(state, strict=True)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_exported_tokenizer_round_trips(tmp_path):
    source = train_bpe(tmp_path / "tok_src")
    out = export_modernbert_hf(ModernBertForMaskedLM(CONFIG), tmp_path / "export", tokenizer_dir=source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    reference = tokenizers.Tokenizer.from_file(str(source))
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id,
            tokenizer.unk_token_id) == (0, 2, 3, 4, 1)
    assert tokenizer.model_max_length == CONFIG.max_position_embeddings
    for text in TEXTS:
        encoded = tokenizer(text)
        assert encoded["input_ids"] == reference.encode(text).ids
        assert "token_type_ids" not in encoded
        assert encoded["input_ids"][0] == 2 and encoded["input_ids"][-1] == 3
        assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True) == text
    # config.json's special ids are the tokenizer's
    hf_config = json.loads((out / "config.json").read_text())
    assert (hf_config["pad_token_id"], hf_config["cls_token_id"], hf_config["sep_token_id"]) == (0, 2, 3)


def test_export_refuses_a_tokenizer_that_does_not_fit(tmp_path):
    source = train_bpe(tmp_path / "tok_src")
    small = ModernBertForMaskedLM(dataclasses.replace(CONFIG, vocab_size=100))
    with pytest.raises(ValueError, match="only 100 embeddings"):
        export_modernbert_hf(small, tmp_path / "small", tokenizer_dir=source)
    other_order = ModernBertForMaskedLM(dataclasses.replace(CONFIG, mask_token_id=7))
    with pytest.raises(ValueError, match=r"token 7 \(mask_token_id\) .* not one of its special tokens"):
        export_modernbert_hf(other_order, tmp_path / "other", tokenizer_dir=source)


def test_reads_transformers_save_pretrained(tmp_path):
    """transformers' own directories: a ModernBertForMaskedLM (our MLM state), a ModernBertModel and a fine-tuned
    classifier (our encoder's state)."""
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    hf = hf_model("ModernBertForMaskedLM", seed=5)
    hf.save_pretrained(tmp_path / "mlm")
    config, state = read_modernbert_hf(tmp_path / "mlm")
    assert config == CONFIG
    ours = ModernBertForMaskedLM(config).eval()
    ours.load_state_dict(state, strict=True)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).mlm_logits
    assert max_abs_diff(mine[real], theirs[real]) <= ATOL

    for cls_name, kwargs in (("ModernBertModel", {}), ("ModernBertForSequenceClassification", {"num_labels": 3})):
        hf = hf_model(cls_name, seed=6, **kwargs)
        hf.save_pretrained(tmp_path / cls_name)
        config, state = read_modernbert_hf(tmp_path / cls_name)
        encoder = ModernBertModel(config).eval()
        encoder.load_state_dict(state, strict=True)
        hf_encoder = hf if cls_name == "ModernBertModel" else hf.model
        with torch.no_grad():
            theirs = hf_encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            mine = encoder(batch["input_ids"], batch["attention_mask"])
        assert max_abs_diff(mine.sequence_output[real], theirs.last_hidden_state[real]) <= ATOL, cls_name

    # the whole fine-tuned classifier, head included
    ours = ModernBertForSequenceClassification(config, 3).eval()
    load_task_from_hf_state_dict(ours, read_hf_checkpoint(tmp_path / "ModernBertForSequenceClassification")[1])
    with torch.no_grad():
        assert max_abs_diff(ours(batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                            hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits) <= ATOL


def test_task_export_loads_in_transformers(tmp_path):
    torch.manual_seed(0)
    ours = ModernBertForTokenClassification(CONFIG, 4).eval()
    out = export_modernbert_hf(ours, tmp_path / "ner", id2label=["O", "B-PER", "I-PER", "B-LOC"])
    hf = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    assert type(hf) is transformers.ModernBertForTokenClassification
    assert hf.config.id2label[1] == "B-PER"
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert max_abs_diff(mine[real], theirs[real]) <= ATOL
    with pytest.raises(ValueError, match="no labels"):
        export_modernbert_hf(ModernBertForMaskedLM(CONFIG), tmp_path / "mlm", id2label=["a"])
