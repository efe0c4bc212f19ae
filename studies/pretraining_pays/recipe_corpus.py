"""Training and held-out shard sets for the CPU recipe search and the downstream curve, from the shared corpora.

    python studies/pretraining_pays/recipe_corpus.py --shared-data ../shared/data --out outputs/recipe_corpus \
        --seq 128 --vocab original            # or --vocab 16000 (a WordPiece vocabulary trained on the training text)

Held out, never trained on: one whole book (chesterton-thursday.txt) and every fifth Wikipedia article (by a hash of
its title-independent key, so the split does not depend on reading order). Trained on: the other five books and the
other Wikipedia articles. The held-out set is made with the training set's vocabulary, static masking and one copy
(a fixed evaluation set); the training set with dynamic masking (masked anew every epoch by the loader) and five
copies, since an hour of a small model passes over this corpus several times.

Layout under --out: text/{train,heldout}/ (the split text), <seq>_<vocab>/{train,heldout}/ (shard sets).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks_common import REPO_ROOT, add_shared_data_flag, checkout_env, shared_path

HELD_OUT_BOOK = "chesterton-thursday.txt"
HELD_OUT_WIKI_SHARE = 5           # 1 article in 5
TRAIN_DUPE_FACTOR = 5
# max_predictions_per_seq: 15% of the sequence, rounded up as BERT's 20 for 128 (and 80 for 512).
PREDICTIONS_PER_SEQ = {64: 10, 128: 20}
# Data prep of a few MB: Beam in one process, no worker start-up.
BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def _held_out_article(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % HELD_OUT_WIKI_SHARE == 0


def split_text(shared_data: Path, out: Path) -> tuple[Path, Path]:
    """text/train and text/heldout: the books as files, the Wikipedia articles as JSON Lines (one per article)."""
    from data_prep.documents import Document
    from data_prep.readers import read_documents

    train, heldout = out / "text" / "train", out / "text" / "heldout"
    if (train / "DONE").exists() and (heldout / "DONE").exists():
        return train, heldout
    for folder in (train, heldout):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for book in sorted((shared_data / "corpora" / "books").glob("*.txt")):
        shutil.copy(book, (heldout if book.name == HELD_OUT_BOOK else train) / book.name)
    counts = {"train": 0, "heldout": 0}
    with open(train / "wikipedia.jsonl", "w") as train_file, open(heldout / "wikipedia.jsonl", "w") as heldout_file:
        for dump in sorted((shared_data / "corpora" / "wikipedia").glob("*.bz2")):
            for item in read_documents(str(dump), "wikipedia", dump.name):
                if not isinstance(item, Document):
                    continue   # redirects and other pages the reader skips
                side = "heldout" if _held_out_article(item.key) else "train"
                (heldout_file if side == "heldout" else train_file).write(
                    json.dumps({"text": "\n\n".join(item.paragraphs)}) + "\n")
                counts[side] += 1
    (train / "DONE").write_text(json.dumps(counts))
    (heldout / "DONE").write_text(json.dumps(counts))
    print(f"wikipedia articles: {counts['train']} train, {counts['heldout']} held out; book held out: {HELD_OUT_BOOK}")
    return train, heldout


def _inputs(text_dir: Path) -> str:
    return (f"inputs=[{{path: {text_dir}/*.txt, format: books}}, "
            f"{{path: {text_dir}/wikipedia.jsonl, format: jsonl}}]")


def _data_prep(overrides: list[str]) -> None:
    command = [sys.executable, str(REPO_ROOT / "data_prep" / "run.py"), "preset=phase1", *overrides, *BEAM_ARGS]
    subprocess.run(command, check=True, cwd=REPO_ROOT, env=checkout_env(RAYON_NUM_THREADS="2"))


def shard_sets(shared_data: Path, out: Path, seq: int, vocab: str) -> tuple[Path, Path]:
    """(train, heldout) shard sets at sequence length `seq` with `vocab` ("original": BERT's uncased vocabulary, or a
    size: one trained on the training text). Made once; an existing set (its manifest) is kept."""
    train_text, heldout_text = split_text(shared_data, out)
    name = f"{seq}_{vocab}"
    train, heldout = out / name / "train", out / name / "heldout"
    predictions = PREDICTIONS_PER_SEQ[seq]
    common = [f"max_seq_length={seq}", f"max_predictions_per_seq={predictions}", "num_shards=4"]
    if not (train / "manifest.json").exists():
        vocab_args = [] if vocab == "original" else ["vocab.file=null", f"vocab.size={int(vocab)}"]
        _data_prep([_inputs(train_text), f"output_dir={train}", "masking=dynamic",
                    f"dupe_factor={TRAIN_DUPE_FACTOR}", *vocab_args, *common])
    if not (heldout / "manifest.json").exists():
        _data_prep([_inputs(heldout_text), f"output_dir={heldout}", "masking=static", "dupe_factor=1",
                    f"vocab.file={train / 'vocab.txt'}", *common])
    return train, heldout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_data_flag(parser)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "recipe_corpus")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", default="original", help="original, or the size of a vocabulary to train")
    args = parser.parse_args()
    train, heldout = shard_sets(shared_path(args, "corpora").parent, args.out.resolve(), args.seq, args.vocab)
    for path in (train, heldout):
        manifest = json.loads((path / "manifest.json").read_text())
        print(f"{path}: {manifest['totals']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
