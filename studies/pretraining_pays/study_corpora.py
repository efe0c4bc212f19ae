"""The study's corpora (study_protocol.md, section 1): the general and the domain corpus split into a
training and a held-out side by a hash of each document's identity, decontaminated against the evaluation texts,
written as JSON Lines; then their vocabularies and shard sets, made by data_prep.

    build_corpora(shared_data, out, quick)          -> out/corpora/<corpus>/{train,heldout}/part-NN.jsonl, stats.json
    shard_sets(out, corpus, vocab, seq, objective)  -> (train, heldout) shard set directories (made once)

The vocabulary of (corpus, size) is trained once, by the first shard set of that pair (at sequence length 128, MLM
only), and pinned by every other set of the pair, so the sets of one vocabulary share one tokenizer.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from benchmarks_common import REPO_ROOT, checkout_env

HELD_OUT_ONE_IN = 50
MIN_CHECKED_WORDS = 6          # evaluation sentences shorter than this are too generic to be evidence
TEXT_FILES_PER_SIDE = 8        # JSONL files per side: units of parallel work for data_prep
PREDICTIONS_PER_SEQ = {64: 10, 128: 20}
BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
QUICK_BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]   # a few MB: no worker start-up
_WORD = re.compile(r"[^\W_]+")
_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
# The quick chain's slices: a few of each source.
QUICK = {"wikiextractor_files": 2, "books": 3, "imdb_reviews": 3000, "imdb_test": 2000}


def words(text: str) -> tuple[str, ...]:
    """Normalised words: lowercased, split on anything that is not a letter or a digit."""
    return tuple(_WORD.findall(text.lower()))


def is_held_out(identity: str) -> bool:
    return int(hashlib.sha256(identity.encode("utf-8")).hexdigest(), 16) % HELD_OUT_ONE_IN == 0


def _norm_title(title: str) -> str:
    return " ".join(title.lower().split())


def _jsonl(path: Path, limit: int | None = None) -> Iterator[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if limit is not None and number >= limit:
                return
            yield json.loads(line)


class EvaluationTexts:
    """The texts no pre-training document may contain: SST-2 dev and STS-B sentences (as word sequences), the IMDB
    test reviews (as whole texts)."""

    def __init__(self, shared_data: Path, quick: bool = False):
        glue = shared_data / "downstream" / "glue"
        sentences = [line.split("\t")[0] for line in
                     (glue / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
        for split in ("train", "dev", "test"):
            for line in (glue / "STS-B" / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines():
                fields = line.split("\t")
                if len(fields) >= 7:
                    sentences += fields[5:7]
        checked = {words(s) for s in sentences}
        self.too_short = sum(1 for w in checked if len(w) < MIN_CHECKED_WORDS)
        self.sentences = {w for w in checked if len(w) >= MIN_CHECKED_WORDS}
        self.by_start: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for sentence in self.sentences:
            self.by_start.setdefault(sentence[:3], []).append(sentence)
        test = _jsonl(shared_data / "corpora" / "imdb" / "test.jsonl.gz", QUICK["imdb_test"] if quick else None)
        self.imdb_test = {hashlib.sha256(" ".join(words(r["text"])).encode()).digest() for r in test}

    def found_in(self, text: str) -> str | None:
        """Why `text` may not be pre-trained on (which evaluation text it contains), or None."""
        seq = words(text)
        if hashlib.sha256(" ".join(seq).encode()).digest() in self.imdb_test:
            return "an IMDB test review"
        for i, start in enumerate(zip(seq, seq[1:], seq[2:])):
            for sentence in self.by_start.get(start, ()):
                if seq[i:i + len(sentence)] == sentence:
                    return "an SST-2 dev or STS-B sentence: " + " ".join(sentence)
        return None

    def describe(self) -> dict:
        return {"sentences_checked": len(self.sentences), f"sentences_under_{MIN_CHECKED_WORDS}_words": self.too_short,
                "imdb_test_reviews": len(self.imdb_test)}


class _FirstCheck:
    """The first protocol's check as build_corpora applies it: a document that holds an evaluation text goes whole."""

    def __init__(self, shared_data: Path, quick: bool):
        self.evaluation = EvaluationTexts(shared_data, quick)

    def __call__(self, corpus: str, paragraphs: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
        reason = self.evaluation.found_in("\n\n".join(paragraphs))
        return ((), [reason]) if reason else (paragraphs, [])

    def describe(self) -> dict:
        return self.evaluation.describe()


def _count_removal(stats: Counter, dropped: list[dict], identity: str, paragraphs, kept, reasons: list) -> None:
    stats["dropped_contaminated" if not kept else "documents_cut"] += 1
    if isinstance(reasons[0], str):   # the first protocol's check: one reason, the document dropped (its record)
        dropped.append({"document": identity, "contains": reasons[0]})
        return
    stats["paragraphs_removed"] += len(paragraphs) - len(kept)
    stats["words_removed"] += len(words("\n\n".join(paragraphs))) - len(words("\n\n".join(kept)))
    for reason in reasons:
        stats[f"matches_{reason['rule']}_{reason['eval_set']}"] += 1
    dropped.append({"document": identity, "kept_paragraphs": len(kept), "of": len(paragraphs), "matches": reasons})


def general_documents(corpora: Path, stats: Counter, quick: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(identity, paragraphs): WikiExtractor's articles, the MediaWiki sample's not already among them (by title),
    the Gutenberg books."""
    from data_prep.documents import Document
    from data_prep.readers import read_documents

    titles: set[str] = set()
    extracted = sorted((corpora / "wikipedia_extracted").rglob("wiki_*"))
    for path in extracted[:QUICK["wikiextractor_files"]] if quick else extracted:
        for item in read_documents(str(path), "wikiextractor", path.name):
            if isinstance(item, Document):
                titles.add(_norm_title(item.title))
                yield f"wiki:{item.title}", item.paragraphs
    for path in [] if quick else sorted((corpora / "wikipedia").glob("*.bz2")):
        for item in read_documents(str(path), "wikipedia", path.name):
            if isinstance(item, Document):
                if _norm_title(item.title) in titles:
                    stats["mediawiki_duplicate_titles_dropped"] += 1
                    continue
                titles.add(_norm_title(item.title))
                yield f"wiki:{item.title}", item.paragraphs
    books = sorted((corpora / "gutenberg").glob("*.txt.gz"))
    for path in books[:QUICK["books"]] if quick else books:
        for item in read_documents(str(path), "books", path.name):
            if isinstance(item, Document):
                yield f"book:{path.name}", item.paragraphs


def domain_documents(corpora: Path, stats: Counter, quick: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(identity, paragraphs): the IMDB unsup and train reviews without labels, exact duplicates dropped."""
    from data_prep.readers.tabular import text_paragraphs

    seen: set[str] = set()
    for split in ("unsup", "train"):
        limit = QUICK["imdb_reviews"] // 2 if quick else None
        for record in _jsonl(corpora / "imdb" / f"{split}.jsonl.gz", limit):
            text = _BREAK.sub("\n\n", record["text"])
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if digest in seen:
                stats["imdb_duplicates_dropped"] += 1
                continue
            seen.add(digest)
            yield f"imdb:{digest}", text_paragraphs(text)


def build_corpora(shared_data: Path, out: Path, quick: bool = False, check=None) -> dict[str, Path]:
    """Both corpora as JSONL under out/corpora/<name>/{train,heldout}/, made once (a DONE file with the counts).
    check(shared_data, quick) makes the decontamination: a callable (corpus, paragraphs) -> (the paragraphs kept,
    why the others went) with describe(); the first protocol's by default, study_decontamination.SecondCheck for
    the second."""
    corpora = shared_data / "corpora"
    evaluation = None
    made = {}
    for name, documents in (("general", general_documents), ("domain", domain_documents)):
        root = out / "corpora" / name
        made[name] = root
        if (root / "DONE").exists():
            continue
        evaluation = evaluation or (check(shared_data, quick) if check else _FirstCheck(shared_data, quick))
        shutil.rmtree(root, ignore_errors=True)
        stats: Counter = Counter()
        dropped: list[dict] = []
        files = {side: [open(_part(root, side, k), "w", encoding="utf-8") for k in range(TEXT_FILES_PER_SIDE)]
                 for side in ("train", "heldout")}
        try:
            for identity, paragraphs in documents(corpora, stats, quick):
                kept, reasons = evaluation(name, paragraphs)
                if reasons:
                    _count_removal(stats, dropped, identity, paragraphs, kept, reasons)
                if not kept:
                    continue
                text = "\n\n".join(kept)
                side = "heldout" if is_held_out(identity) else "train"
                stats[f"{side}_documents"] += 1
                stats[f"{side}_words"] += len(words(text))
                handle = files[side][stats[f"{side}_documents"] % TEXT_FILES_PER_SIDE]
                handle.write(json.dumps({"text": text}) + "\n")
        finally:
            for handles in files.values():
                for handle in handles:
                    handle.close()
        for side in files:   # a file no document went to would be an empty input
            for k in range(TEXT_FILES_PER_SIDE):
                if _part(root, side, k).stat().st_size == 0:
                    _part(root, side, k).unlink()
        summary = {"counts": dict(stats), "evaluation_texts": evaluation.describe(), "dropped": dropped}
        (root / "stats.json").write_text(json.dumps(summary, indent=1))
        (root / "DONE").write_text(json.dumps(dict(stats)))
        print(f"corpus {name}: {dict(stats)}", flush=True)
    return made


def _part(root: Path, side: str, k: int) -> Path:
    path = root / side / f"part-{k:02d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def is_quick(out: Path) -> bool:
    """The quick chain's output directory (bench_downstream.py --quick marks it): everything in this process."""
    return (out / "QUICK").exists()


def shard_set_name(corpus: str, vocab: int, seq: int, objective: str) -> str:
    return f"{corpus}_v{vocab}_s{seq}_{objective}"


def shard_sets(out: Path, corpus: str, vocab: int, seq: int, objective: str) -> tuple[Path, Path]:
    """(train, heldout) shard sets of the corpus at this vocabulary size, sequence length and objective ('mlm' or
    'mlm_nsp'); the vocabulary trained by the pair's (128, mlm) set first."""
    root = out / "shards" / shard_set_name(corpus, vocab, seq, objective)
    train, heldout = root / "train", root / "heldout"
    text = out / "corpora" / corpus
    common = ["preset=phase1", f"max_seq_length={seq}", f"max_predictions_per_seq={PREDICTIONS_PER_SEQ[seq]}",
              f"objective={objective}", "dupe_factor=1",
              *(QUICK_BEAM_ARGS if is_quick(out) else BEAM_ARGS)]
    if not (train / "manifest.json").exists():
        first = out / "shards" / shard_set_name(corpus, vocab, 128, "mlm") / "train"
        if first == train:
            vocab_args = ["vocab.file=null", f"vocab.size={vocab}", "vocab.sample_mb=100"]
        else:
            vocab_args = [f"vocab.file={shard_sets(out, corpus, vocab, 128, 'mlm')[0] / 'vocab.txt'}"]
        _data_prep([f"inputs=[{{path: '{text}/train/*.jsonl', format: jsonl}}]", f"output_dir={train}",
                    "masking=dynamic", *vocab_args, *common], is_quick(out))
    if not (heldout / "manifest.json").exists():
        _data_prep([f"inputs=[{{path: '{text}/heldout/*.jsonl', format: jsonl}}]", f"output_dir={heldout}",
                    "masking=static", f"vocab.file={train / 'vocab.txt'}", "num_shards=1", *common], is_quick(out))
    return train, heldout


def _data_prep(overrides: list[str], in_process: bool) -> None:
    if in_process:
        from data_prep.run import run
        run(overrides)
        return
    command = [sys.executable, str(REPO_ROOT / "data_prep" / "run.py"), *overrides]
    done = subprocess.run(command, cwd=REPO_ROOT, env=checkout_env(RAYON_NUM_THREADS="1"), capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
