"""FP8 training of the encoder's matmuls (`model.fp8=true`): torchao's float8 training, on a card that has FP8.

Which library. torchao (`torchao.float8.convert_to_float8_training`), not NVIDIA Transformer Engine:
  - torchao swaps each chosen nn.Linear for its Float8Linear, a subclass of nn.Linear that takes over the same weight
    and bias Parameters: the model stays ours (model/bert/model.py is untouched), and so do the parameter names, the
    checkpoints, the optimizer's parameter groups and the Hugging Face export. Transformer Engine needs its own
    modules (te.Linear, or its fused LayerNormLinear / TransformerLayer) built in place of ours, with its FP8 autocast
    context around the forward, and its modules put FP8 scaling state into the state dict (`_extra_state`).
  - torchao's float8 training is written for torch.compile (its scaling and casts are fused by inductor; without
    compile they are separate kernels) and is what torchtitan uses; model.compile compiles the converted encoder.
  - torchao 0.18.0 installs here as one 3.4 MB wheel with no dependencies next to torch 2.13.0+cpu, so it is in the
    `train` extra and CI tests the conversion. Transformer Engine's PyTorch part is a source package that builds
    against torch and the CUDA toolkit, and its core wheel (transformer_engine_cu12) is 729 MB.

The recipe: tensorwise dynamic scaling (torchao's default, `Float8LinearRecipeName.TENSORWISE`): one scale per tensor,
computed from each tensor's current absolute maximum, e4m3 for inputs and weights and e5m2 for gradients, through
cuBLAS's tensorwise FP8 matmul, which torchao calls the fastest of its recipes. The rowwise recipes (CUTLASS
kernels, one scale per row) are more accurate and slower; `apply_fp8(..., recipe="rowwise")` lets a benchmark
compare them.

Which layers (model.fp8: true, or all_projections): only the encoder layers' projections (attention qkv and output,
feed-forward fc_in and fc_out), where nearly all of BERT's FLOPs are. Not the embeddings (lookups, not matmuls), not
the MLM decoder (tied to the word embeddings: its weight is the embedding matrix and FP8 would quantize every
vocabulary logit), not the pooler, the MLM transform or the NSP head (small, and near the loss). Among the projections:
  - `true`, the default filter since issue 48 item 5: torchao's own for the recipe (`_auto_filter_for_recipe`, its
    thresholds from its H100 benchmarks), which for tensorwise scaling keeps a Linear only where in and out features
    are multiples of 16 and not (in <= 4096 and out <= 1024): at hidden 1024 (BERT-Large) the qkv (1024 -> 3072) and
    fc_in (1024 -> 4096) projections convert, the attention output (1024 -> 1024) and fc_out (4096 -> 1024) do not,
    torchao having measured FP8 slower than bf16 at those shapes (the casts and scaling cost more than the matmul
    gains). BERT-Base likewise; the tiny presets convert nothing, which is refused (below). Taken unless a GPU
    measurement says otherwise: gpu_variants' fp8 rows can compare the two.
  - `all_projections` (what `true` meant before; no FP8 run had been recorded then): every projection whose in and
    out features are multiples of 16 (FP8 matmuls need that).

When: before torch.compile (so that compile traces Float8Linear) and before the optimizer is built (it holds the
same Parameters either way: the swap keeps them). train() calls `apply_fp8` where the model is built.

What conversion does, measured with torchao 0.18.0 and torch 2.13.0+cpu on the tiny preset: the eight projections
of its two layers become Float8Linear and no other module changes; named_parameters() gives the same names and the
same Parameter objects; the state dict has the same keys, every value a plain torch.Tensor, and a state dict from a
converted model loads (strict) into a plain BertForPreTraining and back. On the CPU conversion works, and so do the
forward and backward (this torch has a CPU torch._scaled_mm), but slower than fp32 (mini, 16 sequences of 128, 2
cores, eager: 0.64 s a forward and backward against 0.52 s), hence the refusal below. torch.compile of the converted
encoder ran on the CPU too.

Where it is checked: `check_fp8_settings` (no device needed: the accelerator and the library) in the pre-flight
checks, so a workflow stage is refused on the login node; `check_fp8` (the device this process has) at the run's
start, in `apply_fp8`.
"""
from __future__ import annotations

import importlib.util
import logging

import torch
import torch.nn as nn

log = logging.getLogger(__name__)

MIN_CAPABILITY = (8, 9)   # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x)
NEEDS = "FP8 training needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell)"
INSTALL = 'pip install "torchao==0.18.0"'   # the version pyproject.toml's train extra pins
GPU_ACCELERATORS = ("gpu", "cuda", "auto")
FILTERS = ("torchao", "all_projections")   # model.fp8: true is torchao's


def check_fp8_settings(accelerator: str) -> None:
    """What can be refused without a device: a run whose trainer is not on a GPU, an environment without torchao."""
    if str(accelerator) not in GPU_ACCELERATORS:
        raise ValueError(f"model.fp8=true with trainer.accelerator={accelerator}: {NEEDS}; run with trainer=gpu, "
                         "or set model.fp8=false")
    _require_torchao()


def check_fp8() -> None:
    """Refuses FP8 unless this process's CUDA device has FP8 tensor cores and torchao is installed."""
    if not torch.cuda.is_available():
        raise ValueError(f"model.fp8=true: {NEEDS}; this process sees no CUDA device ({_torch_build()}). Run on such "
                         "a GPU, or set model.fp8=false")
    capability = tuple(torch.cuda.get_device_capability())
    if capability < MIN_CAPABILITY:
        raise ValueError(f"model.fp8=true: {NEEDS}; this process's GPU is {torch.cuda.get_device_name()}, compute "
                         f"capability {capability[0]}.{capability[1]}, without FP8 tensor cores. Set model.fp8=false")
    _require_torchao()


def apply_fp8(model: nn.Module, recipe: str = "tensorwise", layers: str = "torchao") -> list[str]:
    """check_fp8, then the encoder's projections of a BertForPreTraining (or BertModel) to FP8 training, in place;
    returns the names of the layers converted. Before torch.compile and before the optimizer is built."""
    check_fp8()
    return convert_encoder_to_fp8(model, recipe, layers)


def convert_encoder_to_fp8(model: nn.Module, recipe: str = "tensorwise", layers: str = "torchao") -> list[str]:
    """The conversion of apply_fp8 without the device check (tests and benchmarks on any machine): the encoder
    layers' nn.Linear modules that `layers` (FILTERS) chooses become torchao's Float8Linear, keeping their
    Parameters and their names."""
    if layers not in FILTERS:
        raise ValueError(f"FP8 layers {layers!r}: one of {', '.join(FILTERS)}")
    _require_torchao()
    # Imported only here: it takes a second, and on a CPU-only torch it logs that its CUDA kernels did not load (float8
    # training does not use them: it calls torch._scaled_mm).
    import torchao.float8 as float8

    bert = getattr(model, "bert", model)   # BertForPreTraining holds the encoder as .bert; a BertModel is one
    prefix = "bert.layers." if bert is not model else "layers."
    chooses = fp8_filter(layers, recipe)
    chosen = [f"{prefix}{name}" for name, module in bert.layers.named_modules() if chooses(module, name)]
    # Plain layers and none of them chosen: an error. No plain layer at all: converted already, nothing to do.
    if not chosen and any(type(module) is nn.Linear for module in bert.layers.modules()):
        if layers == "torchao" and any(_is_fp8_eligible(module) for module in bert.layers.modules()):
            raise ValueError("model.fp8=true, but torchao's filter converts none of this model's encoder projections "
                             "(all too small for FP8 to gain, by torchao's H100 measurements): set "
                             "model.fp8=all_projections to convert them anyway, or model.fp8=false")
        raise ValueError("model.fp8=true, but no encoder projection has in and out features that are multiples of 16 "
                         "(FP8 matmuls need them): choose a hidden and intermediate size that are, or set "
                         "model.fp8=false")
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    float8.convert_to_float8_training(bert.layers, config=config, module_filter_fn=chooses)
    log.info("FP8 training (torchao, %s scaling, filter %s) of %d encoder projections", recipe, layers, len(chosen))
    return chosen


def fp8_layers(setting: bool | str) -> str:
    """model.fp8's value (true, or a name of FILTERS) -> the filter's name."""
    if setting is True:
        return "torchao"
    if setting in FILTERS:
        return setting
    raise ValueError(f"model.fp8={setting!r}: true (torchao's filter of the projections), all_projections, or false")


def fp8_filter(layers: str, recipe: str = "tensorwise"):
    """(module, name) -> whether it converts: a plain nn.Linear (not converted already) that the filter takes."""
    if layers == "all_projections":
        return lambda module, name: _is_fp8_eligible(module)
    import torchao.float8 as float8

    torchao_filter = float8._auto_filter_for_recipe(recipe, filter_fqns=[])
    return lambda module, name: _is_fp8_eligible(module) and torchao_filter(module, name)


def _is_fp8_eligible(module: nn.Module) -> bool:
    # type(...) is, not isinstance: Float8Linear is an nn.Linear too, and a layer converted already stays as it is.
    return type(module) is nn.Linear and module.in_features % 16 == 0 and module.out_features % 16 == 0


def _require_torchao() -> None:
    if importlib.util.find_spec("torchao") is None:   # found, not imported: the pre-flight checks stay fast
        raise ImportError(f"model.fp8=true trains through torchao, which is not installed: {INSTALL} (it is in the "
                          "train extra: pip install -e '.[train]'), or set model.fp8=false")


def _torch_build() -> str:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA; this machine runs on its CPU"
    return f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but no GPU is visible to it"
