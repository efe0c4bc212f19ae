"""The tokenizer that belongs to the weights, checked against them before anything trains.

A directory gives tokenizer.json when it has one (what data_prep and our exports write, and what Hugging Face ships
for bert-base-uncased), else its vocab.txt with BERT's normaliser, lower-casing as tokenizer_config.json's
do_lower_case says (uncased when it says nothing, as google-research/bert's default). Special tokens are added by the
featurizers, never by the tokenizer, so a tokenizer.json's post-processor, padding and truncation are switched off.
A WordPiece tokenizer.json's longest word is set to the reference's 200 characters (Hugging Face's files say 100),
so fine-tuning splits words exactly as google-research/bert and our pre-training data do.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, models

from data_prep.vocab import MAX_INPUT_CHARS_PER_WORD, build_tokenizer, parse_vocab

REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]")


@dataclasses.dataclass
class LoadedTokenizer:
    tokenizer: Tokenizer
    source: Path
    vocab_size: int
    lowercase: bool
    cls_id: int
    sep_id: int
    pad_id: int
    fingerprint: str      # sha256 of the vocabulary and settings: part of the feature cache's key

    def encode(self, texts: list[str]) -> list[list[int]]:
        """WordPiece ids of each text, without special tokens."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def load_tokenizer(source: str | Path | None, model_vocab_size: int) -> LoadedTokenizer:
    if source is None:
        raise ValueError("no tokenizer found beside these weights: pass tokenizer=<vocab.txt or a directory with "
                         "vocab.txt / tokenizer.json> (the vocabulary the model was pre-trained with)")
    source = Path(source)
    directory = source if source.is_dir() else source.parent
    tokenizer_json = directory / "tokenizer.json" if source.is_dir() else None
    vocab_file = directory / "vocab.txt" if source.is_dir() else source
    lowercase = _lowercase_of(directory)

    if tokenizer_json is not None and tokenizer_json.is_file():
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        tokenizer.post_processor = None
        tokenizer.no_padding()
        tokenizer.no_truncation()
        if isinstance(tokenizer.model, models.WordPiece):
            tokenizer.model.max_input_chars_per_word = MAX_INPUT_CHARS_PER_WORD
        normalizer = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("normalizer") or {}
        lowercase = bool(normalizer.get("lowercase", lowercase))
        fingerprint_text = tokenizer.to_str()
    elif vocab_file.is_file():
        tokens = parse_vocab(vocab_file.read_text(encoding="utf-8"))
        tokenizer = build_tokenizer(tokens, lowercase)
        tokenizer.post_processor = None
        fingerprint_text = "\n".join(tokens) + f"\nlowercase={lowercase}\nmax_chars={MAX_INPUT_CHARS_PER_WORD}"
    else:
        raise FileNotFoundError(f"no tokenizer at {source}: expected tokenizer.json or vocab.txt there")

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    missing = [token for token in REQUIRED_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"the tokenizer at {source} lacks BERT's special tokens {missing}")
    size = max(vocab.values()) + 1
    if size > model_vocab_size:
        raise ValueError(f"the tokenizer at {source} has {size} tokens but the model's embedding only "
                         f"{model_vocab_size} rows: this vocabulary does not belong to these weights. Pass "
                         "tokenizer=<the vocab.txt the model was pre-trained with>")
    fingerprint = hashlib.sha256(fingerprint_text.encode("utf-8")).hexdigest()
    return LoadedTokenizer(tokenizer, source, size, lowercase, vocab["[CLS]"], vocab["[SEP]"], vocab["[PAD]"],
                           fingerprint)


def _lowercase_of(directory: Path) -> bool:
    config = directory / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("do_lower_case")
        if value is not None:
            return bool(value)
    return True
