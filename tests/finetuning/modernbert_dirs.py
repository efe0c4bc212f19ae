"""A tiny ModernBERT as a user has one: transformers' ModernBertForMaskedLM at random weights, saved with
save_pretrained beside a byte-level BPE tokenizer.json trained here (ModernBERT's kind of tokenizer, its special
tokens [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4), small enough that every task fine-tunes in seconds."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SST2 = REPO_ROOT / "pipeline" / "finetuning" / "sample_data" / "SST-2"
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE = 512   # the embedding: the tokenizer's ~400 tokens, padded up as ModernBERT pads its own
EXTRA_TEXT = ["Who wrote the book? The author lives in Paris, France.", "EU rejects German call to boycott British "
              "lamb .", "A man is playing a guitar. Someone slices an onion in the kitchen."]


def train_bpe_tokenizer(out_dir: Path) -> Path:
    """tokenizer.json: byte-level BPE (no lower-casing) whose post-processor adds [CLS] a [SEP] (b [SEP]), as
    ModernBERT's does; and vocab.txt listing its tokens by id, as data prep writes beside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    texts = [line.split("\t")[0] for line in (SAMPLE_SST2 / "train.tsv").read_text().splitlines()[1:400]]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts + EXTRA_TEXT, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    (out_dir / "vocab.txt").write_text("".join(f"{token}\n" for token in sorted(vocab, key=vocab.__getitem__)))
    return out_dir / "tokenizer.json"


def tiny_modernbert_config():
    from model.modernbert import ModernBertConfig

    # 3 layers: 0 global, 1 and 2 in a sliding window of 16 (8 each side), which sentences longer than 8 tokens reach
    return ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB_SIZE, local_attention=16,
                                        max_position_embeddings=512)


def save_tiny_modernbert(out_dir: Path, seed: int = 0) -> Path:
    """transformers.ModernBertForMaskedLM.save_pretrained(out_dir), with tokenizer.json and vocab.txt beside it."""
    import torch
    import transformers

    from model.modernbert.hf_conversion import hf_config_from

    torch.manual_seed(seed)
    model = transformers.ModernBertForMaskedLM(hf_config_from(tiny_modernbert_config(), attn_implementation="sdpa"))
    model.save_pretrained(out_dir)
    train_bpe_tokenizer(out_dir)
    return out_dir


def bpe_shard_set(shared_data: Path, tokenizer_json: Path, tmp_path: Path) -> Path:
    """A ModernBERT shard set (MLM only, packed documents, 128 tokens) of one real book, made by the real data prep
    with this tokenizer.json."""
    import shutil

    from data_prep.run import run

    books = tmp_path / "books"
    books.mkdir()
    shutil.copy(shared_data / "corpora" / "books" / "austen-persuasion.txt", books)
    shards = tmp_path / "shards"
    run([f"inputs=[{{path: '{books}/*.txt', format: books}}]", f"output_dir={shards}", "preset=phase1",
         "objective=mlm", "masking=dynamic", "max_seq_length=128", "max_predictions_per_seq=20", "dupe_factor=1",
         "num_shards=1", f"tokenizer.file={tokenizer_json}", "vocab.file=null", "--runner=DirectRunner",
         "--direct_running_mode=in_memory"])
    return shards


def modernbert_model(shards: Path) -> list[str]:
    """The training overrides of a tiny ModernBERT for this shard set (its embedding: the set's vocabulary)."""
    vocab_size = len((shards / "vocab.txt").read_text().splitlines())
    return ["model=modernbert_tiny", f"model.vocab_size={vocab_size}", "model.local_attention=16",
            "data.max_seq_length=128"]
