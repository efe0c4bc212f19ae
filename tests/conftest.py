import os
from pathlib import Path

import pytest
from hypothesis import settings


REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
BUNDLED_VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
SAMPLE_CORPUS = REPO_ROOT / "data_prep" / "sample_corpus"

# Hypothesis: CI must be deterministic (the same examples on every run, no example database carried between
# runs), while local runs keep exploring new random examples. Failures found locally are pinned with @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Tokenizer threads: tests run on a 2-core machine beside other work.
os.environ.setdefault("RAYON_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def bert_vocab() -> list[str]:
    from data_prep.vocab import parse_vocab
    return parse_vocab(BUNDLED_VOCAB.read_text(encoding="utf-8"))
