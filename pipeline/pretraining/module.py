"""BertPretrainingModule: the pre-training model inside Lightning, with BERT's pre-training metrics:
model/bert/model.py's BertForPreTraining, or the ModernBERT-class masked LM (model/modernbert/) when the model config is
one of those (the same batches, outputs and metrics; MLM only, so no NSP metrics).

Metrics (logged every trainer.log_every_n_steps optimizer steps, over all the micro-batches and ranks since the
last log):
    train/loss, train/mlm_loss, train/nsp_loss   means over the micro-batches of the window
    train/mlm_acc, train/nsp_acc                 sum(correct) / sum(total) over the window, all ranks
    (no nsp metrics for the MLM-only objective: a model without the next-sentence head)
    train/lr                                     the rate of the step's first parameter group
    train/grad_norm                              total 2-norm of the gradients before clipping
Counts are summed on the device and reduced across ranks only when logged (one all-reduce of 8 numbers); the
values reach the host at log steps only (pipeline/core/speed/step_stats.py), and Lightning is handed host values: a
device value logged once is read back by Lightning at the end of every later batch.
With a held-out set (validation.path), at every validation, over all of its batches and ranks:
    val/mlm_loss, val/nsp_loss                   means per masked token / per sequence
    val/mlm_acc, val/nsp_acc, val/loss           accuracies; val/loss = val/mlm_loss + val/nsp_loss

Exact resume: Lightning restores weights, optimizer, scheduler, loop counters and the DataModule's position; the
module adds the torch (CPU and CUDA), numpy and Python RNG states of every rank, so dropout after a resume draws
the same masks on every rank as an uninterrupted run. Ranks draw different amounts of randomness (each pads its
batches to its own longest row), so each rank's states are gathered into the checkpoint, keyed by global rank,
and each rank restores its own. They are restored at the first training batch after the restore, not in
on_load_checkpoint: between the two, creating the DataLoader iterator draws a seed from torch's global RNG
(torch.utils.data's _BaseDataLoaderIter), which an uninterrupted run drew before the checkpoint. Dropout is seeded
per rank (seed + global rank, at the start of the fit), so two ranks never draw the same masks.
Resumed at another world size, no rank restores a state (the data layout differs too: the resume cannot be exact);
each goes on from its seed + rank, with a warning.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

from model.architectures import config_from_dict, pretraining_model
from pipeline.core.optim.optimizers import build_optimizer, build_scheduler, clips_under_mixed_precision
from pipeline.core.speed.clipping import clip_by_norm, clips_itself, zero_gradients
from pipeline.core.speed.step_stats import HostCopy, StatWindow, ends_log_step, sum_over_ranks
from pipeline.core.speed.strategies import offloads_optimizer
from pipeline.pretraining.compiled import mark_token_count_dynamic

RNG_KEY = "rng_states_by_rank"      # {global rank: that rank's RNG states}
LEGACY_RNG_KEY = "rng_states"       # checkpoints written before states were kept per rank: rank 0's states only
# Order of the per-window sums: [loss, mlm_loss, nsp_loss, micro_batches, mlm_correct, mlm_total, nsp_correct,
# nsp_total]
_LOSS_SLOTS = slice(0, 3)


class BertPretrainingModule(pl.LightningModule):
    def __init__(self, model_config: dict[str, Any], optimizer: dict[str, Any], scheduler: dict[str, Any],
                 max_steps: int, overfit_batches: int = 0, seed: int = 0, next_sentence_prediction: bool = True):
        """model_config: the encoder config's fields (BertConfig's, or ModernBertConfig's with "architecture");
        optimizer / scheduler: the `optimizer` and `scheduler` configs (pipeline/core/optim/optimizers.py); max_steps:
        optimizer steps of the run (where the default schedule reaches 0);
        overfit_batches: > 0 trains on the first that many micro-batches over and over (a debugging check that
        the losses can fall to ~0; Lightning's own overfit_batches needs a map-style dataset); seed: the run's
        seed, which dropout on rank r draws from as seed + r; next_sentence_prediction: False for the MLM-only
        objective (the shard set's manifest says which)."""
        super().__init__()
        self.save_hyperparameters()
        self.config = config_from_dict(model_config)
        self.model = pretraining_model(self.config, next_sentence_prediction=next_sentence_prediction)
        self._window = StatWindow()                 # per-log-window sums, see _LOSS_SLOTS
        self._window_copy: HostCopy | None = None   # a log step's window sums, on their way to the host
        self._grad_norm_copy: HostCopy | None = None
        self._step_lr = float("nan")
        self._val_sums: torch.Tensor | None = None  # [mlm loss sum, mlm total, mlm correct, nsp ...] of a validation
        self._pending_rng: dict[str, Any] | None = None
        self._grad_norm_from_engine = False
        self._overfit_cache: list[dict[str, torch.Tensor]] = []
        self._micro_batches_seen = 0
        # model.cuda_graphs (how the model runs, so not a hyper-parameter): set by the run, read at optimizer_zero_grad
        self.replays_cuda_graphs = False
        self.compiles_whole_model = False

    # -- training -------------------------------------------------------------------------------------------

    def forward(self, **batch: torch.Tensor):
        return self.model(**batch)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # data.unpad under model.compile: one graph for every N (compiled.py)
        mark_token_count_dynamic(batch, strict=self.compiles_whole_model)
        return batch

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.hparams.overfit_batches:
            batch = self._overfit_batch(batch)
        out = self.model(**batch)
        nsp_loss, nsp_correct, nsp_total = _nsp_counts(out)
        sums = torch.stack([out.loss.detach().float(), out.mlm_loss.detach().float(), nsp_loss,
                            torch.ones((), device=out.loss.device), out.mlm_correct.float(), out.mlm_total.float(),
                            nsp_correct, nsp_total])
        self._window.add(sums)
        if ends_log_step(self.trainer):
            # Queued now, read at the batch end (_log_window): the backward and the optimizer step queue behind it.
            self._window_copy = self._window.start_copy(sum_over_ranks)
            self._step_lr = self._current_lr()   # the rate this step is taken with (the scheduler steps before we log)
        return self._loss_for_backward(out.loss)

    def _overfit_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        index = self._micro_batches_seen % self.hparams.overfit_batches
        self._micro_batches_seen += 1
        if index == len(self._overfit_cache):
            self._overfit_cache.append(batch)
        return self._overfit_cache[index]

    def _loss_for_backward(self, loss: torch.Tensor) -> torch.Tensor:
        """Lightning divides the returned loss by accumulate_grad_batches; DeepSpeed's engine.backward divides it
        again (scale_wrt_gas), so under DeepSpeed with accumulation the gradients would be 1/accumulation of the
        mean (Lightning issue #6170; transformers fixed the same in PR #35808): gradient clipping and Adam's eps
        would act on the wrong scale. Undo Lightning's division where the strategy accumulates itself."""
        accumulation = self.trainer.accumulate_grad_batches
        if accumulation > 1 and self.trainer.strategy.handles_gradient_accumulation:
            return loss * accumulation
        return loss

    def _log_window(self) -> None:
        sums, self._window_copy = self._window_copy.wait(), None   # host values (already summed over the ranks)
        micro_batches = sums[3].clamp(min=1)
        loss, mlm_loss, nsp_loss = (sums[_LOSS_SLOTS] / micro_batches).unbind()
        metrics = {
            "train/loss": loss, "train/mlm_loss": mlm_loss, "train/nsp_loss": nsp_loss,
            "train/mlm_acc": sums[4] / sums[5].clamp(min=1), "train/nsp_acc": sums[6] / sums[7].clamp(min=1),
            "train/lr": torch.tensor(self._step_lr),
        }
        if not self.model.next_sentence_prediction:
            del metrics["train/nsp_loss"], metrics["train/nsp_acc"]
        # Already reduced over ranks: no sync_dist (it would average identical values at the cost of a collective).
        self.log_dict({k: v for k, v in metrics.items() if k != "train/loss"}, on_step=True, on_epoch=False)
        self.log("train/loss", metrics["train/loss"], on_step=True, on_epoch=False, prog_bar=True)

    def _current_lr(self) -> float:
        optimizers = self.trainer.optimizers
        return float(optimizers[0].param_groups[0]["lr"]) if optimizers else float("nan")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called after the (unscaled) gradients are complete and before they are clipped. With DeepSpeed it is
        # called on every micro-batch and the gradients are ZeRO partitions: the engine's norm is logged instead.
        # Where the module clips, the clipping's own norm is logged (configure_gradient_clipping).
        if not ends_log_step(self.trainer) or clips_itself(self.trainer):
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            self._grad_norm_from_engine = True
            return
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, dtype=torch.float32)))
        self._grad_norm_copy = HostCopy(norm)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:
        if not clips_itself(self.trainer):   # 16-mixed (a GradScaler to unscale first) or DeepSpeed: Lightning's way
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        norm = clip_by_norm(self.model.parameters(), float(gradient_clip_val))   # pipeline/core/speed/clipping.py
        if ends_log_step(self.trainer):
            self._grad_norm_copy = HostCopy(norm)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning writes the loggers after this hook, at the end of the log step's last micro-batch.
        if self._window_copy is not None:
            self._log_window()
        if self._grad_norm_copy is not None:
            norm, self._grad_norm_copy = self._grad_norm_copy.wait(), None
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)
        if self._grad_norm_from_engine:
            self._grad_norm_from_engine = False
            engine = getattr(self.trainer.strategy, "deepspeed_engine", None)
            norm = engine.get_global_grad_norm() if engine is not None else None
            if norm is not None:
                self.log("train/grad_norm", float(norm), on_step=True, on_epoch=False)

    # -- held-out validation ------------------------------------------------------------------------------------

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self.model(**batch)
        nsp_loss, nsp_correct, nsp_total = _nsp_counts(out)
        # Losses weighted by what they average over, so the result is per token / per sequence over the whole set.
        sums = torch.stack([out.mlm_loss.detach().float() * out.mlm_total, out.mlm_total.float(),
                            out.mlm_correct.float(), nsp_loss * nsp_total, nsp_total, nsp_correct])
        self._val_sums = sums if self._val_sums is None else self._val_sums + sums

    def on_validation_epoch_end(self) -> None:
        if self._val_sums is None:
            return
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        self._val_sums = None
        mlm_total, nsp_total = sums[1].clamp(min=1), sums[4].clamp(min=1)
        metrics = {"val/mlm_loss": sums[0] / mlm_total, "val/mlm_acc": sums[2] / mlm_total,
                   "val/nsp_loss": sums[3] / nsp_total, "val/nsp_acc": sums[5] / nsp_total}
        metrics["val/loss"] = metrics["val/mlm_loss"] + metrics["val/nsp_loss"]
        if not self.model.next_sentence_prediction:
            del metrics["val/nsp_loss"], metrics["val/nsp_acc"]
        self.log_dict(metrics, on_step=False, on_epoch=True)   # reduced above: no sync_dist

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        # Under DDP with gradient_as_bucket_view the gradients are views into DDP's all-reduce buckets. Set to None
        # (torch's default), the next step's first micro-batches, which accumulate without syncing (no_sync), get
        # freshly allocated gradients that the syncing one then copies into the buckets: a second copy of every
        # gradient (1.3 GB for BERT-Large). Zeroed in place, they stay the bucket views.
        # Under CUDA graph trees (model.cuda_graphs) with accumulation, a .grad set to None is filled at the next
        # backward by adopting the compiled backward's output, which lives in the graph's pool: the next micro-batch's
        # replay overwrites it, and torch raises "accessing gradient tensor output of CUDAGraphs". Kept allocated
        # outside the pool and zeroed in place, the backward adds into it instead (torch's own remedy, in that error).
        # Without accumulation the step reads the gradients before the next replay: torch's default is right there.
        model = getattr(self.trainer.strategy, "model", None)
        bucket_views = isinstance(model, torch.nn.parallel.DistributedDataParallel) and model.gradient_as_bucket_view
        outside_graph_pool = (self.replays_cuda_graphs and self.trainer.accumulate_grad_batches > 1
                              and not self.trainer.strategy.handles_gradient_accumulation)
        if bucket_views or outside_graph_pool:
            # one multi-tensor kernel, not one per parameter
            zero_gradients(self.model.parameters(), allocate=outside_graph_pool)
        else:
            optimizer.zero_grad(set_to_none=True)

    def configure_optimizers(self):
        # The same parameter groups and schedule under every strategy; under ZeRO-Offload the CPU's Adam kernel.
        optimizer = build_optimizer(self.model, self.hparams.optimizer,
                                    offload=offloads_optimizer(self.trainer.strategy),
                                    lightning_clips_amp=clips_under_mixed_precision(self.trainer))
        scheduler = build_scheduler(optimizer, self.hparams.scheduler, self.hparams.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    # -- exact resume -------------------------------------------------------------------------------------------

    def on_fit_start(self) -> None:
        seed_rng_states(int(self.hparams.seed) + self.global_rank)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning builds the checkpoint on every rank (and only rank 0 writes it): a collective is safe here.
        checkpoint[RNG_KEY] = gather_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._pending_rng = rng_states_of_rank(checkpoint, self.global_rank, self.trainer.world_size)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._pending_rng is not None:
            restore_rng_states(self._pending_rng)
            self._pending_rng = None


def _nsp_counts(out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, correct, total) of the next-sentence head as float tensors; zeros for the MLM-only objective."""
    if out.nsp_loss is None:
        zero = torch.zeros((), device=out.mlm_loss.device)
        return zero, zero, zero
    return out.nsp_loss.detach().float(), out.nsp_correct.float(), out.nsp_total.float()


def seed_rng_states(seed: int) -> None:
    """torch's (CPU and every CUDA device), numpy's and Python's global RNGs from one seed."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def gather_rng_states() -> dict[int, dict[str, Any]]:
    """{global rank: its capture_rng_states()} of every rank; a collective when there are several."""
    states = capture_rng_states()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {0: states}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, states)
    return dict(enumerate(gathered))


def rng_states_of_rank(checkpoint: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
    """The RNG states `rank` resumes from, or None (it keeps its fresh seed + rank)."""
    by_rank = checkpoint.get(RNG_KEY)
    if by_rank is not None:
        if len(by_rank) == world_size:
            return by_rank[rank]
        rank_zero_warn(f"the checkpoint holds the RNG states of {len(by_rank)} ranks and this run has {world_size}: "
                       "each rank's dropout goes on from its seed + rank instead (with the data layout changed "
                       "too, this resume is not exact)")
        return None
    legacy = checkpoint.get(LEGACY_RNG_KEY)
    if legacy is not None and world_size > 1:
        rank_zero_info("the checkpoint holds rank 0's RNG states only (written before they were kept per rank): "
                       "every rank resumes from them, so the resume is exact on rank 0 only")
    return legacy


def capture_rng_states() -> dict[str, Any]:
    """This process's RNG states; CUDA's is the current device's, the one this rank draws from."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    # Tensors and plain Python values only: Lightning loads checkpoints with torch.load(weights_only=True).
    numpy_state = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}
    states = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
