"""tokenizer.file: any tokenizer.json (here a byte-level BPE like ModernBERT's, trained on the bundled sample) makes
the shard set, which then holds it as it was and a vocab.txt of its tokens by id; what it cannot do is refused
before the job starts."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.run import run
from data_prep.vocab import SPECIAL_TOKENS

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
SAMPLE = Path(__file__).resolve().parents[2] / "data_prep" / "sample_corpus"
BOOK = SAMPLE / "books" / "chesterton-ball.txt"


def byte_level_bpe(path: Path, special_tokens=SPECIAL_TOKENS, extra_tokens=()) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = BOOK.read_text(encoding="utf-8", errors="replace")
    tokenizer.train_from_iterator([text[i:i + 2000] for i in range(0, 200_000, 2000)], trainer)
    if extra_tokens:
        tokenizer.add_tokens(list(extra_tokens))
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory) -> Path:
    return byte_level_bpe(tmp_path_factory.mktemp("bpe") / "tokenizer.json")


def job(out, tokenizer_file, *extra):
    return run([f"inputs=[{{path: '{BOOK}', format: books}}, {{path: '{SAMPLE}/wikipedia', format: wikipedia}}]",
                f"output_dir={out}", "preset=phase1", "vocab.file=null", f"tokenizer.file={tokenizer_file}",
                "num_shards=2", "objective=mlm", "masking=dynamic", "dupe_factor=1", "max_seq_length=64",
                "masked_lm_prob=0.3", "max_predictions_per_seq=19", *extra, *IN_PROCESS])


def test_a_byte_level_bpe_tokenizer_json_makes_a_set_training_reads(bpe_file, tmp_path):
    out = tmp_path / "bpe"
    manifest = job(out, bpe_file)
    source = bpe_file.read_bytes()
    tokenizer = Tokenizer.from_file(str(bpe_file))
    vocab = tokenizer.get_vocab()
    section = manifest["tokenizer"]
    assert section["kind"] == "tokenizer.json" and section["source"] == str(bpe_file)
    assert section["tokenizer_sha256"] == hashlib.sha256(source).hexdigest() and section["lowercase"] is None
    assert section["vocab_size"] == len(vocab) == tokenizer.get_vocab_size()
    assert manifest["parameters"]["tokenizer"] == {"file": str(bpe_file)}
    assert (out / "tokenizer.json").read_bytes() == source                     # the tokenizer as it was given
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == sorted(vocab, key=vocab.__getitem__)

    table = pq.read_table(out / manifest["shards"][0]["parquet"]["path"])
    assert table.column_names == ["input_ids", "document_starts"]
    ids = np.concatenate(table.column("input_ids").to_numpy(zero_copy_only=False)[:20])
    specials = [vocab[t] for t in ("[CLS]", "[SEP]")]
    text = tokenizer.decode([int(i) for i in ids if i not in specials])
    assert "the" in text and " " in text      # running text, the spaces between sentences kept ('Ġ' pieces)

    from pipeline.pretraining.data.collator import PretrainingCollator
    from pipeline.pretraining.data.epoch_plan import Piece
    from pipeline.pretraining.data.rows import RowGroupReader
    from pipeline.pretraining.data.shard_set import ShardSet
    shard_set = ShardSet.open(out, max_seq_length=64, vocab_size=len(vocab))
    assert shard_set.tokenizer_kind == "tokenizer.json" and shard_set.has_document_boundaries
    assert shard_set.special_tokens.mask == vocab["[MASK]"]
    rows = RowGroupReader(shard_set).read([Piece(0, 0, 16)])
    batch = PretrainingCollator.for_shard_set(shard_set, document_layout=True).arrays(rows, epoch=0)
    originals = np.take_along_axis(batch["input_ids"], batch["masked_positions"], axis=1)
    labels = batch["masked_lm_labels"]
    assert (labels >= 0).sum(axis=1).min() == 19 and not np.isin(labels, specials).any()
    assert not np.isin(originals[labels >= 0], specials).any()

    (out / "tokenizer.json").write_text(json.dumps({**json.loads(source), "truncation": {"max_length": 8}}))
    with pytest.raises(ValueError, match="tokenizer.json differs from the tokenizer"):
        ShardSet.open(out, max_seq_length=64, vocab_size=len(vocab))


def test_special_tokens_in_the_text_stay_text(bpe_file):
    from data_prep.tokenization import TokenizerJsonEncoder
    encoder = TokenizerJsonEncoder(bpe_file.read_text(encoding="utf-8"))
    sep = Tokenizer.from_file(str(bpe_file)).token_to_id("[SEP]")
    ids = encoder.encode(["He wrote [SEP] and [MASK] here.", "Then he left."])
    assert sep not in ids[0] and len(ids) == 2
    assert Tokenizer.from_file(str(bpe_file)).id_to_token(ids[1][0]).startswith("Ġ")   # a space before sentence 2


@pytest.mark.parametrize(("make", "extra", "message"), [
    (lambda p: byte_level_bpe(p, ("[PAD]", "[UNK]")), [], r"lacks the special tokens \['\[CLS\]', '\[SEP\]', "
                                                           r"'\[MASK\]'\]"),
    (lambda p: byte_level_bpe(p, extra_tokens=["two\nlines"]), [], "line break"),
    (lambda p: byte_level_bpe(p), ["whole_word_masking=true"], "whole_word_masking.*BPE"),
    (lambda p: byte_level_bpe(p), ["vocab.file=data_prep/vocab/bert-base-uncased-vocab.txt"], "exclusive"),
    (lambda p: p, [], "does not exist"),
])
def test_what_a_tokenizer_json_cannot_do_is_refused_before_the_job(tmp_path, make, extra, message):
    tokenizer_file = make(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match=message):
        job(tmp_path / "out", tokenizer_file, *extra)
    assert not (tmp_path / "out").exists()
