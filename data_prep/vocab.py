"""WordPiece vocabulary: trained with `tokenizers` on a sample of the corpus, or loaded from a vocab.txt.

The tokenizer is BERT's (BertNormalizer + BertPreTokenizer + WordPiece). Text that spells a special token
("[SEP]", "[MASK]") is tokenized as ordinary text, as the reference's BasicTokenizer does, so corpus text can
never inject structure into an instance.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# google-research/bert's WordpieceTokenizer: a word longer than this (in characters) is one [UNK]. `tokenizers`
# defaults to 100, which would turn words of 101-200 characters into [UNK] where the reference has pieces.
MAX_INPUT_CHARS_PER_WORD = 200


def parse_vocab(text: str) -> list[str]:
    tokens = [line.rstrip("\r\n") for line in text.splitlines()]
    while tokens and tokens[-1] == "":
        tokens.pop()
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise ValueError(f"vocabulary lacks the special tokens {missing}")
    if len(set(tokens)) != len(tokens):
        raise ValueError("vocabulary has duplicate tokens")
    return tokens


def vocab_text(tokens: list[str]) -> str:
    return "".join(token + "\n" for token in tokens)


def vocab_sha256(tokens: list[str]) -> str:
    return hashlib.sha256(vocab_text(tokens).encode("utf-8")).hexdigest()


def build_tokenizer(tokens: list[str], lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(tokens)}, unk_token="[UNK]",
                                           max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    _configure(tokenizer, lowercase)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    cls_id, sep_id = tokens.index("[CLS]"), tokens.index("[SEP]")
    # For users of the saved tokenizer.json (fine-tuning, HF export); data_prep adds specials itself.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tokenizer.encode_special_tokens = True
    return tokenizer


def train_vocab(texts: Iterable[str], vocab_size: int, lowercase: bool, min_frequency: int = 2) -> list[str]:
    """Train a WordPiece vocabulary; [PAD] [UNK] [CLS] [SEP] [MASK] take ids 0-4."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    _configure(tokenizer, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##", show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    vocab = tokenizer.get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def _configure(tokenizer: Tokenizer, lowercase: bool) -> None:
    # strip_accents=None follows `lowercase`, as BERT's uncased and cased models expect.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
