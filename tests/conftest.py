import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers.common_fixtures import one_torch_thread, shared_data  # noqa: F401  (fixtures)
from tests.helpers.shared_builds import built_once
from tests.helpers.slurm import SLURM_APT_COMMAND, SLURM_DAEMONS, SlurmCluster
from tests.helpers.training import run_training_process, tiny_run_overrides
from tests.helpers.wandb_log import wandb_history

REPO_ROOT = Path(__file__).resolve().parents[1]
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
def bert_vocab() -> list[str]:
    from data_prep.vocab import parse_vocab
    return parse_vocab(BUNDLED_VOCAB.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------- a real SLURM
# tests/helpers/slurm.py: started once per session by the tests that need one (tests/pretraining/test_slurm.py,
# tests/finetuning/test_finetune_slurm.py, tests/data_prep/test_dask_runner.py, the workflow's SLURM tests).
def pytest_collection_modifyitems(items):
    """Every test that needs the real SLURM, directly or through a fixture, is marked `slurm`: CI runs those beside
    the others (.ci/run), as they mostly wait on SLURM's queue and Snakemake's status checks."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    # The files that hold a slow test first (stable otherwise): pytest-xdist hands out whole files in this order
    # (.ci/run's --dist loadfile --no-loadscope-reorder), so the longest start first and the short ones fill in beside
    # them at the end.
    with_slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in with_slow)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = [d for d in SLURM_DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(f"SLURM not installed ({', '.join(missing)} not on PATH); install it with: {SLURM_APT_COMMAND}")
    if os.geteuid() != 0:
        pytest.skip("a real slurmd must run as root to launch job tasks")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------------------------- training

BOOK = "austen-persuasion.txt"   # ~470 KB: ~1,200 instances at seq 128 with dupe_factor 1

# Two cores shared with other work: few threads everywhere, subprocesses included. .ci/run sets 1: it runs three
# pytest processes at once (two xdist workers beside the SLURM tests), and more threads than cores only spin.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    try:
        import torch
    except ImportError:   # the data-prep-only install: no torch, nothing to limit
        return
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory, shared_data) -> Path:
    """A phase-1 shard set (seq 128, 20 predictions, static masking, BERT's uncased vocabulary) made by the real
    data_prep job from one real book."""
    book = shared_data / "corpora" / "books" / BOOK
    if not book.is_file():
        pytest.skip(f"{book} not found")
    options = ["preset=phase1", "num_shards=2", "dupe_factor=1", "--runner=DirectRunner",
               "--direct_running_mode=in_memory"]

    def build(out: Path) -> None:
        from data_prep.run import run
        inputs = out.parent / "books"
        inputs.mkdir()
        shutil.copy(book, inputs / BOOK)
        run([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={out}", *options])

    # read by ~50 test files: built once for the session's workers together (tests/helpers/shared_builds.py)
    return built_once(tmp_path_factory, "small_shards", [str(book), options], build, leaf="phase1")


# A finished 4-step tiny run: checkpoints at steps 2 and 4, last.ckpt, its config record; no export.
FINISHED_RUN_EXTRA = ("callbacks.checkpoint.every_n_train_steps=2", "export.hf=false", "export.plot=false")


@pytest.fixture(scope="session")
def finished_tiny_run(small_shards, tmp_path_factory) -> Path:
    """tiny_run_overrides(small_shards, <run>, 4, *FINISHED_RUN_EXTRA), trained in-process under umask 022 (the
    mode a plain write then gives, 0644, is what tests/core/test_checkpoint_file_modes.py reads). Three test files
    read it (the start refusals, the start-over refusals, the file modes): a test that writes into it takes a copy."""
    def overrides(out: Path) -> list[str]:
        return tiny_run_overrides(small_shards, out, 4, *FINISHED_RUN_EXTRA)

    def build(out: Path) -> None:
        from pipeline.core.app import compose
        from pipeline.pretraining.run import train

        previous = os.umask(0o022)
        try:
            train(compose("train", overrides(out)))
        finally:
            os.umask(previous)

    return built_once(tmp_path_factory, "finished_tiny_run", overrides(Path("<run>")), build, leaf="run")


@pytest.fixture(scope="session")
def torch_extensions_dir(tmp_path_factory) -> str:
    """DeepSpeed JIT-builds its CPU comm op (~45 s or more) once per session, into this directory."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(tmp_path_factory.mktemp("torch_extensions"))


# The helpers of tests/helpers/ as fixtures, as the training tests take them.
@pytest.fixture(scope="session")
def tiny_overrides():
    return tiny_run_overrides


@pytest.fixture(scope="session")
def training_process():
    return run_training_process


@pytest.fixture(scope="session")
def read_wandb_history():
    return wandb_history


# ---------------------------------------------------------------------------------------------- fine-tuning

@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A tiny BERT at random initialisation, exported as a Hugging Face directory with BERT's uncased vocabulary:
    what `init=` takes for a downloaded bert-base-uncased, at a size that trains in seconds."""
    def build(out: Path) -> None:
        import torch

        from model import BertConfig, BertForPreTraining
        from model.bert.hf_files import export_hf

        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522, max_position_embeddings=128))
        vocab = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
        assert Path(export_hf(model, out, vocab)) == out

    return built_once(tmp_path_factory, "tiny_bert", "tiny seed 0, vocab 30522, positions 128", build, leaf="hf")
