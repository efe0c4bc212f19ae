"""The tokenizer that belongs to the weights, checked against them before anything trains.

A directory gives tokenizer.json when it has one (what data_prep and our exports write, and what Hugging Face ships
for bert-base-uncased), else its vocab.txt with BERT's normaliser, lower-casing as tokenizer_config.json's
do_lower_case says (uncased when it says nothing, as google-research/bert's default). Special tokens are added by the
featurizers, never by the tokenizer, so a tokenizer.json's post-processor, padding and truncation are switched off.
A WordPiece tokenizer.json's longest word is set to the reference's 200 characters (Hugging Face's files say 100),
so fine-tuning splits words exactly as google-research/bert and our pre-training data do.

A byte-level BPE tokenizer.json (ModernBERT's: its pre-training data's) is taken as it is: it lower-cases only when its
normaliser does, and its vocab.txt (the tokens listed by id) is never read as a WordPiece vocabulary. Its offsets are
trimmed of the space a token carries ("Ġword"), so SQuAD's answers start at the word; words given one by one (CoNLL)
are encoded as they appear after a space in running text ("Ġword"), as transformers does for RoBERTa-style tokenizers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, models, processors

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
    word_tokenizer: Tokenizer | None = None   # for pre-split words (CoNLL), where it differs from `tokenizer`

    def __post_init__(self) -> None:
        if self.word_tokenizer is None:
            self.word_tokenizer = self.tokenizer

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids (WordPiece or BPE) of each text, without special tokens."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def load_tokenizer(source: str | Path | None, model_vocab_size: int) -> LoadedTokenizer:
    if source is None:
        raise ValueError("no tokenizer found beside these weights: pass tokenizer=<vocab.txt or a directory with "
                         "vocab.txt / tokenizer.json> (the vocabulary the model was pre-trained with)")
    source = Path(source)
    directory = source if source.is_dir() else source.parent
    tokenizer_json = _tokenizer_json_of(source)
    vocab_file = directory / "vocab.txt" if source.is_dir() else source
    lowercase = _lowercase_of(directory)
    word_tokenizer = None

    if tokenizer_json is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        tokenizer.post_processor = None
        tokenizer.no_padding()
        tokenizer.no_truncation()
        if isinstance(tokenizer.model, models.WordPiece):
            tokenizer.model.max_input_chars_per_word = MAX_INPUT_CHARS_PER_WORD
        saved = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        normalizer = saved.get("normalizer") or {}
        if _byte_level(saved.get("pre_tokenizer")):
            lowercase = _lowercases(normalizer)
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)   # adds no tokens: trims offsets
            word_tokenizer = _with_prefix_space(tokenizer)
        else:
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
                           fingerprint, word_tokenizer)


def check_special_tokens(tokenizer: LoadedTokenizer, config) -> None:
    """A config that names its special tokens' ids (ModernBERT's; BertConfig names none that the model uses) must
    agree with the tokenizer: the model masks padding by id, and its classifier reads [CLS]."""
    if getattr(config, "cls_token_id", None) is None:
        return
    for name, token_id in (("cls_token_id", tokenizer.cls_id), ("sep_token_id", tokenizer.sep_id),
                           ("pad_token_id", tokenizer.pad_id)):
        expected = getattr(config, name, None)
        if expected is not None and expected != token_id:
            raise ValueError(f"the tokenizer at {tokenizer.source} has {name.removesuffix('_token_id')} id {token_id}, "
                             f"but the model's config says {name}={expected}: this tokenizer does not belong to these "
                             "weights. Pass tokenizer=<the tokenizer the model was pre-trained with>")


def _tokenizer_json_of(source: Path) -> Path | None:
    """The tokenizer.json to read: the directory's, the file given, or the one beside a vocab.txt that only lists a
    BPE tokenizer's tokens (reading those as WordPiece would split every word wrongly)."""
    if source.is_dir():
        candidate = source / "tokenizer.json"
    elif source.suffix == ".json":
        return source
    else:
        candidate = source.parent / "tokenizer.json"
        if not candidate.is_file() or not _byte_level(json.loads(candidate.read_text(encoding="utf-8"))
                                                      .get("pre_tokenizer")):
            return None
    return candidate if candidate.is_file() else None


def _byte_level(pre_tokenizer: dict | None) -> bool:
    """A byte-level pre-tokeniser (GPT-2's, ModernBERT's), alone or in a sequence."""
    if not pre_tokenizer:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(part) for part in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


def _lowercases(normalizer: dict | None) -> bool:
    if not normalizer:
        return False
    if normalizer.get("type") == "Sequence":
        return any(_lowercases(part) for part in normalizer.get("normalizers", []))
    return normalizer.get("type") == "Lowercase" or bool(normalizer.get("lowercase", False))


def _with_prefix_space(tokenizer: Tokenizer) -> Tokenizer:
    """A copy whose byte-level pre-tokeniser puts a space before each word, for words given one by one."""
    saved = json.loads(tokenizer.to_str())

    def prefixed(pre_tokenizer: dict) -> dict:
        if pre_tokenizer.get("type") == "Sequence":
            return {**pre_tokenizer, "pretokenizers": [prefixed(p) for p in pre_tokenizer["pretokenizers"]]}
        if pre_tokenizer.get("type") == "ByteLevel":
            return {**pre_tokenizer, "add_prefix_space": True}
        return pre_tokenizer

    saved["pre_tokenizer"] = prefixed(saved["pre_tokenizer"])
    return Tokenizer.from_str(json.dumps(saved))


def _lowercase_of(directory: Path) -> bool:
    config = directory / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("do_lower_case")
        if value is not None:
            return bool(value)
    return True
