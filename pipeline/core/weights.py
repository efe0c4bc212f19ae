"""What `init=` names, resolved to an encoder's weights, its config, its tokenizer and (maybe) a task head.

Every downstream stage (fine-tuning, feature extraction) starts here, whatever the user has:

    a Hugging Face directory      config.json + model.safetensors or pytorch_model.bin: our hf_export/, a fine-tuned
                                  export of ours, or any BERT (a downloaded bert-base-uncased); its vocab.txt /
                                  tokenizer.json beside the weights
    a pre-training run directory  its checkpoints/last.ckpt (the newest weights, also of an unfinished run), else its
                                  hf_export/; the tokenizer from hf_export/ or from the shard set it trained on
    a Lightning .ckpt file        pre-training's or fine-tuning's; the tokenizer from the run it belongs to
    a DeepSpeed checkpoint        the directory Lightning's DeepSpeedStrategy writes (<run>/checkpoints/last.ckpt/),
                                  consolidated to fp32 with DeepSpeed's zero_to_fp32

The encoder is BertModel's state dict (the pooler may be absent: some exports have none). `head_state` holds every
other tensor under transformers' names (a fine-tuned classifier, or pre-training's heads); a task model takes the
ones that fit it.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from model import BertConfig

log = logging.getLogger(__name__)

HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


@dataclasses.dataclass
class Pretrained:
    source: str                               # what was loaded, for logs and metrics.json
    config: BertConfig
    encoder_state: dict[str, torch.Tensor]    # BertModel.state_dict() names
    head_state: dict[str, torch.Tensor]       # the other tensors, transformers' names ("classifier.weight", ...)
    tokenizer_source: Path | None             # a directory with vocab.txt (+ tokenizer.json) or a vocab.txt

    @property
    def has_pooler(self) -> bool:
        return "pooler.dense.weight" in self.encoder_state


def load_pretrained(init: str | Path, tokenizer: str | Path | None = None) -> Pretrained:
    """Resolve `init` (see the module docstring); `tokenizer` overrides where the vocabulary comes from."""
    path = Path(init).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"init={init} does not exist: give a pre-training run directory, a .ckpt, a DeepSpeed "
                                "checkpoint directory, or a Hugging Face BERT directory (config.json + weights)")
    if _is_hf_dir(path):
        pretrained = _from_hf_dir(path)
    elif _is_deepspeed_dir(path):
        pretrained = _from_deepspeed_dir(path)
    elif path.is_file():
        pretrained = _from_lightning_file(path)
    elif (path / LAST_CHECKPOINT).exists():
        pretrained = load_pretrained(path / LAST_CHECKPOINT)
    elif _is_hf_dir(path / "hf_export"):
        pretrained = _from_hf_dir(path / "hf_export")
    else:
        raise ValueError(f"init={init} is a directory but holds no weights this pipeline knows: expected config.json "
                         f"with one of {', '.join(HF_WEIGHT_FILES)}, a pre-training run ({LAST_CHECKPOINT} or "
                         "hf_export/), or a DeepSpeed checkpoint (checkpoint/ and latest)")
    if tokenizer is not None:
        tokenizer_path = Path(tokenizer).expanduser()
        if not tokenizer_path.exists():
            raise FileNotFoundError(f"tokenizer={tokenizer} does not exist (a vocab.txt or a directory holding one)")
        pretrained.tokenizer_source = tokenizer_path
    return pretrained


# ----------------------------------------------------------------------------------------------------------
# Hugging Face directories

def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any((path / f).is_file() for f in HF_WEIGHT_FILES)


def _from_hf_dir(path: Path) -> Pretrained:
    from model.hf_conversion import config_from_hf, encoder_state_from_hf, read_hf_checkpoint

    hf_config, hf_state = read_hf_checkpoint(path)
    if hf_config.get("model_type", "bert") != "bert":
        raise ValueError(f"{path} holds a {hf_config.get('model_type')!r} model; this pipeline fine-tunes BERT")
    config = config_from_hf({**hf_config, "tie_word_embeddings": True})  # a fine-tuned export has no MLM head to tie
    encoder, others = encoder_state_from_hf(hf_state, config.num_layers)
    return Pretrained(f"Hugging Face directory {path}", config, encoder, others,
                      path if (path / "vocab.txt").is_file() or (path / "tokenizer.json").is_file() else None)


# ----------------------------------------------------------------------------------------------------------
# our checkpoints

def _is_deepspeed_dir(path: Path) -> bool:
    return path.is_dir() and (path / "latest").is_file() and any(path.glob("*/mp_rank_*_model_states.pt"))


def _from_deepspeed_dir(path: Path) -> Pretrained:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    tag = (path / "latest").read_text().strip()
    # Lightning puts its own checkpoint dict (hyper_parameters included) into DeepSpeed's client state.
    client_state = torch.load(next((path / tag).glob("mp_rank_*_model_states.pt")), map_location="cpu",
                              weights_only=False)
    config = _model_config_of(client_state, path)
    state = get_fp32_state_dict_from_zero_checkpoint(str(path))
    return _split_module_state(f"DeepSpeed checkpoint {path}", config, state, _run_dir_of(path))


def _from_lightning_file(path: Path) -> Pretrained:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint of this pipeline (no state_dict); for other PyTorch "
                         "weights give the Hugging Face directory they belong to")
    return _split_module_state(f"Lightning checkpoint {path}", _model_config_of(checkpoint, path),
                               checkpoint["state_dict"], _run_dir_of(path))


def _model_config_of(checkpoint: dict, path: Path) -> BertConfig:
    fields = (checkpoint.get("hyper_parameters") or {}).get("model_config")
    if not fields:
        raise ValueError(f"{path} records no model_config in its hyper_parameters: not a checkpoint of this pipeline")
    return BertConfig.from_dict(dict(fields))


def _split_module_state(source: str, config: BertConfig, module_state: dict[str, torch.Tensor],
                        run_dir: Path | None) -> Pretrained:
    """A LightningModule's state dict ("model.bert.*", "model.<head>.*") -> encoder and head tensors."""
    state = {key.removeprefix("model."): value for key, value in module_state.items()}
    encoder = {key.removeprefix("bert."): value for key, value in state.items() if key.startswith("bert.")}
    if not encoder:
        raise ValueError(f"{source} holds no BERT encoder weights (no model.bert.* tensors)")
    heads = {key: value for key, value in state.items() if not key.startswith("bert.")}
    return Pretrained(source, config, encoder, heads, _tokenizer_of_run(run_dir))


def _run_dir_of(checkpoint_path: Path) -> Path | None:
    """The run a checkpoint belongs to: <run>/checkpoints/x.ckpt, or <run>/hpc_ckpt_N.ckpt (SLURM requeue)."""
    for candidate in (checkpoint_path.parent.parent, checkpoint_path.parent):
        if (candidate / ".hydra").is_dir() or (candidate / "hf_export").is_dir():
            return candidate
    return None


def _tokenizer_of_run(run_dir: Path | None) -> Path | None:
    """A run's tokenizer: its hf_export/ (a copy of the shard set's), else the shard set named in its config."""
    if run_dir is None:
        return None
    if (run_dir / "hf_export" / "vocab.txt").is_file():
        return run_dir / "hf_export"
    hydra_config = run_dir / ".hydra" / "config.yaml"
    if hydra_config.is_file():
        from omegaconf import OmegaConf

        recorded = OmegaConf.load(hydra_config)
        for key in ("data.path", "tokenizer_source"):   # pre-training's shard set; fine-tuning's own record
            value = OmegaConf.select(recorded, key, throw_on_resolution_failure=False)
            if value and (Path(str(value)) / "vocab.txt").is_file():
                return Path(str(value))
    log.warning("found no tokenizer for the run %s (no hf_export/vocab.txt, no shard set in .hydra/config.yaml)",
                run_dir)
    return None
