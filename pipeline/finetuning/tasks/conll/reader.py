"""Reading CoNLL-2003 files: the original release (eng.train / eng.testa / eng.testb, IOB1) and the IOB2 copies
many redistributions use (train.txt / valid.txt / test.txt).

The format: one token per line, four columns separated by spaces (token, POS tag, chunk tag, NER tag); a blank line
ends a sentence; a ``-DOCSTART- -X- -X- O`` line starts a document (Reuters articles; sentences before any
``-DOCSTART-`` form a document of their own). Columns are split on spaces and tabs only (a token may hold other
Unicode spaces, e.g. U+00A0).

Read here in plain Python rather than through ``datasets.load_dataset``: a malformed line (not four columns, a tag
that is not ``O`` / ``B-TYPE`` / ``I-TYPE`` of a known type) must stop the read with the file and its 1-based line
number, which ``datasets``' text and csv builders cannot give, and telling IOB1 from IOB2 needs every tag of the file
in order. (The hub's ``conll2003`` is a loading script, which ``datasets`` no longer runs, and may not be
redistributed.) The parsed rows then become a ``datasets.Dataset`` through ``Dataset.from_generator`` under
``cache_dir``, fingerprinted by the file's bytes, the settings and this module's code, so the features mapped from it
are cached by ``datasets`` like every other task's.

IOB1 or IOB2, and the rule that tells them apart
-----------------------------------------------
In both encodings a ``B-X`` always starts an entity and an ``I-X`` right after a ``B-X`` or ``I-X`` continues it. They
differ in what starts an entity that does not immediately follow one of the same type: IOB2 writes ``B-X`` there,
IOB1 writes ``I-X`` (IOB1 keeps ``B-X`` for an entity that directly follows another of type X). So:

* an ``I-X`` that starts an entity (first in its sentence, or after ``O``, or after a tag of another type) happens
  only in IOB1 - ``scheme="auto"`` calls a file with at least one such tag IOB1, and IOB2 otherwise (a file whose
  entities all start with ``B-``, or one with no entities at all, where the two read alike);
* ``scheme="iob2"`` refuses such a tag (ValueError with the file and line: the file is probably IOB1);
* ``scheme="iob1"`` accepts a ``B-X`` anywhere (it starts an entity in either reading, as conlleval reads it), so
  IOB1 files that also use ``B-`` after ``O`` are read as meant.

Labels are always returned in IOB2: every ``I-X`` that starts an entity becomes ``B-X``; everything else is kept.
This conversion is the identity on IOB2, so the configured or detected scheme never changes a correct file's
entities - it decides only what counts as malformed. Entities never continue across a sentence boundary.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import datasets

from pipeline.finetuning.fingerprint import code_digest

log = logging.getLogger(__name__)

SCHEMES = ("auto", "iob1", "iob2")
DOCSTART = "-DOCSTART-"
COLUMNS = ("token", "POS", "chunk", "NER")
ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
"""CoNLL-2003's nine IOB2 tags in label-id order (the order of the hub's conll2003 ClassLabel)."""

FEATURES = datasets.Features({
    "idx": datasets.Value("int64"),          # the sentence's position in the file, from 0
    "doc_index": datasets.Value("int64"),    # its document's position in the file, from 0
    "words": datasets.List(datasets.Value("string")),
    "labels": datasets.List(datasets.Value("string")),   # IOB2
})

_FIELD_SEPARATOR = re.compile(r"[ \t]+")
_TAG = re.compile(r"(?:([BI])-(.+)|O)")
_CODE_DIGEST = code_digest(__file__)


@dataclasses.dataclass
class ConllFile:
    """One parsed file: per sentence its document, words and IOB2 labels; the scheme it was read as."""
    path: Path
    scheme: str                   # "iob1" or "iob2": as configured, or as detected with scheme="auto"
    doc_index: list[int]
    words: list[list[str]]
    labels: list[list[str]]       # IOB2
    documents: int
    entity_starting_i_tags: int   # I- tags that start an entity (IOB1 evidence)

    def rows(self) -> Iterator[dict]:
        for idx, (doc, words, labels) in enumerate(zip(self.doc_index, self.words, self.labels)):
            yield {"idx": idx, "doc_index": doc, "words": words, "labels": labels}


def parse_conll(path: str | Path, scheme: str = "auto",
                entity_types: tuple[str, ...] | None = ENTITY_TYPES) -> ConllFile:
    """Parse and check a CoNLL-2003 file (see the module's docstring). ``entity_types``: the types a tag may name
    (None: any). Raises ValueError naming the file and the 1-based line of the first malformed line."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such CoNLL file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        line = path.read_bytes()[:error.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text. Re-encode the file as UTF-8.") from error

    doc_index: list[int] = []
    words: list[list[str]] = []
    tags: list[list[str]] = []
    tag_lines: list[list[int]] = []
    document = -1                            # -1: no document yet (sentences before any -DOCSTART- make one)
    current: tuple[list[str], list[str], list[int]] = ([], [], [])

    def end_sentence() -> None:
        nonlocal document, current
        if current[0]:
            document = max(document, 0)
            doc_index.append(document)
            words.append(current[0])
            tags.append(current[1])
            tag_lines.append(current[2])
            current = ([], [], [])

    for number, line in enumerate(text.split("\n"), start=1):
        content = line.rstrip("\r").strip(" \t")
        if not content:
            end_sentence()
            continue
        fields = _FIELD_SEPARATOR.split(content)
        if fields[0] == DOCSTART:
            end_sentence()
            document += 1
            continue
        if len(fields) != len(COLUMNS):
            raise ValueError(f"{path}, line {number}: {len(fields)} columns, expected {len(COLUMNS)} "
                             f"({' '.join(COLUMNS)}, separated by spaces): {content[:200]!r}")
        tag = fields[3]
        match = _TAG.fullmatch(tag)
        if match is None or (match.group(2) is not None and entity_types is not None
                             and match.group(2) not in entity_types):
            known = "any type" if entity_types is None else " ".join(entity_types)
            raise ValueError(f"{path}, line {number}: unknown NER tag {tag!r} (expected O, B-TYPE or I-TYPE with "
                             f"TYPE one of {known}): {content[:200]!r}")
        current[0].append(fields[0])
        current[1].append(tag)
        current[2].append(number)
    end_sentence()
    if not words:
        raise ValueError(f"{path}: no sentences (an empty CoNLL file?)")

    labels, starts = [], 0
    for sentence_tags, lines in zip(tags, tag_lines):
        converted = to_iob2(sentence_tags)
        for tag, new, number, previous in zip(sentence_tags, converted, lines, ["", *sentence_tags[:-1]]):
            if tag != new:            # an I- that starts an entity
                starts += 1
                if scheme == "iob2":
                    after = f"after {previous}" if previous else "first in its sentence"
                    raise ValueError(f"{path}, line {number}: {tag} starts an entity ({after}), which IOB2 never "
                                     f"does (it starts every entity with B-). This looks like IOB1, as in the "
                                     f"original CoNLL-2003 files: read it with scheme='iob1' or 'auto'.")
        labels.append(converted)
    resolved = scheme if scheme != "auto" else ("iob1" if starts else "iob2")
    return ConllFile(path=path, scheme=resolved, doc_index=doc_index, words=words, labels=labels,
                     documents=doc_index[-1] + 1, entity_starting_i_tags=starts)


def to_iob2(tags: list[str]) -> list[str]:
    """One sentence's IOB1 (or IOB2) tags in IOB2: an I-X not preceded by B-X or I-X becomes B-X."""
    out, previous_type = [], None
    for tag in tags:
        if tag == "O":
            out.append(tag)
            previous_type = None
            continue
        prefix, kind = tag[0], tag[2:]
        out.append(f"B-{kind}" if prefix == "I" and previous_type != kind else tag)
        previous_type = kind
    return out


def _generate(parsed: _Holder) -> Iterator[dict]:
    yield from parsed.file.rows()


class _Holder:
    """Carries the parsed file into from_generator without datasets hashing or sharding its lists."""

    def __init__(self, parsed: ConllFile):
        self.file = parsed


def read_conll(path: str | Path, scheme: str = "auto", cache_dir: str | Path | None = None,
               entity_types: tuple[str, ...] | None = ENTITY_TYPES) -> datasets.Dataset:
    """A CoNLL-2003 file as a ``datasets.Dataset`` of sentences, columns ``idx``, ``doc_index``, ``words``,
    ``labels`` (IOB2); see :data:`FEATURES`. The scheme read is in ``dataset.info.description``."""
    parsed = parse_conll(path, scheme, entity_types)
    digest = hashlib.sha256(Path(path).read_bytes())
    digest.update(f"|{scheme}|{entity_types}|{_CODE_DIGEST}".encode())
    dataset = datasets.Dataset.from_generator(
        _generate, features=FEATURES, cache_dir=None if cache_dir is None else str(cache_dir),
        gen_kwargs={"parsed": _Holder(parsed)}, fingerprint=f"conll-{digest.hexdigest()[:32]}")
    dataset.info.description = f"CoNLL-2003 {parsed.path.name}: {parsed.scheme.upper()}"
    log.info("%s: %d sentences in %d documents, read as %s%s", parsed.path, len(parsed.words), parsed.documents,
             parsed.scheme.upper(), " (detected)" if scheme == "auto" else "")
    return dataset
