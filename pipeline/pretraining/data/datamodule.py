"""The LightningDataModule for pre-training: a validated shard set, one stream per rank, exact resume.

- setup() opens the shard set, so a set that does not fit the model (sequence length, vocabulary, format)
  fails before training starts.
- train_dataloader() gives this rank its share (rank and world size from the attached trainer; rank 0 of 1
  without one). Each time Lightning starts iterating it (every epoch), the loader asks for the epoch and the
  batches of it already consumed (see loader.py and _epoch_and_skip), so reload_dataloaders_every_n_epochs
  is NOT needed (with it, Lightning merely rebuilds an identical loader every epoch).
- state_dict() goes into every Lightning checkpoint: the epoch and how many batches of it this rank has
  consumed, with the layout. A fit resumed from that checkpoint continues with exactly the batch after the
  last one trained. Resume with the same world size, num_workers and micro_batch_size (a warning otherwise).
- unpad=True: padded batches carry the indices of their real tokens, on which the model's layers then compute
  (collator.py, model/shared/unpadding.py); validation batches too.
- document_layout=True: batches carry document_ids and position_ids, where each packed document of a row is and
  each token's position in it (collator.py); validation batches too. masked_lm_prob: dynamic masking at this rate
  instead of the manifest's (dynamic sets only; at most max_predictions_per_seq of a full row); validation too, so
  that its loss measures the task trained.
- max_pairs_per_row=K: BERT's sentence pairs packed, up to K a row, each attending within itself: a batch's pairs in
  fewer rows with the losses of the batch unpacked (collator.py, pair_packing.py); validation batches too.
- val_dataloader() (with val_path): a held-out shard set, the same batches at every validation, each rank its own
  share. Its loader has a generator of its own, so validating draws nothing from the RNG that dropout and the
  training loader use: a run with validation trains, and resumes, exactly as one without.
- batch_warmup (a BatchWarmup, data.batch_warmup): the rows of each step are a pure function of the step
  (batch_warmup.py) and the stream is step_stream.py's, endless; the position is the count of micro-batches this
  rank has consumed since the run's start (Lightning's), and a resume continues exactly, with any num_workers.
  Without it nothing changes.
- The layout includes the shuffle plan (epoch_plan.py): a resumed run keeps its checkpoint's plan for the rest of
  the run, so it goes on exactly as it would have; a checkpoint without one was written before plans had
  versions and resumes with plan 1; one of a plan this version does not know is refused, saying so.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

try:
    # pytorch-lightning 2.x installs the `pytorch_lightning` namespace, which the rest of this project uses; a
    # DataModule of one namespace cannot be used by a Trainer of the other.
    import pytorch_lightning as pl
except ImportError:  # only the unified `lightning` package is installed
    import lightning.pytorch as pl

from pipeline.pretraining.data import epoch_plan
from pipeline.pretraining.data.batch_warmup import BatchWarmup
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.loader import PretrainingDataLoader, pin_memory_default
from pipeline.pretraining.data.shard_set import ShardSet
from pipeline.pretraining.data.step_stream import StepStreamDataset

log = logging.getLogger(__name__)

# Lightning warns that an IterableDataset's __len__ "could be inaccurate" with several workers unless each is
# configured to read different data. PretrainingDataset's workers are (epoch_plan.py), and its len() is exact.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


class PretrainingDataModule(pl.LightningDataModule):
    def __init__(self, path: str, max_seq_length: int, vocab_size: int, micro_batch_size: int, num_workers: int = 1,
                 seed: int = 0, pad_to_multiple_of: int = 8, val_path: str | None = None, unpad: bool = False,
                 document_layout: bool = False, masked_lm_prob: float | None = None,
                 batch_warmup: BatchWarmup | None = None, max_pairs_per_row: int | None = None):
        super().__init__()
        self.batch_warmup = batch_warmup
        self.path = str(path)
        self.val_path = str(val_path) if val_path else None
        self.max_seq_length = max_seq_length
        self.vocab_size = vocab_size
        self.micro_batch_size = micro_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.pad_to_multiple_of = pad_to_multiple_of
        self.unpad = unpad
        self.document_layout = document_layout
        self.masked_lm_prob = masked_lm_prob
        self.max_pairs_per_row = max_pairs_per_row
        self.shard_set: ShardSet | None = None
        self.val_shard_set: ShardSet | None = None
        self.shuffle_plan = epoch_plan.SHUFFLE_PLAN    # a resumed run's: its checkpoint's (load_state_dict)
        self.epoch = 0                      # without a trainer: the epoch set_epoch() gave
        self._batches_per_epoch: int | None = None
        self._loaded_state: dict[str, Any] | None = None

    # -- Lightning hooks ---------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.shard_set is None:
            self.shard_set = ShardSet.open(self.path, max_seq_length=self.max_seq_length, vocab_size=self.vocab_size)
        if self.val_path is not None and self.val_shard_set is None:
            self.val_shard_set = ShardSet.open(self.val_path, max_seq_length=self.max_seq_length,
                                               vocab_size=self.vocab_size)
        for shard_set in (self.shard_set, self.val_shard_set):   # a rate a set cannot take: refused now, not later
            if shard_set is not None:
                shard_set.masking_config_at(self.masked_lm_prob)

    def train_dataloader(self) -> PretrainingDataLoader:
        self.setup()
        rank, world_size = self._rank_and_world_size()
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        if self.batch_warmup is not None:
            dataset = StepStreamDataset(self.shard_set, self.batch_warmup, self.accumulation, rank=rank,
                                        world_size=world_size, num_workers=self.num_workers, seed=self.seed,
                                        pad_to_multiple_of=self.pad_to_multiple_of, unpad=self.unpad,
                                        document_layout=self.document_layout, masked_lm_prob=self.masked_lm_prob,
                                        max_pairs_per_row=self.max_pairs_per_row)
            return PretrainingDataLoader(dataset, self._epoch_and_skip, pin_memory=pin_memory_default(device))
        dataset = PretrainingDataset(self.shard_set, self.micro_batch_size, rank=rank, world_size=world_size,
                                     num_workers=self.num_workers, seed=self.seed,
                                     pad_to_multiple_of=self.pad_to_multiple_of, shuffle_plan=self.shuffle_plan,
                                     unpad=self.unpad, document_layout=self.document_layout,
                                     masked_lm_prob=self.masked_lm_prob, max_pairs_per_row=self.max_pairs_per_row)
        self._batches_per_epoch = len(dataset)
        return PretrainingDataLoader(dataset, self._epoch_and_skip, pin_memory=pin_memory_default(device))

    def val_dataloader(self) -> PretrainingDataLoader | list:
        """The held-out set in one fixed order (epoch 0 of its plan), loaded in this process; [] without val_path."""
        self.setup()
        if self.val_shard_set is None:
            return []
        rank, world_size = self._rank_and_world_size()
        dataset = PretrainingDataset(self.val_shard_set, self.micro_batch_size, rank=rank, world_size=world_size,
                                     num_workers=0, seed=self.seed, pad_to_multiple_of=self.pad_to_multiple_of,
                                     unpad=self.unpad, document_layout=self.document_layout,
                                     masked_lm_prob=self.masked_lm_prob, max_pairs_per_row=self.max_pairs_per_row)
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        return PretrainingDataLoader(dataset, lambda: (0, 0), pin_memory=pin_memory_default(device),
                                     generator=torch.Generator().manual_seed(self.seed))

    def state_dict(self) -> dict[str, Any]:
        """{epoch, batches of it this rank has consumed}, and the layout that position holds for."""
        position = self._batches_processed()
        if position is not None and self.batch_warmup is not None:
            return {"micro_batches_consumed": position, "batch_warmup": self.batch_warmup.describe(),
                    "accumulation": self.accumulation, **self._layout()}
        if position is None or self._batches_per_epoch is None:
            return {}
        epoch, consumed = divmod(position, self._batches_per_epoch)
        return {"epoch": epoch, "batches_consumed": consumed, "batches_per_epoch": self._batches_per_epoch,
                **self._layout()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Checks the layout: the position itself comes back with Lightning's restored batch count."""
        if not state_dict:
            return
        if _warmup_of(state_dict) != (self.batch_warmup.describe() if self.batch_warmup else None):
            raise ValueError(
                f"the checkpoint's data position was counted {_plan_named(_warmup_of(state_dict))}, and this run "
                f"reads {_plan_named(self.batch_warmup and self.batch_warmup.describe())}: the same count of batches "
                "would be other rows. Resume with the checkpoint's data.batch_warmup settings")
        if self.batch_warmup is not None:
            self._check_warmup_layout(state_dict)
            self._loaded_state = dict(state_dict)
            return
        self.shuffle_plan = _shuffle_plan_of(state_dict)
        state_dict = {**state_dict, "shuffle_plan": self.shuffle_plan}
        changed = {key: (state_dict.get(key), value) for key, value in self._layout().items()
                   if state_dict.get(key) != value}
        if changed and state_dict["batches_consumed"]:
            warnings.warn(
                f"resuming mid-epoch with a different data layout ("
                f"{', '.join(f'{k}: {a} -> {b}' for k, (a, b) in changed.items())}): the position is kept as a count "
                "of batches, so some rows of this epoch will be seen twice and others not at all", stacklevel=2)
        self._loaded_state = dict(state_dict)

    def _check_warmup_layout(self, state_dict: dict[str, Any]) -> None:
        """The position counts this rank's micro-batches: other rows if the passes per step or the ranks changed."""
        now = {"world_size": self._rank_and_world_size()[1], "accumulation": self.accumulation, "seed": self.seed}
        changed = {key: (state_dict.get(key), value) for key, value in now.items() if state_dict.get(key) != value}
        if changed:
            warnings.warn(
                f"resuming under batch warm-up with a different data layout ("
                f"{', '.join(f'{k}: {a} -> {b}' for k, (a, b) in changed.items())}): the position is kept as a count "
                "of this rank's micro-batches, so the steps from here take other rows", stacklevel=2)

    @property
    def accumulation(self) -> int:
        """Micro-batches per step on each rank (the full global batch = pass x accumulation x ranks)."""
        return self.batch_warmup.full_batch_size // (self._rank_and_world_size()[1] * self.micro_batch_size)

    # -- without Lightning ----------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch for the next iteration when no trainer is attached."""
        self.epoch = epoch

    # -------------------------------------------------------------------------------------------------------

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def _layout(self) -> dict[str, Any]:
        return {"world_size": self._rank_and_world_size()[1], "num_workers": self.num_workers,
                "micro_batch_size": self.micro_batch_size, "seed": self.seed, "shuffle_plan": self.shuffle_plan}

    def _batches_processed(self) -> int | None:
        """Training batches this rank has processed in the whole fit, restored from the checkpoint on resume."""
        if self.trainer is None:
            return None
        return int(self.trainer.fit_loop.epoch_loop.batch_progress.total.processed)

    def _epoch_and_skip(self) -> tuple[int, int]:
        """For the loader at each iter(): the data epoch to play and how many of its batches are consumed.

        Both come from Lightning's count of processed batches P: epoch P // len, batch P % len. In an ordinary
        run that is (current_epoch, 0) at every epoch start. On resume it is the exact position, also where
        Lightning's epoch counter is not: resumed from a checkpoint of an epoch's last batch or of
        on_train_epoch_end, Lightning 2.6 re-enters the finished epoch (or skips to the one after next) before
        carrying on; the data stream stays the uninterrupted one, only Lightning's epoch boundaries move.
        """
        position = self._batches_processed()
        if position is None:
            return self.epoch, 0
        if self.batch_warmup is not None:   # one endless stream: the position is all there is
            state, self._loaded_state = self._loaded_state, None
            if state is not None and state.get("micro_batches_consumed", position) != position:
                warnings.warn(f"the checkpoint's data position ({state['micro_batches_consumed']} micro-batches) "
                              f"differs from Lightning's restored batch count ({position}); following Lightning's",
                              stacklevel=2)
            return 0, position
        if self._loaded_state is not None:
            state, self._loaded_state = self._loaded_state, None
            if state.get("batches_per_epoch") == self._batches_per_epoch:
                expected = state["epoch"] * state["batches_per_epoch"] + state["batches_consumed"]
                if expected != position:
                    warnings.warn(f"the checkpoint's data position ({expected} batches) differs from Lightning's "
                                  f"restored batch count ({position}); following Lightning's", stacklevel=2)
        return divmod(position, self._batches_per_epoch)


def _warmup_of(state: dict[str, Any]) -> dict[str, int] | None:
    return state.get("batch_warmup")


def _plan_named(warmup: dict[str, int] | None) -> str:
    return f"under batch warm-up {warmup}" if warmup else "without batch warm-up"


def _shuffle_plan_of(state: dict[str, Any]) -> int:
    """The shuffle plan a checkpoint's position was counted in (epoch_plan.SHUFFLE_PLANS)."""
    plan = state.get("shuffle_plan", epoch_plan.LEGACY_SHUFFLE_PLAN)
    if plan not in epoch_plan.SHUFFLE_PLANS:
        raise ValueError(f"the checkpoint's data position was counted in shuffle plan {plan!r}, which this version "
                         f"does not know (it knows {epoch_plan.SHUFFLE_PLANS}): resume it with the version of the "
                         "pipeline that wrote it")
    if plan != epoch_plan.SHUFFLE_PLAN:
        log.info("resuming with the checkpoint's shuffle plan %d (new runs use %d): the run goes on as it began",
                 plan, epoch_plan.SHUFFLE_PLAN)
    return plan
