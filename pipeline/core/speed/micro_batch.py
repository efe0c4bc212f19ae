"""The pass sized to the card: `data.micro_batch_size=auto`, the largest micro-batch (sequences per forward/backward
pass on each process) that fits the device, chosen at the run's start, the same on every rank, written to the log
and to the run's record, and kept by a resume. Only the pass changes: the global batch (data.global_batch_size) is
the recipe's and stays micro x accumulation x processes exactly (devices.batch_split).

How `auto` resolves, in order:
- a resume with a record (<output_dir>/micro_batch.json): the recorded size. The data order depends on it: each
  loader worker of each rank reads an equal share of batches_per_consumer x micro rows of the epoch's stream
  (data/epoch_plan.py, batches_per_consumer = total_rows // (consumers x micro)), so the share boundaries, the rows
  dropped at an epoch's end and the rows of each optimizer step move with the pass size, and a checkpoint's data
  position is a count of micro-batches. A resume that probed again (another card, another margin, a driver that
  takes more memory) could pick another size and would not continue the stream it left.
- a run without CUDA: the CPU rule (CPU_MICRO_BATCH_SIZE), without probing the host's memory.
- otherwise the probe, at setup (MicroBatchSetup): one real forward and backward of the real model per candidate,
  from the whole per-process batch (at most MAX_SEQUENCES_PER_PASS) down through its divisors, until one peaks below
  (1 - margin) of the card; the device's peak statistics are then restarted for the run's own.
A number wins over all of these; a resume with a number other than the recorded one, once the change is accepted
(resume.accept_changes: pipeline/core/run/run_record.py), logs it and runs with it (the data module warns that a
mid-epoch position then means other rows).

Where the probe runs, and how the ranks agree: in a callback's setup(), on every rank, each on its own device, then
the smallest size over the ranks (an all-reduce MIN). setup() is the first point where the run's device (the
strategy's root device), its process group and its model all exist: before the Trainer there is no group to agree
in, and under Lightning's own launcher (one node, no SLURM or torchrun) ranks 1..n do not even exist yet, since the
launcher starts them inside fit(). Every rank probes, not only rank 0: a card with less memory (a mixed allocation,
another process on it) must bound the pass of all. Nothing has read the pass size by then: the loaders are built
after setup, DeepSpeed reads its config and Trainer.accumulate_grad_batches when the strategy sets up, the loop at
each batch; so setup() sets those, provisionally the whole per-process batch in one pass (PretrainChecks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.devices import batch_split
from pipeline.core.speed.strategies import resolve_accelerator

if TYPE_CHECKING:
    from pipeline.core.speed.micro_batch_setup import MicroBatchSetup

AUTO = "auto"
DEFAULT_MARGIN = 0.1             # of the card's memory, kept free: CUDA context, NCCL buffers, allocator fragmentation
# Without CUDA, `auto` takes at most 8 sequences a pass and does not probe the host's memory, whose limit a process
# cannot see reliably (containers, other jobs) and whose overflow kills it without a message. A CPU gains little from
# a larger pass (at 8 x 128 tokens its matmuls already have 1,024 rows), while activations grow with it (by the usual
# estimate, 34sbh + 5as^2b bytes a layer at 16 bits, BERT-Large at seq 512 holds about 2 GB a sequence in fp32): a
# CPU try of a GPU recipe should run, not fill the machine. Give a number to choose otherwise.
CPU_MICRO_BATCH_SIZE = 8
# AdamW and LAMB keep two fp32 moments a parameter, allocated at the first optimizer step, after the probe: counted
# on top of its peak (an upper bound under ZeRO, which partitions them, or offloads them to the host).
OPTIMIZER_STATE_BYTES_PER_PARAMETER = 8
# SDPA's memory-efficient kernel takes at most 65,535 sequences a call (a CUDA grid dimension), and past it raises an
# error that is not an out-of-memory one: no pass is tried larger, whatever the per-process batch (65,536 for a
# recipe's global batch on one GPU).
MAX_SEQUENCES_PER_PASS = 65_535
RECORD_NAME = "micro_batch.json"
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
GIB = 2**30
log = logging.getLogger("pipeline.pretraining")


class NoPassFits(RuntimeError):
    """Not even one sequence a pass fits the device."""


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def margin_of(data_cfg: Mapping[str, Any]) -> float:
    margin = float(data_cfg.get("micro_batch_margin", DEFAULT_MARGIN))
    if not 0 <= margin < 1:
        raise ValueError(f"data.micro_batch_margin={margin}: the share of the card's memory to keep free must be in "
                         "[0, 1)")
    return margin


def most_per_pass(data_cfg: Mapping[str, Any], global_batch_size: int, world: int) -> int:
    """The most sequences a pass may take, without a device (preflight): a number as given; `auto`, the whole
    per-process batch, the largest it can resolve to (the run's start sizes it)."""
    value = data_cfg.get("micro_batch_size")
    margin_of(data_cfg)
    if is_auto(value):
        return max(1, global_batch_size // world)   # batch_split refuses a global batch that does not divide
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"data.micro_batch_size={value!r}: give the most sequences a pass may take, or auto "
                         "(the largest that fits the device)") from None


def candidates(per_process: int) -> list[int]:
    """The pass sizes that split a process's batch exactly, at most MAX_SEQUENCES_PER_PASS, largest first."""
    return [size for size in range(min(per_process, MAX_SEQUENCES_PER_PASS), 0, -1) if per_process % size == 0]


@dataclasses.dataclass(frozen=True)
class Fit:
    size: int
    peak_bytes: int       # the pass's peak, with the optimizer's state
    budget_bytes: float   # (1 - margin) of the device's memory
    total_bytes: int


def largest_that_fits(per_process: int, peak_bytes: Callable[[int], int | None], total_bytes: int,
                      margin: float) -> Fit:
    """The first candidate, largest first, whose peak_bytes(size) (None: it ran out of memory) is at most
    (1 - margin) of total_bytes. Another error at a size passes it over, with a warning, as a kernel's limit on that
    size would (one past the limit CUDA puts on a launch, for example); the smallest size's error is raised: an error
    that no size escapes is no limit of the pass's size."""
    budget, peak, sizes = (1 - margin) * total_bytes, None, candidates(per_process)
    for size in sizes:
        try:
            peak = peak_bytes(size)
        except Exception as error:
            if size == sizes[-1]:
                raise
            # Only the text is kept: the error's frames hold the failed pass's tensors, freed before the next try.
            log.warning("data.micro_batch_size=auto: %d sequences a pass failed (%s: %s); trying fewer", size,
                        type(error).__name__, error)
            peak = None
            continue
        if peak is not None and peak <= budget:
            return Fit(size, int(peak), budget, total_bytes)
    outcome = "ran out of memory" if peak is None else f"peaked at {peak / GIB:.2f} GiB"
    raise NoPassFits(f"data.micro_batch_size=auto: no pass fits this device. The smallest, {size} sequence(s), "
                     f"{outcome}, and {budget / GIB:.2f} GiB are allowed ({1 - margin:.0%} of {total_bytes / GIB:.2f} "
                     f"GiB; data.micro_batch_margin={margin}). Use a smaller model or sequence length, a ZeRO "
                     "strategy, or a smaller margin")


# -- the probe -----------------------------------------------------------------------------------------------------

class PassProbe:
    """probe(size): the peak device memory of one forward and backward of the real model on `size` sequences at the
    run's sequence length, plus the optimizer's state to come; None when it ran out of memory.

    The batch is the widest the run can see: every position a token and attended, with the attention mask given
    (real batches of many rows always have padding, so a mask, which keeps scaled_dot_product_attention off its
    flash kernel), and the shard set's masked positions. The pass changes nothing the run will see: the global RNG
    states are restored (the batch draws from a generator of its own), the gradients are dropped, and a compiled
    encoder runs eagerly, which holds at least as much as compiled code, whose fusions save fewer intermediates."""

    def __init__(self, model: torch.nn.Module, *, max_seq_length: int, max_predictions: int, precision: str,
                 device: torch.device):
        self.model, self.device = model, device
        self.max_seq_length, self.max_predictions = max_seq_length, max_predictions
        self.autocast_dtype = _AUTOCAST.get(str(precision))   # a *-true precision runs in fp32 here: an upper bound
        self.optimizer_state_bytes = OPTIMIZER_STATE_BYTES_PER_PARAMETER * sum(
            p.numel() for p in model.parameters() if p.requires_grad)

    def __call__(self, size: int) -> int | None:
        release_memory(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            self.run_pass(size)
            out_of_memory = False
        except RuntimeError as error:    # torch.cuda.OutOfMemoryError, or cuBLAS/cuDNN failing to allocate
            from pytorch_lightning.utilities.memory import is_oom_error

            if not is_oom_error(error):
                raise
            out_of_memory = True
        release_memory(self.device)    # after the handler: the error's frames no longer hold the pass's tensors
        return None if out_of_memory else torch.cuda.max_memory_allocated(self.device) + self.optimizer_state_bytes

    def run_pass(self, size: int) -> None:
        was_training = self.model.training
        self.model.train()              # dropout on: its masks are saved for the backward, as in training
        forked = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=forked), torch.compiler.set_stance("force_eager"):
                with (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype
                      else contextlib.nullcontext()):
                    out = self.model(**self.batch(size))
                out.loss.backward()
        finally:
            self.model.zero_grad(set_to_none=True)
            self.model.train(was_training)

    def batch(self, size: int) -> dict[str, torch.Tensor]:
        vocab, seq, predictions = self.model.config.vocab_size, self.max_seq_length, self.max_predictions
        generator = torch.Generator().manual_seed(size)
        batch = {
            "input_ids": torch.randint(vocab, (size, seq), generator=generator),
            "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(size, seq),   # sentence A, then B
            "attention_mask": torch.ones(size, seq, dtype=torch.long),
            "masked_positions": torch.randint(1, seq, (size, predictions), generator=generator),
            "masked_lm_labels": torch.randint(vocab, (size, predictions), generator=generator),
        }
        if getattr(self.model, "next_sentence_prediction", False):
            batch["next_sentence_labels"] = torch.randint(2, (size,), generator=generator)
        return {key: value.to(self.device) for key, value in batch.items()}


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def forget_peak_memory(device: torch.device) -> None:
    """The device's peak memory statistics restarted: what the run reports afterwards (max_memory_allocated) is its
    own peak, not the probe's largest pass."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_memory_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def agree_on_size(size: int, device: torch.device) -> int:
    """The smallest size over the ranks (0 where a rank found none), or `size` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return size
    value = torch.tensor([size], dtype=torch.int64, device=device)   # on the device: NCCL reduces CUDA tensors only
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


# -- the plan, before the Trainer --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """The pass of a run as known before the Trainer exists; with source "probe", a provisional one (the whole
    per-process batch in one pass) that MicroBatchSetup replaces at setup."""
    size: int                  # sequences per pass on each process
    accumulation: int          # passes per optimizer step on each process
    global_batch_size: int
    world_size: int
    source: str                # "config" (a number), "record" (a resume's), "cpu" (the CPU rule) or "probe"
    margin: float
    precision: str
    max_seq_length: int
    output_dir: Path
    record: dict[str, Any] | None = None     # the run's record, on a resume that has one

    @property
    def per_process(self) -> int:
        return self.global_batch_size // self.world_size

    @property
    def recorded(self) -> int | None:
        return int(self.record["micro_batch_size"]) if self.record else None

    def callback(self) -> MicroBatchSetup:
        from pipeline.core.speed.micro_batch_setup import MicroBatchSetup  # Lightning's: see that module

        return MicroBatchSetup(self)


def sizes_on_cuda(trainer_cfg: Mapping[str, Any]) -> bool:
    """Whether the run's passes run on CUDA devices, whose memory `auto` probes."""
    return resolve_accelerator(str(trainer_cfg.get("accelerator", "auto"))) == "cuda"


def plan_micro_batch(data_cfg: Mapping[str, Any], trainer_cfg: Mapping[str, Any], world: int, output_dir: Path,
                     resume_from: str | None) -> MicroBatchPlan:
    """The pass as far as it can be known without a device: a number, a resume's record, the CPU rule; else
    provisional, for the probe. Reads the record of the run resumed from; writes nothing."""
    global_batch = int(data_cfg["global_batch_size"])
    record = resumed_record(resume_from, output_dir) if resume_from else None
    value = data_cfg.get("micro_batch_size")
    if not is_auto(value):
        most, source = int(value), "config"
    elif record is not None:
        most, source = int(record["micro_batch_size"]), "record"
    elif not sizes_on_cuda(trainer_cfg):
        most, source = CPU_MICRO_BATCH_SIZE, "cpu"
    else:
        most, source = max(1, global_batch // world), "probe"
    size, accumulation = batch_split(global_batch, most, world)
    return MicroBatchPlan(size, accumulation, global_batch, world, source, margin_of(data_cfg),
                          str(trainer_cfg.get("precision", "32-true")), int(data_cfg["max_seq_length"]),
                          Path(output_dir), record)


def resumed_record(checkpoint: str, output_dir: Path) -> dict[str, Any] | None:
    """The record of the run a checkpoint belongs to (<run>/checkpoints/<checkpoint>: <run>/micro_batch.json, also
    when resuming into another output_dir), else output_dir's."""
    return read_record(Path(checkpoint).resolve().parent.parent) or read_record(output_dir)


def read_record(output_dir: Path) -> dict[str, Any] | None:
    path = Path(output_dir) / RECORD_NAME
    try:
        record = json.loads(path.read_text())
        int(record["micro_batch_size"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a micro-batch record ({error}): remove it, and a resume with "
                         "data.micro_batch_size=auto sizes the pass again, or give a number") from None
    return record


def write_record(output_dir: Path, record: Mapping[str, Any]) -> None:
    write_atomically(Path(output_dir) / RECORD_NAME, json.dumps(record, indent=2) + "\n")
