"""The rows of the study's downstream comparison (study_protocol.md, section 4) and the files that hold them.

    data = StudyData(shared_data, out / "finetune" / "data", quick=False)
    data.training_rows("sst2", 1000, seed=3)   # 0-based rows of the task's training file: the seed's subset
    data.split("sst2", 1000, seed=3)          # SplitFiles: that subset and the scored set (SST-2 dev), as files
    data.selection("sst2")                    # SplitFiles: seed 0's 1,000 against the rate-selection slice
    data.texts(files.train, "sst2")           # (texts, labels) read back through the task's own reader

Rows are counted as `datasets` counts a file's rows: 0-based, the header (SST-2's) not counted, so the protocol's
"rows 1-2,000" of SST-2 are rows 0-1,999 here. Every draw is `numpy.random.default_rng(seed).permutation`:
- SST-2: the selection probe's rows 1-1,000 and the rate-selection rows 1,001-2,000 are never drawn; a seed's 500,
  1,000 and 5,000 are the first rows of its permutation of the rest (nested); scored on the 872 dev sentences.
- IMDB: the rate-selection slice is the first 1,000 of seed 0's permutation of the 25,000 `train` reviews; a seed's
  1,000 the first of its permutation of the other 24,000; scored on the first 5,000 of seed 0's permutation of the
  25,000 `test` reviews.
- STS-B, CoLA: the rate-selection slice is the first 500 of seed 0's permutation of `sts-train` / `in_domain_train`;
  every seed trains on all the other rows (budget "full"), in file order; scored on `sts-dev` / `in_domain_dev`.
The rate selection fine-tunes with seed 0: on seed 0's draw (SST-2, IMDB) or the full set, scored on the slice.

Files are written once (atomically) in the task's own format: SST-2's and CoLA's and STS-B's rows are the original
lines, unchanged; IMDB's reviews become SST-2-format rows (`sentence<TAB>label`, label 1 = pos), `<br />` and every
tab or line break turned into a space. quick=True cuts each scored set and selection slice to its first QUICK_EVAL_ROWS
rows and the full training sets (STS-B, CoLA) to their first QUICK_FULL_ROWS, keeps the label budgets (500, 1,000,
5,000) and writes to its own directory.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import re
from pathlib import Path

import numpy as np

SEEDS = (1, 2, 3, 4, 5)
SELECTION_SEED = 0
BUDGETS = {"sst2": (500, 1000, 5000), "imdb": (1000,), "stsb": ("full",), "cola": ("full",)}
SELECTION_BUDGET = {"sst2": 1000, "imdb": 1000, "stsb": "full", "cola": "full"}
SST2_RESERVED_ROWS = 2000          # rows 1-1,000: the recipe search's selection probe; 1,001-2,000: the rate selection
SST2_SELECTION_ROWS = range(1000, 2000)
SELECTION_SIZE = {"imdb": 1000, "stsb": 500, "cola": 500}
IMDB_TEST_ROWS = 5000
QUICK_EVAL_ROWS = 200
QUICK_FULL_ROWS = 1000             # quick: STS-B's and CoLA's full training sets cut to their first rows

# task -> (training file, scored file) under the shared data folder; IMDB's are JSON lines
SOURCES = {
    "sst2": ("downstream/glue/SST-2/train.tsv", "downstream/glue/SST-2/dev.tsv"),
    "imdb": ("corpora/imdb/train.jsonl.gz", "corpora/imdb/test.jsonl.gz"),
    "stsb": ("downstream/glue/STS-B/sts-train.csv", "downstream/glue/STS-B/sts-dev.csv"),
    "cola": ("downstream/glue/CoLA/in_domain_train.tsv", "downstream/glue/CoLA/in_domain_dev.tsv"),
}
HEADERS = {"sst2": "sentence\tlabel", "imdb": "sentence\tlabel", "stsb": None, "cola": None}
SUFFIX = {"sst2": ".tsv", "imdb": ".tsv", "stsb": ".csv", "cola": ".tsv"}
# the fine-tuning task that reads each task's files: IMDB's rows are in SST-2's format
FINETUNE_TASK = {"sst2": "sst2", "imdb": "sst2", "stsb": "stsb", "cola": "cola"}
IMDB_LABELS = {"neg": "0", "pos": "1"}
_LINE_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    task: str
    train: Path
    eval: Path
    train_rows: int
    eval_rows: int
    eval_name: str        # what the scored set is, for the result files ("SST-2 dev", "rate-selection slice")


def permutation(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)


def clean_review(text: str) -> str:
    """An IMDB review as one SST-2-format field: `<br />` and all white space (tabs, line breaks) as single spaces."""
    return " ".join(_LINE_BREAK.sub(" ", text).split())


class StudyData:
    def __init__(self, shared_data: Path, data_dir: Path, quick: bool = False):
        self.shared_data = Path(shared_data)
        self.data_dir = Path(data_dir)
        self.quick = quick

    # ------------------------------------------------------------------------------------------- which rows

    def selection_rows(self, task: str) -> np.ndarray:
        """The rate-selection slice: rows of the training file that no seed trains on."""
        if task == "sst2":
            return np.asarray(SST2_SELECTION_ROWS)
        return permutation(SELECTION_SEED, self.count(task, "train"))[:SELECTION_SIZE[task]]

    def pool(self, task: str) -> np.ndarray:
        """The training rows a seed's subset is drawn from, in file order."""
        n = self.count(task, "train")
        if task == "sst2":
            return np.arange(SST2_RESERVED_ROWS, n)
        return np.setdiff1d(np.arange(n), self.selection_rows(task))

    def training_rows(self, task: str, budget: int | str, seed: int) -> np.ndarray:
        """A seed's training subset: the first `budget` of its permutation of the pool (nested across budgets), or
        the whole pool for budget "full"."""
        if budget not in BUDGETS[task] and budget != SELECTION_BUDGET[task]:
            raise ValueError(f"{task} has no label budget {budget!r}; the protocol's: {BUDGETS[task]}")
        pool = self.pool(task)
        if budget == "full":
            return pool[:QUICK_FULL_ROWS] if self.quick else pool
        if budget > len(pool):
            raise ValueError(f"{task}: {budget} rows asked, only {len(pool)} to draw from")
        return pool[permutation(seed, len(pool))[:budget]]

    def eval_rows(self, task: str) -> np.ndarray:
        """The scored rows of the evaluation file (IMDB: the fixed 5,000 test reviews)."""
        n = self.count(task, "eval")
        rows = permutation(SELECTION_SEED, n)[:IMDB_TEST_ROWS] if task == "imdb" else np.arange(n)
        return rows[:QUICK_EVAL_ROWS] if self.quick else rows

    # ------------------------------------------------------------------------------------------- as files

    def split(self, task: str, budget: int | str, seed: int) -> SplitFiles:
        """A seed's training subset and the scored set, as files."""
        train = self._write(task, f"train-{budget}" + ("" if budget == "full" else f"-seed{seed}"), "train",
                            self.training_rows(task, budget, seed))
        scored = self._write(task, "eval", "eval", self.eval_rows(task))
        names = {"sst2": "SST-2 dev", "imdb": f"IMDB test (the fixed {IMDB_TEST_ROWS:,})", "stsb": "STS-B sts-dev",
                 "cola": "CoLA in_domain_dev"}
        name = names[task] + (f", its first {QUICK_EVAL_ROWS} rows" if self.quick else "")
        return SplitFiles(task, train, scored, *self._counts(task, budget, seed), name)

    def selection(self, task: str) -> SplitFiles:
        """What the rate selection fine-tunes on (seed 0's draw, or the full set) and scores on (the slice)."""
        budget = SELECTION_BUDGET[task]
        files = self.split(task, budget, SELECTION_SEED)
        rows = self.selection_rows(task)[:QUICK_EVAL_ROWS] if self.quick else self.selection_rows(task)
        scored = self._write(task, "selection", "train", rows)
        return dataclasses.replace(files, eval=scored, eval_rows=len(rows), eval_name="rate-selection slice")

    def texts(self, path: Path, task: str, cache_dir: Path | None = None) -> tuple[list[str], list[int]]:
        """A written file's texts and labels, read by the fine-tuning task's own reader (single-sentence tasks)."""
        from pipeline.finetuning.tasks import get_task

        rows = get_task(FINETUNE_TASK[task]).read("dev", str(path), cache_dir=None if cache_dir is None else
                                                  str(cache_dir))
        return list(rows["text_a"]), [int(label) for label in rows["label"]]

    def _counts(self, task: str, budget: int | str, seed: int) -> tuple[int, int]:
        return len(self.training_rows(task, budget, seed)), len(self.eval_rows(task))

    def _write(self, task: str, name: str, side: str, rows: np.ndarray) -> Path:
        """The rows as a file in the task's format; an existing file is kept when it holds exactly them (so the
        caches of what read it stay valid), else replaced."""
        path = self.data_dir / ("quick" if self.quick else "full") / task / f"{name}{SUFFIX[task]}"
        lines = self.lines(task, side)
        header = [HEADERS[task]] if HEADERS[task] else []
        text = "\n".join([*header, *(lines[i] for i in rows)]) + "\n"
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)   # never a half-written file under the final name
        return path

    # ------------------------------------------------------------------------------------------- the originals

    def count(self, task: str, side: str) -> int:
        return len(self.lines(task, side))

    def lines(self, task: str, side: str) -> list[str]:
        """The rows of a task's training ("train") or scored ("eval") file, one line each, the header left out."""
        path = self.shared_data / SOURCES[task][0 if side == "train" else 1]
        if not path.is_file():
            raise FileNotFoundError(f"{task}: {path} not found (the shared data folder: --shared-data)")
        return _source_rows(path, task)


@functools.cache
def _source_rows(path: Path, task: str) -> list[str]:
    """Read once per process: every arm draws from the same files."""
    return _imdb_rows(path) if task == "imdb" else file_rows(path, HEADERS[task])


def file_rows(path: Path, header: str | None) -> list[str]:
    """A GLUE-style file's rows, its header checked and dropped (public: gpu_general_text.py reads whole files)."""
    # newline="": lines end where pandas' reader ends them (\n, \r\n or \r); blank lines are skipped as it skips them
    with open(path, encoding="utf-8", newline="") as handle:
        lines = [line.rstrip("\r\n") for line in handle]
    lines = [line for line in lines if line.strip()]
    if header is not None:
        if not lines or lines[0].split("\t") != header.split("\t"):
            raise ValueError(f"{path}: expected the header {header!r}, found {lines[0] if lines else 'nothing'!r}")
        lines = lines[1:]
    return lines


def _imdb_rows(path: Path) -> list[str]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            review = json.loads(line)
            text, label = clean_review(review["text"]), IMDB_LABELS.get(review["label"])
            if not text or label is None:
                raise ValueError(f"{path}, line {number}: an empty review or a label not in {sorted(IMDB_LABELS)}: "
                                 f"{review.get('label')!r}")
            rows.append(f"{text}\t{label}")
    return rows
