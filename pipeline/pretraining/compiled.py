"""model.compile=true: torch.compile of the encoder's repeated layer (model.compile_scope=layers, the default), or of
the whole pre-training model, encoder, heads and losses, as one graph (compile_scope=whole).

- Scope, layers (regional compilation): each layer of the encoder's stack compiled in place (Module.compile), one
  code object for all of them, so Dynamo traces and inductor compiles one layer once and every layer runs it (its
  weights are the graph's inputs, not constants): BERT-Large's 24 layers cost one layer's compile, seconds, where the
  whole model's fullgraph compile takes minutes, the first GPU minutes' budget (issue 48). ModernBERT's two kinds of
  layer (local and global attention) are two graphs. Outside the layers (embeddings, heads, losses) runs eager: the
  fusion lost there is the losses' element-wise work, a few kernels a step.
- Scope, whole: BertForPreTraining.compile(), in place (its parameters, hence the checkpoint names, stay the module's
  own), so the MLM gather, the heads, the cross-entropy and its hand-written backward (model/bert/model.py) are in the
  graph with the encoder; fullgraph=True makes a graph break an error rather than a silent split into eager pieces.
  Which scope is faster on a GPU is benchmarks/gpu_variants.py's to measure; regional is the default until it does.
- Shapes: one graph per sequence length (dynamic=False). The collator pads every batch to max_seq_length and always
  gives the attention mask when pad_to_multiple_of >= max_seq_length (pipeline/pretraining/data/collator.py), which
  `fixed_width_padding` sets for a compiled run; the masked positions are max_predictions_per_seq wide already. A
  batch of another shape would compile a second graph (and, past torch's recompile limit, fullgraph=True raises
  FailOnRecompileLimitHit): the tests count the graphs. The one dimension that varies is data.unpad's token count N,
  marked dynamic (mark_token_count_dynamic): one graph for every N.
- CUDA graphs: model.cuda_graphs=true compiles with mode="reduce-overhead" (inductor's CUDA graph trees), which the
  static shapes above allow: the step's hundreds of kernel launches replayed as one (refused without compile, in
  pipeline/pretraining/checks.py). Off by default: it keeps the graph's inputs and outputs in a static memory pool
  (more memory), and on the CPU it does nothing. With accumulation the gradients stay allocated outside that pool,
  zeroed in place (module.py's optimizer_zero_grad): one the backward adopted would be overwritten by the next replay.
- Fusion (benchmarks/fusion_report.py reads the code inductor generates; measured on the CPU, 2026-11-27): the
  forward's dropout + residual add + LayerNorm (+ the cast back to bf16 of model/bert/model.py's residual_stream) become
  one kernel per block, GELU one with the bf16 cast after it, the backward's LayerNorm-backward + dropout-backward +
  GELU-backward likewise, and each loss (log-softmax, the label gather, argmax, the masked sum) one kernel; the
  biases go into the matmuls (addmm), and the matmuls (mm, addmm, bmm) and, on a GPU, SDPA stay library kernels.
  What is left by hand is nothing the issue names; a GELU inside the matmul's epilogue would need inductor's
  max-autotune matmul templates (a GPU measurement, not made).
- Numerics: inductor fuses the element-wise work and reorders float sums; the eager path keeps its exact parity
  with transformers, the compiled one is within rel 1e-5 of it on the CPU in fp32 with eager's random numbers
  (tests/pretraining/test_attention_paths.py, test_compiled_model.py).
- DDP: with several GPUs, Dynamo's DDP optimizer splits the graph at DDP's bucket boundaries so that the
  all-reduce of one bucket overlaps the backward of the next (by design). On one device there is no DDP at all
  (pipeline/core/speed/strategies.py: strategy=ddp on one process builds the single-device strategy), so no split.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("pipeline.pretraining")


def compile_mode(model_cfg: Any) -> str:
    """torch.compile's mode: CUDA graphs (model.cuda_graphs) or not, and model.compile_autotune: inductor's
    max-autotune, which times its Triton matmul templates against the library's GEMM for each matmul shape and, where
    a template wins, fuses what follows the matmul into its epilogue (the bias and GELU of the MLP's first matmul:
    issue 48's bias+GELU epilogue). Longer compiles (each shape's candidates are timed); the same numerics as default
    to rounding (tests/pretraining/test_compile_autotune.py)."""
    autotune = bool(model_cfg.get("compile_autotune"))
    if model_cfg.get("cuda_graphs"):
        return "max-autotune" if autotune else "reduce-overhead"
    return "max-autotune-no-cudagraphs" if autotune else "default"


def fixed_width_padding(data_cfg: Any, model_cfg: Any) -> int:
    """The collator's pad_to_multiple_of: the data config's, or max_seq_length for a compiled model (one shape)."""
    multiple = int(data_cfg.get("pad_to_multiple_of", 8))
    if model_cfg.get("compile") and multiple < int(data_cfg.max_seq_length):
        log.info("model.compile=true: every batch padded to data.max_seq_length=%d (one compiled graph; the padding "
                 "is masked out)", int(data_cfg.max_seq_length))
        return int(data_cfg.max_seq_length)
    return multiple


def mark_token_count_dynamic(batch: dict[str, Any], strict: bool = True) -> None:
    """data.unpad: the number N of tokens an unpadded batch computes on (token_index's length) marked as a dynamic
    dimension, on the tensor the compiled model is called with (after its transfer to the device, which makes new
    tensors). Each distinct N would otherwise be a shape, a full recompile of the whole model (minutes at BERT-Large),
    and past torch's recompile limit of 8, fullgraph=True raises FailOnRecompileLimitHit. Bucketing N into at most 8
    sizes would still cost 8 compiles and give back part of the padding unpadding removes; one graph symbolic in N
    costs one compile. Only N is dynamic: the batch's (B, T) stay static. Eager runs ignore the mark.
    strict=False (compile_scope=layers): the layers see token_index inside the batch's unpadding object, where a
    batch whose N equals B x T lets Dynamo tie N to the rows (one more graph then, not an error)."""
    token_index = batch.get("token_index") if isinstance(batch, dict) else None
    if token_index is not None:
        (torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic)(token_index, 0)


COMPILE_SCOPES = ("layers", "whole")


def repeated_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The encoder's stack: the longest ModuleList of the model (BERT's and ModernBERT's `layers`)."""
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not stacks:
        raise ValueError(f"model.compile_scope=layers: {type(model).__name__} has no stack of layers to compile")
    return max(stacks, key=len)


def apply_compile_settings(model: torch.nn.Module, model_cfg: Any, unpad: bool = False) -> None:
    """model.compile: compile `model`'s layers, or the whole of it, in place, as described above; else nothing.
    (model.cuda_graphs without compile is refused before, by the pre-flight checks.) Under data.unpad the whole
    model's graph has the token count N marked dynamic at its input (mark_token_count_dynamic): one graph. A layer's
    input is the (N, hidden) rows its caller made, which no mark reaches: dynamic=None, so that the first N compiles
    static and the second makes N symbolic (Dynamo's automatic dynamic shapes), two graphs for every N."""
    if not model_cfg.get("compile"):
        return
    scope = str(model_cfg.get("compile_scope", "layers"))
    if scope == "whole":
        model.compile(fullgraph=True, dynamic=False, mode=compile_mode(model_cfg))
        return
    for layer in repeated_layers(model):
        layer.compile(fullgraph=True, dynamic=None if unpad else False, mode=compile_mode(model_cfg))
