"""model.fp8=true (issue 35, item 6): FP8 matmuls in the encoder through torchao, refused where the card has no FP8.

On this CPU: the refusals (through train(), and check_fp8 against a faked CUDA device of each capability), which
layers the conversion takes, and that the converted model keeps its parameter names, its checkpoints and its Hugging
Face export (a real run included: this torch computes FP8 matmuls on the CPU too, slowly). The FP8 speed itself is for
the GPU benchmark."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn

from model import BertConfig, BertForPreTraining
from pipeline.core.app import compose
from pipeline.core.speed import fp8

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason='torchao is not installed (pip install "torchao==0.18.0")')
TINY = dict(vocab_size=96)   # the tiny preset (hidden 128, 2 layers) with a small vocabulary: fast
PROJECTIONS = [f"bert.layers.{i}.{name}" for i in range(2)
               for name in ("attention.qkv", "attention.output", "feed_forward.fc_in", "feed_forward.fc_out")]


def tiny_model(**fields) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig.from_preset("tiny", **{**TINY, **fields}))


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device of the given compute capability, as check_fp8 sees it."""
    def install(capability: tuple[int, int], name: str):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return install


# ---------------------------------------------------------------------------------------------- the refusals

def test_fp8_on_the_cpu_trainer_is_refused_before_anything_runs(tmp_path):
    from pipeline.pretraining.run import train

    cfg = compose("train", [f"data.path={tmp_path / 'no-shards'}", f"output_dir={tmp_path / 'run'}", "model.fp8=true"])
    with pytest.raises(ValueError, match=r"model.fp8=true with trainer.accelerator=cpu: FP8 training needs an NVIDIA "
                                         r"GPU of compute capability 8.9 or newer \(Ada, Hopper, Blackwell\).*"
                                         r"set model.fp8=false"):
        train(cfg)


@needs_torchao   # the pre-flight checks look for torchao before the run reaches the device
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_fp8_without_a_cuda_device_is_refused_at_the_runs_start(small_shards, tmp_path, tiny_overrides):
    from pipeline.pretraining.run import train

    cfg = compose("train", [*tiny_overrides(small_shards, tmp_path, 3), "trainer.accelerator=auto", "model.fp8=true"])
    with pytest.raises(ValueError, match=r"model.fp8=true: FP8 training needs an NVIDIA GPU of compute capability "
                                         r"8.9 or newer \(Ada, Hopper, Blackwell\); this process sees no CUDA device "
                                         r"\(torch .*\).*set model.fp8=false"):
        train(cfg)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("capability, name", [((8, 0), "NVIDIA A100-SXM4-80GB"), ((8, 6), "NVIDIA RTX A6000"),
                                              ((7, 0), "Tesla V100-SXM2-32GB")])
def test_a_gpu_without_fp8_is_refused_by_name_and_capability(fake_gpu, capability, name):
    fake_gpu(capability, name)
    with pytest.raises(ValueError, match=rf"8.9 or newer.*this process's GPU is {name}, compute capability "
                                         rf"{capability[0]}.{capability[1]}, without FP8 tensor cores. "
                                         r"Set model.fp8=false"):
        fp8.check_fp8()


@needs_torchao
@pytest.mark.parametrize("capability, name", [((8, 9), "NVIDIA L4"), ((9, 0), "NVIDIA H100 80GB HBM3"),
                                              ((10, 0), "NVIDIA B200")])
def test_a_gpu_with_fp8_is_accepted_and_converted(fake_gpu, capability, name):
    fake_gpu(capability, name)
    fp8.check_fp8()
    assert fp8.apply_fp8(tiny_model(), layers="all_projections") == PROJECTIONS


def test_without_torchao_the_error_names_the_install_command(fake_gpu, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torchao" else find_spec(name, *args))
    fake_gpu((9, 0), "NVIDIA H100 80GB HBM3")
    for check in (fp8.check_fp8, lambda: fp8.check_fp8_settings("gpu")):
        with pytest.raises(ImportError, match=r'torchao, which is not installed: pip install "torchao==0.18.0"'):
            check()


# ---------------------------------------------------------------------------------------------- the conversion

@needs_torchao
def test_the_encoder_projections_and_nothing_else_are_converted():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_model()
    names, parameters = list(model.state_dict()), dict(model.named_parameters())
    assert fp8.convert_encoder_to_fp8(model, layers="all_projections") == PROJECTIONS
    converted = sorted(name for name, module in model.named_modules() if isinstance(module, Float8Linear))
    assert converted == sorted(PROJECTIONS)
    # The embeddings, the pooler, the MLM transform, the decoder (still tied to the word embeddings) and the NSP head
    # stay plain.
    assert {name for name, module in model.named_modules() if type(module) is nn.Linear} == {
        "bert.pooler.dense", "mlm_head.dense", "mlm_head.decoder", "nsp_head"}
    assert model.mlm_head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    # Same names, same Parameter objects (the optimizer built after sees them), plain tensors in the state dict.
    assert list(model.state_dict()) == names
    assert all(parameters[name] is parameter for name, parameter in model.named_parameters())
    assert all(type(tensor) is torch.Tensor for tensor in model.state_dict().values())
    assert fp8.convert_encoder_to_fp8(model, layers="all_projections") == []   # converting again changes nothing


@needs_torchao
def test_layers_whose_sizes_are_not_multiples_of_16_stay_plain():
    model = tiny_model(intermediate_size=200)   # feed-forward 128 -> 200 -> 128: 200 is not a multiple of 16
    attention = [name for name in PROJECTIONS if "attention" in name]
    assert fp8.convert_encoder_to_fp8(model, layers="all_projections") == attention
    assert type(model.bert.layers[0].feed_forward.fc_in) is nn.Linear


@needs_torchao
@pytest.mark.parametrize("preset, converted", [("large", ["attention.qkv", "feed_forward.fc_in"]),
                                               ("base", ["attention.qkv", "feed_forward.fc_in"])])
def test_by_default_torchaos_filter_chooses_the_projections(preset, converted):
    """Issue 48 item 5: model.fp8=true takes torchao's own filter (its H100 thresholds for tensorwise scaling): at
    BERT-Large's widths the 1024 -> 3072 and 1024 -> 4096 projections convert, the 1024 -> 1024 attention output and
    the 4096 -> 1024 fc_out stay bf16 (and BERT-Base's 768-wide ones likewise)."""
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset(preset, num_layers=1, **TINY))
    assert fp8.convert_encoder_to_fp8(model) == [f"bert.layers.0.{name}" for name in converted]
    kinds = {name: type(module) for name, module in model.bert.layers[0].named_modules()
             if isinstance(module, nn.Linear)}
    assert kinds == {"attention.qkv": Float8Linear, "attention.output": nn.Linear,
                     "feed_forward.fc_in": Float8Linear, "feed_forward.fc_out": nn.Linear}


@needs_torchao
def test_a_model_whose_projections_torchao_would_all_skip_is_refused_by_name():
    with pytest.raises(ValueError, match="torchao's filter converts none .* model.fp8=all_projections"):
        fp8.convert_encoder_to_fp8(tiny_model())


def test_model_fp8_names_the_filter():
    assert fp8.fp8_layers(True) == "torchao" and fp8.fp8_layers("all_projections") == "all_projections"
    with pytest.raises(ValueError, match="true .*, all_projections, or false"):
        fp8.fp8_layers("everything")


@needs_torchao
def test_a_converted_model_saves_and_loads_as_a_plain_one(tmp_path):
    from pipeline.core.checkpoints.weights import load_pretraining_model, load_pretraining_weights

    model, plain = tiny_model(), tiny_model()
    fp8.convert_encoder_to_fp8(model, layers="all_projections")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)   # weights of its own, so that a load that did nothing shows
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    # Into a plain model and back, strict: the same keys and shapes.
    plain.load_state_dict(model.state_dict())
    back = tiny_model()
    fp8.convert_encoder_to_fp8(back, layers="all_projections")
    back.load_state_dict(plain.state_dict())
    assert all(torch.equal(back.state_dict()[name], tensor) for name, tensor in expected.items())
    # A Lightning checkpoint of the module (its keys: model.*), read by the pipeline's one loader.
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{name}": tensor for name, tensor in model.state_dict().items()},
                "hyper_parameters": {"model_config": model.config.to_dict()}}, checkpoint)
    loaded = load_pretraining_model(checkpoint)
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in expected.items())
    # Into a converted model (a run with model.fp8=true starting from init_from_checkpoint).
    target = tiny_model()
    fp8.convert_encoder_to_fp8(target, layers="all_projections")
    load_pretraining_weights(target, checkpoint)
    assert all(torch.equal(target.state_dict()[name], tensor) for name, tensor in expected.items())


@needs_torchao
def test_the_hf_export_of_a_converted_model_holds_its_weights(tmp_path):
    from pipeline.core.checkpoints.weights import load_pretraining_model
    from pipeline.pretraining.export import export_model

    model = tiny_model()
    fp8.convert_encoder_to_fp8(model, layers="all_projections")
    export = export_model(model, tmp_path, shard_dir=_vocab_dir(tmp_path / "vocab", model.config.vocab_size))
    reloaded = load_pretraining_model(export)
    assert all(torch.equal(reloaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


@needs_torchao
def test_a_run_with_fp8_layers_checkpoints_and_exports_their_weights(small_shards, tmp_path, tiny_overrides,
                                                                     monkeypatch):
    """The real train() on this CPU with the conversion but without the device checks: the optimizer trains the
    converted layers, and the final checkpoint and the Hugging Face export hold the module's weights."""
    import pytorch_lightning as pl
    from torchao.float8.float8_linear import Float8Linear

    from pipeline.core.checkpoints.weights import load_pretraining_model
    from pipeline.pretraining import checks, run

    monkeypatch.setattr(checks, "check_fp8_settings", lambda accelerator: None)
    monkeypatch.setattr(run, "apply_fp8", fp8.convert_encoder_to_fp8)   # model.fp8=all_projections: tiny's are small
    start = {}

    class Keep(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            start.update({name: tensor.clone() for name, tensor in pl_module.model.state_dict().items()})

        def on_train_end(self, trainer, pl_module):
            start["module"] = pl_module

    result = run.train(compose("train", [*tiny_overrides(small_shards, tmp_path, 3), "model.fp8=all_projections",
                                         "export.plot=false"]), extra_callbacks=[Keep()])
    model = start["module"].model
    assert isinstance(model.get_submodule(PROJECTIONS[0]), Float8Linear)
    assert not torch.equal(model.get_submodule(PROJECTIONS[0]).weight, start[f"{PROJECTIONS[0]}.weight"])
    for saved in (result["last_checkpoint"], result["hf_export"]):
        loaded = load_pretraining_model(saved).state_dict()
        assert all(torch.equal(loaded[name], tensor) for name, tensor in model.state_dict().items()), saved


@needs_torchao
def test_the_converted_encoder_runs_its_matmuls_in_fp8():
    """On this CPU too (torch has a CPU torch._scaled_mm): logits near the plain model's, not equal to them, and
    gradients for every converted weight."""
    model, plain = tiny_model().eval(), tiny_model().eval()
    fp8.convert_encoder_to_fp8(model, layers="all_projections")
    input_ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    logits, expected = model(input_ids).mlm_logits, plain(input_ids).mlm_logits
    assert not torch.equal(logits, expected)
    torch.testing.assert_close(logits, expected, atol=0.05, rtol=0.05)
    logits.sum().backward()
    assert all(model.get_submodule(name).weight.grad is not None for name in PROJECTIONS)


# ---------------------------------------------------------------------------------------------- the config

def test_fp8_is_off_by_default_and_no_field_of_the_model():
    from pipeline.pretraining.checks import model_config_of

    assert compose("train").model.fp8 is False
    assert model_config_of(compose("train", ["model.fp8=true"])) == model_config_of(compose("train"))


def test_fp8_shapes_a_training_stages_result():
    """FP8 changes the numerics: a workflow stage re-runs when model.fp8 changes (it is not in the list of keys that
    shape nothing)."""
    from pipeline.orchestration.identity import NOT_SHAPING

    assert not any(key in ("model", "model.fp8") for key in NOT_SHAPING["train"])


def _vocab_dir(path, size: int):
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                                              [f"w{i}" for i in range(size - 5)]) + "\n", encoding="utf-8")
    return path
