"""Fixtures of the data-prep job tests."""
import json

import pytest

from data_prep.segmentation import split_sentences


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, shared_data):
    """Real text in three input formats: reference-format sentence files, JSONL, and a Gutenberg book."""
    root = tmp_path_factory.mktemp("corpus")
    text = (shared_data / "corpora" / "books" / "austen-persuasion.txt").read_text(encoding="utf-8")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    documents = [paragraphs[i:i + 12] for i in range(0, 600, 12)]
    (root / "sentences").mkdir()
    for part in range(2):
        with open(root / "sentences" / f"part-{part}.txt", "w", encoding="utf-8") as out:
            for doc in documents[part::2][:20]:
                out.write("\n".join(s for p in doc for s in split_sentences(p)) + "\n\n")
    with open(root / "records.jsonl", "w", encoding="utf-8") as out:
        for doc in documents[40:]:
            out.write(json.dumps({"text": "\n\n".join(doc)}) + "\n")
    return root
