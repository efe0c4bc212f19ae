"""PretrainingDataModule under a real Lightning Trainer: validation before training, epochs, exact resume."""
import contextlib
import hashlib
import logging
import warnings

import pytest
import torch

from tests.helpers.shard_sets import SMALL_BOOKS, shared_books_set

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402

from pipeline.pretraining.data.datamodule import PretrainingDataModule  # noqa: E402

BATCH = 256                # the set's 1,641 rows make 6 batches per epoch
STEPS = 14                 # two epochs and two batches


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def static_set(tmp_path_factory, shared_data):
    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    return shared_books_set(tmp_path_factory, "static", books)


class BatchRecorder(pl.LightningModule):
    """Trains nothing; records (epoch, batch_idx, a fingerprint of the batch) for every training step."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        fingerprint = hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest()[:12]
        self.seen.append((self.current_epoch, batch_idx, fingerprint))
        return (self.weight * batch["input_ids"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(path, *, num_workers=0, reload=0, checkpoint_dir=None, ckpt_path=None, max_steps=STEPS, batch=BATCH,
        shuffle_plan=None):
    """Fit to max_steps; with checkpoint_dir, write step=N.ckpt after every batch and end-epoch=E.ckpt in
    on_train_epoch_end; shuffle_plan: start with that plan (as an older version would). Returns the recorded
    batches and the trainer."""
    callbacks = []
    if checkpoint_dir is not None:
        callbacks = [ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=1, save_top_k=-1, filename="{step}"),
                     ModelCheckpoint(dirpath=checkpoint_dir, every_n_epochs=1, save_on_train_epoch_end=True,
                                     save_top_k=-1, filename="end-{epoch}")]
    model = BatchRecorder()
    datamodule = PretrainingDataModule(str(path), max_seq_length=128, vocab_size=30522, micro_batch_size=batch,
                                       num_workers=num_workers)
    if shuffle_plan is not None:
        datamodule.shuffle_plan = shuffle_plan
    with quiet_lightning():
        trainer = pl.Trainer(max_steps=max_steps, callbacks=callbacks, enable_checkpointing=bool(callbacks),
                             reload_dataloaders_every_n_epochs=reload, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model.seen, trainer


@contextlib.contextmanager
def quiet_lightning():
    """Without Lightning's hints about workers, logging intervals and SLURM."""
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("num_workers,reload", [(0, 0), (0, 1), (2, 0)])
def test_a_resumed_fit_continues_with_the_batch_after_the_last_one_trained(static_set, tmp_path, num_workers, reload):
    straight, _ = fit(static_set, num_workers=num_workers, reload=reload, checkpoint_dir=tmp_path)
    fingerprints = [f for _, _, f in straight]
    assert len(straight) == STEPS and len(set(fingerprints)) == STEPS
    assert [e for e, _, _ in straight] == [0] * 6 + [1] * 6 + [2] * 2       # 6 batches per epoch, new ones each
    # mid-epoch; the last batch of an epoch; mid-epoch after an epoch boundary; Lightning's epoch-end hook
    cases = {"step=3": 3, "step=6": 6, "step=8": 8, "end-epoch=0": 6}
    if reload or num_workers:     # fewer cases: each fit with worker processes costs a second or more here
        cases = {"step=3": 3, "end-epoch=0": 6} if reload else {"step=8": 8}
    for name, done in cases.items():
        resumed, _ = fit(static_set, num_workers=num_workers, reload=reload, ckpt_path=tmp_path / f"{name}.ckpt")
        assert [f for _, _, f in resumed] == fingerprints[done:], name


def test_the_checkpoint_records_the_epoch_and_the_batches_consumed_in_it(static_set, tmp_path):
    fit(static_set, checkpoint_dir=tmp_path, max_steps=8)
    states = {name: torch.load(tmp_path / f"{name}.ckpt", weights_only=False)["PretrainingDataModule"]
              for name in ("step=3", "step=6", "step=8")}
    layout = {"batches_per_epoch": 6, "world_size": 1, "num_workers": 0, "micro_batch_size": BATCH, "seed": 0,
              "shuffle_plan": 2}
    assert states["step=3"] == {"epoch": 0, "batches_consumed": 3, **layout}
    assert states["step=6"] == {"epoch": 1, "batches_consumed": 0, **layout}
    assert states["step=8"] == {"epoch": 1, "batches_consumed": 2, **layout}


def test_a_checkpoint_of_the_unversioned_plan_resumes_with_it_and_an_unknown_plan_is_refused(regrouped_set, tmp_path):
    # 27 row groups of 64 rows, batch 64: 25 batches an epoch, one share of 25 whole row groups, in shuffle buffers
    # [8, 8, 8, 1] (plan 1, the code before plans had versions) or [7, 6, 6, 6] (plan 2).
    path, old_dir, new_dir = regrouped_set.path, tmp_path / "old", tmp_path / "new"
    old, _ = fit(path, batch=64, max_steps=25, checkpoint_dir=old_dir, shuffle_plan=1)
    new, _ = fit(path, batch=64, max_steps=25, checkpoint_dir=new_dir)
    old_stream, new_stream = [f for _, _, f in old], [f for _, _, f in new]
    assert old_stream[20:] != new_stream[20:]            # the plans order the epoch differently
    # What the older version wrote: the same data state without the plan's key.
    written = torch.load(old_dir / "step=20.ckpt", weights_only=False)
    assert written["PretrainingDataModule"].pop("shuffle_plan") == 1
    torch.save(written, tmp_path / "unversioned.ckpt")
    resumed, _ = fit(path, batch=64, max_steps=25, ckpt_path=tmp_path / "unversioned.ckpt")
    assert [f for _, _, f in resumed] == old_stream[20:]
    resumed, _ = fit(path, batch=64, max_steps=25, ckpt_path=new_dir / "step=20.ckpt")
    assert [f for _, _, f in resumed] == new_stream[20:]

    written["PretrainingDataModule"]["shuffle_plan"] = 7
    torch.save(written, tmp_path / "future.ckpt")
    with pytest.raises(ValueError, match="shuffle plan 7, which this version does not know"):
        fit(path, batch=64, max_steps=25, ckpt_path=tmp_path / "future.ckpt")


def test_a_set_that_does_not_fit_fails_in_setup_before_any_step(static_set):
    datamodule = PretrainingDataModule(str(static_set), max_seq_length=512, vocab_size=30522, micro_batch_size=8)
    with pytest.raises(ValueError, match="max_seq_length=128"):
        datamodule.setup("fit")
    model = BatchRecorder()
    with quiet_lightning(), pytest.raises(ValueError, match="max_seq_length=128"):
        pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   accelerator="cpu", devices=1).fit(model, datamodule=datamodule)
    assert model.seen == []


def test_without_a_trainer_it_loads_rank_0_of_1_and_follows_set_epoch(static_set):
    datamodule = PretrainingDataModule(str(static_set), max_seq_length=128, vocab_size=30522, micro_batch_size=BATCH,
                                       num_workers=0)
    loader = datamodule.train_dataloader()
    first = [batch["input_ids"] for batch in loader]
    assert len(first) == len(loader) == 6 and datamodule.state_dict() == {}
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(first, loader))
    datamodule.set_epoch(1)
    assert not torch.equal(first[0], next(iter(loader))["input_ids"])
