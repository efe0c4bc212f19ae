"""Decontamination of the second protocol (evidence_protocol.md, section 1): which pre-training text matches an
evaluation text, after one normalisation applied to both sides.

    normalised_words(text)                  -> ("doesnt", "work", ...): markup, SST-2 tokens, case, apostrophes
    texts = EvaluationIndex.from_shared(shared_data)    SST-2 dev, STS-B, CoLA dev, IMDB test
    texts.matches(words)                    -> [Match(rule, eval_set, eval_index, start, end)] in the pre-training text
    clean_paragraphs(texts, paragraphs)     -> (the paragraphs no match touches, the matches)
    check = SecondCheck(shared_data)        study_corpora.build_corpora's check: a review goes whole, a book or an
    check("general", paragraphs)            article loses the paragraphs a match touches -> (kept, removed-because)

The first protocol compared raw IMDB test reviews (`<br />` kept) with documents whose `<br />` had become paragraph
breaks, and SST-2's "does n't" with "doesn't" split by the same rule as "doesn t": neither could match. Here both sides
go through `normalised_words`, and three rules apply: exact (the same word sequence), near (a shared run of NEAR_WORDS
words, as large-model decontamination checks long shared n-grams) and contained (a 6-24-word evaluation sentence
inside the text).
"""
from __future__ import annotations

import dataclasses
import gzip
import html
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

NEAR_WORDS = 25
MIN_CHECKED_WORDS = 6          # shorter evaluation sentences ("good") are too generic to be evidence
_TAG = re.compile(r"<[^>]*>")
_PTB_BRACKET = re.compile(r"-[lr][rsc]b-", re.IGNORECASE)
_SPLIT_CONTRACTION = re.compile(r"\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE)
_APOSTROPHE = re.compile(r"['\u2019`]")
_WORD = re.compile(r"[^\W_]+")
_OFFSET = 100_000              # a near-match key packs (evaluation text, word offset); no text has 100,000 words


def normalised_words(text: str) -> tuple[str, ...]:
    """The words both sides are compared by (protocol section 1, steps 1-4)."""
    text = html.unescape(_TAG.sub(" ", text))
    text = _SPLIT_CONTRACTION.sub(r"\1", _PTB_BRACKET.sub(" ", text))
    text = _APOSTROPHE.sub("", unicodedata.normalize("NFKC", text).lower())
    return tuple(_WORD.findall(text))


@dataclasses.dataclass(frozen=True)
class Match:
    rule: str              # "exact", "near" or "contained"
    eval_set: str          # "sst2_dev", "stsb", "cola_dev", "imdb_test"
    eval_index: int        # the text's position in its set, as EvaluationIndex read it
    start: int             # the matched words of the pre-training text: words[start:end]
    end: int


class EvaluationIndex:
    """Every evaluation text as normalised words, indexed for the three rules."""

    def __init__(self, texts: dict[str, Sequence[str]]):
        self.sets = list(texts)
        self.words: list[tuple[str, ...]] = []
        self.origin: list[tuple[str, int]] = []
        for name, items in texts.items():
            for index, text in enumerate(items):
                self.words.append(normalised_words(text))
                self.origin.append((name, index))
        self.number = {origin: number for number, origin in enumerate(self.origin)}
        self.too_short = {name: 0 for name in texts}
        self.exact: dict[tuple[str, ...], list[int]] = {}
        self.by_start: dict[tuple[str, ...], list[int]] = {}     # 6-24-word texts by their first three words
        self.grams: dict[int, int | list[int]] = {}               # hash of a 25-word run -> key(s) (text, offset)
        for number, words in enumerate(self.words):
            if len(words) < MIN_CHECKED_WORDS:
                self.too_short[self.origin[number][0]] += 1
                continue
            self.exact.setdefault(words, []).append(number)
            if len(words) < NEAR_WORDS:
                self.by_start.setdefault(words[:3], []).append(number)
            seen: set[tuple[str, ...]] = set()
            for offset in range(len(words) - NEAR_WORDS + 1):
                gram = words[offset:offset + NEAR_WORDS]
                if gram not in seen:
                    seen.add(gram)
                    self._index_gram(hash(gram), number * _OFFSET + offset)

    def _index_gram(self, digest: int, key: int) -> None:
        held = self.grams.get(digest)
        if held is None:
            self.grams[digest] = key
        elif isinstance(held, list):
            held.append(key)
        else:
            self.grams[digest] = [held, key]

    @classmethod
    def from_shared(cls, shared_data: Path, imdb_test_limit: int | None = None) -> EvaluationIndex:
        return cls(evaluation_sets(shared_data, imdb_test_limit))

    def counts(self) -> dict[str, dict[str, int]]:
        sizes = {name: 0 for name in self.sets}
        for name, _ in self.origin:
            sizes[name] += 1
        return {name: {"texts": sizes[name], f"under_{MIN_CHECKED_WORDS}_words_not_checked": self.too_short[name]}
                for name in self.sets}

    def _match(self, rule: str, number: int, start: int, end: int) -> Match:
        name, index = self.origin[number]
        return Match(rule, name, index, start, end)

    def matches(self, words: Sequence[str]) -> list[Match]:
        """Every match of the three rules in a pre-training text's normalised words (each evaluation text once per
        rule, at its first place)."""
        words = tuple(words)
        found: dict[tuple[str, int], Match] = {}
        for number in self.exact.get(words, ()):
            found[("exact", number)] = self._match("exact", number, 0, len(words))
        for start in range(len(words) - MIN_CHECKED_WORDS + 1):
            for number in self.by_start.get(words[start:start + 3], ()):
                size = len(self.words[number])
                if ("contained", number) not in found and words[start:start + size] == self.words[number]:
                    found[("contained", number)] = self._match("contained", number, start, start + size)
            if start + NEAR_WORDS > len(words):
                continue
            gram = words[start:start + NEAR_WORDS]
            held = self.grams.get(hash(gram))
            for key in () if held is None else held if isinstance(held, list) else (held,):
                number, offset = divmod(key, _OFFSET)
                # the hash found it; the words decide (no false match from a collision)
                if ("near", number) not in found and self.words[number][offset:offset + NEAR_WORDS] == gram:
                    found[("near", number)] = self._match("near", number, start, start + NEAR_WORDS)
        return list(found.values())


def clean_paragraphs(texts: EvaluationIndex, paragraphs: Sequence[str]) -> tuple[list[str], list[Match]]:
    """The paragraphs that no match touches (matches are found in the whole document's words, so a run across a
    paragraph break counts), and the matches."""
    per_paragraph = [normalised_words(paragraph) for paragraph in paragraphs]
    found = texts.matches([word for words in per_paragraph for word in words])
    if not found:
        return list(paragraphs), found
    touched, start = set(), 0
    for number, words in enumerate(per_paragraph):
        end = start + len(words)
        if any(match.start < end and start < match.end for match in found):
            touched.add(number)
        start = end
    return [p for number, p in enumerate(paragraphs) if number not in touched], found


class SecondCheck:
    """The check build_corpora applies to each document of the second protocol's corpora (section 1, "What is
    removed"): the domain corpus's documents are reviews, removed whole; the general corpus's are books and articles
    of thousands of words, which lose only the paragraphs a match touches."""

    WHOLE_DOCUMENT = {"domain": True, "general": False}
    SHOWN_WORDS = 12     # of each match, in the report

    def __init__(self, shared_data: Path, quick: bool = False):
        from study_corpora import QUICK

        self.index = EvaluationIndex.from_shared(shared_data, QUICK["imdb_test"] if quick else None)

    def __call__(self, corpus: str, paragraphs: Sequence[str]) -> tuple[list[str], list[dict]]:
        kept, found = clean_paragraphs(self.index, paragraphs)
        if found and self.WHOLE_DOCUMENT[corpus]:
            kept = []
        return kept, [{"rule": match.rule, "eval_set": match.eval_set, "eval_index": match.eval_index,
                       "words": " ".join(self._words(match)[:self.SHOWN_WORDS])} for match in found]

    def _words(self, match: Match) -> tuple[str, ...]:
        return self.index.words[self.index.number[match.eval_set, match.eval_index]]

    def describe(self) -> dict:
        return {"check": "second protocol (evidence_protocol.md, section 1)", "near_words": NEAR_WORDS,
                "evaluation_sets": self.index.counts()}


def evaluation_sets(shared_data: Path, imdb_test_limit: int | None = None) -> dict[str, list[str]]:
    """The evaluation texts as the task files hold them (protocol section 1)."""
    glue = shared_data / "downstream" / "glue"
    sst2 = [line.rsplit("\t", 1)[0] for line in
            (glue / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    stsb = [sentence for split in ("train", "dev", "test")
            for fields in _tsv(glue / "STS-B" / f"sts-{split}.csv") if len(fields) >= 7 for sentence in fields[5:7]]
    cola = [fields[3] for fields in _tsv(glue / "CoLA" / "in_domain_dev.tsv") if len(fields) >= 4]
    with gzip.open(shared_data / "corpora" / "imdb" / "test.jsonl.gz", "rt", encoding="utf-8") as handle:
        imdb = [json.loads(line)["text"] for number, line in enumerate(handle)
                if imdb_test_limit is None or number < imdb_test_limit]
    return {"sst2_dev": sst2, "stsb": stsb, "cola_dev": cola, "imdb_test": imdb}


def _tsv(path: Path) -> Iterable[list[str]]:
    return (line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
