"""The vocabulary: WordPiece, trained with `tokenizers` on a sample of the corpus or loaded from a vocab.txt; or any
tokenizer.json (e.g. ModernBERT's byte-level BPE), whose tokens are then listed by id in the set's vocab.txt.

The WordPiece tokenizer is BERT's (BertNormalizer + BertPreTokenizer + WordPiece). Text that spells a special token
("[SEP]", "[MASK]") is tokenized as ordinary text, as the reference's BasicTokenizer does, so corpus text can
never inject structure into an instance.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDPIECE = "wordpiece"             # the manifest's tokenizer kinds: BERT's, built from vocab.txt ...
TOKENIZER_JSON = "tokenizer.json"   # ... or a tokenizer.json given as it is (tokenizer.file=)
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


def tokenizer_json_tokens(text: str) -> list[str]:
    """The tokens of a tokenizer.json, by id: what the shard set's vocab.txt lists, so that the vocabulary checks
    and masking (which read vocab.txt) work for it as for WordPiece. Refuses one without BERT's special tokens (the
    rows are built with them), with gaps in its ids, or with a token a vocab.txt line cannot hold."""
    vocab = Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"the tokenizer.json lacks the special tokens {missing} that the rows are built with "
                         f"(it needs all of {list(SPECIAL_TOKENS)})")
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[token] for token in tokens] != list(range(len(tokens))):
        raise ValueError("the tokenizer.json's token ids are not 0..n-1 without gaps: no vocab.txt can list them")
    unlisted = [token for token in tokens if token == "" or token.splitlines() != [token]]
    if unlisted:
        raise ValueError(f"the tokenizer.json has tokens that a vocab.txt line cannot hold (empty, or with a line "
                         f"break): {unlisted[:5]}")
    return tokens


def whole_word_problem(text: str) -> str | None:
    """Why whole-word masking cannot use this tokenizer.json (None when it can): it groups WordPiece's '##'
    pieces, which other models (byte-level BPE marks word starts instead) do not have."""
    model = Tokenizer.from_str(text).model
    if isinstance(model, models.WordPiece) and model.continuing_subword_prefix == "##":
        return None
    return (f"whole_word_masking groups WordPiece's '##' pieces into words, and this tokenizer.json is a "
            f"{type(model).__name__} model without them: set whole_word_masking=false")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
