"""Which config keys shape a run's result, per entry point: the one list that the workflow's identity
(pipeline/orchestration/identity.py: a stage runs again when the rest of its config changes) and a resume's check
(pipeline/core/run/run_record.py: a resume refuses a change to the rest unless it is accepted) both read.

A key shapes the result when it changes what the run trains on or towards, the same on every machine: the model, the
objective, the data and which rows each optimizer step takes (for pre-training they follow the number of ranks, of
loader workers per rank and the pass size: each worker of each rank reads its own contiguous share of the epoch's
stream, batches_per_consumer x micro-batch rows, pipeline/pretraining/data/epoch_plan.py; for fine-tuning, the
devices: length-grouped batches are grouped per device, and the distributed sampler pads the epoch with repeated rows;
tests/core/test_shaping_keys.py reads the first steps' rows under each), the optimizer and its schedule, the
precision, the seed.

A key is operational when it changes only where the run writes, what it logs, how fast or with which kernels the same
steps are computed, or what is measured beside training:
- the accelerator, model.compile and CUDA graphs, data.unpad, data.packing (a micro-batch's own pairs packed into
  fewer rows: the same losses, pipeline/pretraining/data/pair_packing.py), model.attention_backend (ModernBERT),
  fused optimizer kernels, deterministic kernels, padding
  (data.pad_to_multiple_of; compile pads to the sequence length): the same rows, model, objective and schedule. The
  bits differ, as between two cards: other kernels round differently, and dropout draws its masks from the device's
  generator (CUDA's is not the CPU's) over the tensor it is given (a wider padded batch, a compiled kernel, the real
  tokens only under unpad). None of that is part of a recipe that another machine could reproduce exactly anyway.
- validation: the held-out set is read with a generator of its own and evaluated without dropout, so training is
  the same with it or without (tests/pretraining/test_validation.py).
- data.micro_batch_margin: with data.micro_batch_size=auto the pass follows the card and this margin, like the card
  itself no config key; a run keeps the size it picked at its start (micro_batch.json) at every resume.
The DDP and DeepSpeed settings (strategy.*) stay shaping: DeepSpeed's bf16 mode trains other arithmetic than
Lightning's mixed precision, and the list errs on the side of a re-run or a refused resume (which can be accepted).

Torch-free: the workflow's controller imports it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

_LOGGING = ("logger.mode", "logger.group", "logger.name", "logger.project", "logger.entity", "logger.tags",
            "logger.log_model", "trainer.enable_progress_bar", "trainer.enable_model_summary",
            "trainer.log_every_n_steps", "export.plot", "export.hf")
_KERNELS = ("trainer.accelerator", "trainer.deterministic", "optimizer.fused")

# Per entry point, the keys that shape no result (a key names itself and everything below it). Paths to what a run
# reads are not here: they count by their content (the workflow: identity.py; a resume: the shard set's manifest).
OPERATIONAL: dict[str, tuple[str, ...]] = {
    "data_prep": ("output_dir", "dask", "corpus_root"),      # where it runs and writes; the inputs count by content
    "train": ("output_dir", "ckpt_path", "resume", "require_init_from_checkpoint", "require_resume",
              "data.verify_checksums", "data.micro_batch_margin", "data.pad_to_multiple_of", "data.unpad",
              "data.packing", "data.max_pairs_per_row",
              "model.compile", "model.compile_scope", "model.compile_autotune", "model.pad_vocab_to_multiple_of",
              "model.attention_backend",   # ModernBERT's SDPA or FlexAttention: the same attention, other kernels
              "model.cuda_graphs", "trainer.benchmark", "trainer.num_sanity_val_steps", "validation",
              "callbacks.checkpoint", "callbacks.throughput", *_KERNELS, *_LOGGING),
    "finetune": ("output_dir", "data.cache_dir", "data.num_workers", "data.eval_batch_size", "data.pad_to_multiple_of",
                 *_KERNELS, *_LOGGING),
}
# Settings added after runs were recorded, at the value that means "as before": there, the whole setting is left out
# of what is compared (a stage's identity, a resume's record), so runs made before it existed keep their identity and
# resume without a change named. Any other value shapes the run like any key.
LATER_DEFAULTS: dict[str, dict[str, Any]] = {
    "train": {"data.batch_warmup": {"tokens": 0, "start_batch_size": None, "batch_size_increment": None},
              # ModernBERT's RoPE thetas, named in model/modernbert_*.yaml since the context extension (issue 47)
              "model.global_rope_theta": 160000.0, "model.local_rope_theta": 10000.0},
}
# What only a run's first start reads: a resume takes its weights from the checkpoint.
FIRST_START_ONLY: dict[str, tuple[str, ...]] = {"train": ("init_from_checkpoint",)}


def without_later_defaults(entry: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """config less each LATER_DEFAULTS setting of `entry` that is at its default."""
    at_default = []
    for key, default in LATER_DEFAULTS.get(entry, {}).items():
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if (dict(node) == default) if isinstance(node, Mapping) else (node is not None and node == default):
            at_default.append(key)
    return without_keys(config, tuple(at_default))


def leaves(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping."""
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def without_keys(config: Mapping[str, Any], dotted_keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        nested = tuple(k.split(".", 1)[1] for k in dotted_keys if k.startswith(f"{key}."))
        if key not in dotted_keys:
            out[key] = without_keys(value, nested) if isinstance(value, Mapping) and nested else value
    return out


def names(key: str, dotted_keys: tuple[str, ...] | list[str]) -> bool:
    """Whether `key` is one of dotted_keys or below one of them."""
    return any(key == k or key.startswith(f"{k}.") for k in dotted_keys)
