"""Reading SQuAD v1.1 JSON (``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``) into one row
per question, the layout Hugging Face's ``squad`` dataset uses:

    id: str, title: str, context: str, question: str, answers: {"text": list[str], "answer_start": list[int]}

The file is parsed by ``datasets.load_dataset("json", field="data")`` and flattened with a batched ``map``, both
cached under ``cache_dir`` by fingerprint. A question without answers (the hidden test set's layout) has empty
answer lists.
"""
from __future__ import annotations

from pathlib import Path

import datasets

from pipeline.finetuning.fingerprint import cache_key, code_digest

SQUAD_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "title": datasets.Value("string"),
    "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32"))},
})

_CODE_DIGEST = code_digest(__file__)


def _flatten(articles: dict[str, list], where: str) -> dict[str, list]:
    """A batch of articles -> one row per question."""
    out: dict[str, list] = {name: [] for name in SQUAD_FEATURES}
    for title, paragraphs in zip(articles.get("title") or [None] * len(articles["paragraphs"]),
                                 articles["paragraphs"]):
        for paragraph in paragraphs or ():
            context = paragraph.get("context")
            if not isinstance(context, str):
                raise ValueError(f"{where}: a paragraph of article {title!r} has no context")
            for qa in paragraph.get("qas") or ():
                if qa.get("id") is None or qa.get("question") is None:
                    raise ValueError(f"{where}: a question of article {title!r} lacks its id or question text")
                answers = qa.get("answers") or []
                out["id"].append(str(qa["id"]))
                out["title"].append(title or "")
                out["context"].append(context)
                out["question"].append(qa["question"])
                out["answers"].append({"text": [a["text"] for a in answers],
                                       "answer_start": [int(a["answer_start"]) for a in answers]})
    return out


def read_squad(path: str | Path, cache_dir: str | Path | None = None) -> datasets.Dataset:
    """One SQuAD v1.1 JSON file as a dataset of questions (columns: see the module docstring).

    A missing file is a ``FileNotFoundError`` and a file that is not SQuAD JSON a ``ValueError``, both naming it.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    where = str(path)
    cache = None if cache_dir is None else str(cache_dir)
    try:
        raw = datasets.load_dataset("json", data_files=str(path), field="data", split="train", cache_dir=cache)
    except Exception as error:   # datasets wraps JSON errors in DatasetGenerationError, among others
        raise ValueError(f"{where} is not a SQuAD JSON file ({type(error).__name__}: {error}); expected "
                         '{"data": [{"title": ..., "paragraphs": [{"context": ..., "qas": [...]}]}]}') from error
    if "paragraphs" not in raw.column_names:
        raise ValueError(f"{where} is not a SQuAD JSON file: its articles have no 'paragraphs' "
                         f"(fields: {', '.join(raw.column_names)})")
    fingerprint = cache_key(raw._fingerprint, _CODE_DIGEST)
    try:
        rows = raw.map(_flatten, batched=True, batch_size=100, remove_columns=raw.column_names,
                       features=SQUAD_FEATURES, fn_kwargs={"where": where}, new_fingerprint=fingerprint,
                       desc="SQuAD questions")
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{where} is not a SQuAD JSON file: a question or answer lacks a field ({error!r})") from error
    if len(rows) == 0:
        raise ValueError(f"{where}: no questions")
    ids = rows.select_columns(["id"]).with_format("arrow")[:].column("id").to_pylist()
    if len(set(ids)) != len(ids):
        seen, duplicates = set(), []
        for qid in ids:
            if qid in seen:
                duplicates.append(qid)
            seen.add(qid)
        raise ValueError(f"{where}: question ids must be unique; repeated: {duplicates[:5]}")
    return rows
