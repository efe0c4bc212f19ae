"""The one weight loader: whatever checkpoint a user names, resolved to an encoder's weights, its config, its tokenizer
and its other tensors; and those weights put into a pre-training model (phase 2 from phase 1, the export) or a task
model (fine-tuning, feature extraction). Both encoder families load through it: BERT (model/bert/model.py) and the
ModernBERT-class encoder (model/modernbert/); `Pretrained.config` is then a BertConfig or a ModernBertConfig.

    load_pretrained(path)                   -> Pretrained (encoder, heads, config, tokenizer), from any format below
    load_pretraining_weights(model, path)   BertForPreTraining / ModernBertForMaskedLM: encoder and heads, every
                                            tensor, strictly; a checkpoint of the other family is refused
    load_pretraining_model(path)            the same, into a model built from the checkpoint's own config and
                                            objective (no next-sentence head after MLM-only pre-training)
    load_into_task_model(model, pretrained) a task model: the encoder always, the head only when one fits
    encoder_of(model)                       the encoder inside any of those models (BERT's .bert, ModernBERT's
                                            .encoder): the one place that knows where each family keeps it

The formats:

    a Hugging Face directory      config.json + model.safetensors or pytorch_model.bin: our hf_export/, a fine-tuned
                                  export of ours, any BERT (a downloaded bert-base-uncased) or any ModernBERT
                                  (model_type "modernbert": a masked LM, an encoder or a task model); its vocab.txt /
                                  tokenizer.json beside the weights
    a pre-training run directory  its checkpoints/last.ckpt (the newest weights, also of an unfinished run), else its
                                  hf_export/; the tokenizer from hf_export/ or from the shard set it trained on
    a Lightning .ckpt file        pre-training's or fine-tuning's; the tokenizer from the run it belongs to
    a DeepSpeed checkpoint        the directory Lightning's DeepSpeedStrategy writes (<run>/checkpoints/last.ckpt/),
                                  consolidated to fp32 with DeepSpeed's zero_to_fp32

The encoder is BertModel's state dict (the pooler may be absent: some exports have none), or ModernBertModel's.
`head_state` holds every other tensor: under transformers' names from a Hugging Face directory
("cls.predictions.bias", "classifier.weight"), under the module's own from our checkpoints ("mlm_head.dense.weight",
"classifier.weight"). ModernBERT's heads have transformers' names in both ("head.dense.weight", "decoder.bias").
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from model.architectures import EncoderConfig, PretrainingModel, config_from_dict, is_modernbert, pretraining_model
from model.shared.hf_checkpoints import HF_WEIGHT_FILES
from pipeline.core.checkpoints.checkpoint_files import CHECKPOINT_DIR

log = logging.getLogger(__name__)

LAST_CHECKPOINT = Path(CHECKPOINT_DIR) / "last.ckpt"
HF_EXPORT_DIR = "hf_export"                # a run's Hugging Face export, under its output directory


@dataclasses.dataclass
class Pretrained:
    source: str                               # what was loaded, for logs and metrics.json
    config: EncoderConfig                     # BertConfig or ModernBertConfig
    encoder_state: dict[str, torch.Tensor]    # BertModel / ModernBertModel .state_dict() names
    head_state: dict[str, torch.Tensor]       # the other tensors, transformers' names ("classifier.weight", ...)
    tokenizer_source: Path | None             # a directory with vocab.txt (+ tokenizer.json) or a vocab.txt

    @property
    def has_pooler(self) -> bool:
        return "pooler.dense.weight" in self.encoder_state

    @property
    def has_next_sentence_head(self) -> bool:
        """Pre-trained with next-sentence prediction (ours: nsp_head.*; transformers': cls.seq_relationship.*)."""
        return any(name.startswith(("nsp_head.", "cls.seq_relationship.")) for name in self.head_state)


def encoder_attribute(config: EncoderConfig) -> str:
    """Where the models of a family keep their encoder: BERT's (transformers' too) as .bert, ours of ModernBERT as
    .encoder."""
    return "encoder" if is_modernbert(config) else "bert"


def encoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The encoder (BertModel, ModernBertModel) inside a pre-training, task or feature model."""
    return getattr(model, encoder_attribute(model.config))


def load_pretrained(init: str | Path, tokenizer: str | Path | None = None, find_tokenizer: bool = True) -> Pretrained:
    """Resolve `init` (see the module docstring); `tokenizer` overrides where the vocabulary comes from;
    find_tokenizer=False skips looking for one (pre-training needs the weights only)."""
    path = Path(init).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"init={init} does not exist: give a pre-training run directory, a .ckpt, a DeepSpeed "
                                "checkpoint directory, or a Hugging Face BERT or ModernBERT directory (config.json + "
                                "weights)")
    if _is_hf_dir(path):
        pretrained = _from_hf_dir(path)
    elif _is_deepspeed_dir(path):
        pretrained = _from_deepspeed_dir(path, find_tokenizer)
    elif path.is_file():
        pretrained = _from_lightning_file(path, find_tokenizer)
    elif (path / LAST_CHECKPOINT).exists():
        pretrained = load_pretrained(path / LAST_CHECKPOINT, find_tokenizer=find_tokenizer)
    elif _is_hf_dir(path / HF_EXPORT_DIR):
        pretrained = _from_hf_dir(path / HF_EXPORT_DIR)
    else:
        raise ValueError(f"init={init} is a directory but holds no weights this pipeline knows: expected config.json "
                         f"with one of {', '.join(HF_WEIGHT_FILES)}, a pre-training run ({LAST_CHECKPOINT} or "
                         "hf_export/), or a DeepSpeed checkpoint (checkpoint/ and latest)")
    if tokenizer is not None:
        tokenizer_path = Path(tokenizer).expanduser()
        if not tokenizer_path.exists():
            raise FileNotFoundError(f"tokenizer={tokenizer} does not exist (a vocab.txt, a tokenizer.json, or a "
                                    "directory holding one)")
        pretrained.tokenizer_source = tokenizer_path
    return pretrained


# ----------------------------------------------------------------------------------------------------------
# Hugging Face directories

def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any((path / f).is_file() for f in HF_WEIGHT_FILES)


def _from_hf_dir(path: Path) -> Pretrained:
    from model.shared.hf_checkpoints import read_hf_checkpoint

    hf_config, hf_state = read_hf_checkpoint(path)
    model_type = hf_config.get("model_type", "bert")
    if model_type == "modernbert":
        config, encoder, others = _modernbert_from_hf(path, hf_config, hf_state)
    elif model_type == "bert":
        from model.bert.hf_conversion import config_from_hf, encoder_state_from_hf

        config = config_from_hf({**hf_config, "tie_word_embeddings": True})  # a fine-tuned export has no MLM head
        encoder, others = encoder_state_from_hf(hf_state, config.num_layers)
    else:
        raise ValueError(f"{path} holds a {model_type!r} model; this pipeline fine-tunes BERT and ModernBERT")
    return Pretrained(f"Hugging Face directory {path}", config, encoder, others,
                      path if _has_tokenizer(path) else None)


def _modernbert_from_hf(path: Path, hf_config: dict, hf_state: dict[str, torch.Tensor]):
    """(config, encoder, others) of a transformers ModernBERT directory; others under transformers' names, which are
    ours for ModernBERT's heads (head.*, decoder.*, classifier.*)."""
    from model.modernbert.hf_conversion import config_from_hf, encoder_state_from_hf

    config = config_from_hf(hf_config)
    mask_id = _mask_token_id(path)
    if "mask_token_id" not in hf_config and mask_id is not None:   # transformers' config.json does not record it
        config = dataclasses.replace(config, mask_token_id=mask_id)
    encoder, others = encoder_state_from_hf(hf_state, config.num_layers)
    return config, encoder, others


def _mask_token_id(directory: Path) -> int | None:
    if not (directory / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return next((i for i in map(tokenizer.token_to_id, ("[MASK]", "<mask>")) if i is not None), None)


def _has_tokenizer(directory: Path) -> bool:
    return (directory / "vocab.txt").is_file() or (directory / "tokenizer.json").is_file()


# ----------------------------------------------------------------------------------------------------------
# our checkpoints

def _is_deepspeed_dir(path: Path) -> bool:
    """A DeepSpeed checkpoint directory: its `latest` tag names a directory of model-state files, one
    `mp_rank_00_model_states.pt` under ZeRO-1/2, one `zero_pp_rank_{r}_mp_rank_00_model_states.pt` per rank under
    ZeRO-3 (DeepSpeed's own glob, zero_to_fp32.get_model_state_files, finds both)."""
    return _deepspeed_model_states(path) is not None


def _deepspeed_model_states(path: Path) -> list[str] | None:
    latest = path / "latest"
    if not path.is_dir() or not latest.is_file():
        return None
    tag_dir = path / latest.read_text().strip()
    if not tag_dir.is_dir():
        return None
    from deepspeed.utils.zero_to_fp32 import get_model_state_files  # imported only for a DeepSpeed directory

    try:
        return get_model_state_files(str(tag_dir))
    except FileNotFoundError:
        return None


def _from_deepspeed_dir(path: Path, find_tokenizer: bool) -> Pretrained:
    """The fp32 master weights (the optimizer's partitions, consolidated by DeepSpeed's zero_to_fp32), not the
    module's copies, which are bf16 under DeepSpeed's bf16 mode."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # Rank 0's model states (sorted first by get_model_state_files under either layout) hold Lightning's checkpoint
    # dict (hyper_parameters included) in DeepSpeed's client state.
    client_state = torch.load(_deepspeed_model_states(path)[0], map_location="cpu", weights_only=False)
    config = _model_config_of(client_state, path)
    state = get_fp32_state_dict_from_zero_checkpoint(str(path))
    return _split_module_state(f"DeepSpeed checkpoint {path}", config, state, _run_dir_of(path), find_tokenizer)


def _from_lightning_file(path: Path, find_tokenizer: bool) -> Pretrained:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint of this pipeline (no state_dict); for other PyTorch "
                         "weights give the Hugging Face directory they belong to")
    return _split_module_state(f"Lightning checkpoint {path}", _model_config_of(checkpoint, path),
                               checkpoint["state_dict"], _run_dir_of(path), find_tokenizer)


def _model_config_of(checkpoint: dict, path: Path) -> EncoderConfig:
    fields = (checkpoint.get("hyper_parameters") or {}).get("model_config")
    if not fields:
        raise ValueError(f"{path} records no model_config in its hyper_parameters: not a checkpoint of this pipeline")
    return config_from_dict(dict(fields))   # "architecture": "modernbert" says ModernBERT; none, BERT


def _split_module_state(source: str, config: EncoderConfig, module_state: dict[str, torch.Tensor],
                        run_dir: Path | None, find_tokenizer: bool) -> Pretrained:
    """A LightningModule's state dict ("model.bert.*" or ModernBERT's "model.encoder.*", "model.<head>.*") ->
    encoder and head tensors."""
    state = {key.removeprefix("model."): value for key, value in module_state.items()}
    prefix = f"{encoder_attribute(config)}."
    encoder = {key.removeprefix(prefix): value for key, value in state.items() if key.startswith(prefix)}
    if not encoder:
        family = "ModernBERT" if is_modernbert(config) else "BERT"
        raise ValueError(f"{source} holds no {family} encoder weights (no model.{prefix}* tensors)")
    heads = {key: value for key, value in state.items() if not key.startswith(prefix)}
    return Pretrained(source, config, encoder, heads, _tokenizer_of_run(run_dir) if find_tokenizer else None)


def _run_dir_of(checkpoint_path: Path) -> Path | None:
    """The run a checkpoint belongs to: <run>/checkpoints/x.ckpt, or <run>/hpc_ckpt_N.ckpt (SLURM requeue)."""
    for candidate in (checkpoint_path.parent.parent, checkpoint_path.parent):
        if (candidate / ".hydra").is_dir() or (candidate / HF_EXPORT_DIR).is_dir():
            return candidate
    return None


def _tokenizer_of_run(run_dir: Path | None) -> Path | None:
    """A run's tokenizer: its hf_export/ (a copy of the shard set's), else the shard set named in its config."""
    if run_dir is None:
        return None
    if _has_tokenizer(run_dir / HF_EXPORT_DIR):
        return run_dir / HF_EXPORT_DIR
    hydra_config = run_dir / ".hydra" / "config.yaml"
    if hydra_config.is_file():
        from omegaconf import OmegaConf

        recorded = OmegaConf.load(hydra_config)
        for key in ("data.path", "tokenizer_source"):   # pre-training's shard set; fine-tuning's own record
            value = OmegaConf.select(recorded, key, throw_on_resolution_failure=False)
            if value and _has_tokenizer(Path(str(value))):
                return Path(str(value))
    log.warning("found no tokenizer for the run %s (no hf_export/ vocab.txt or tokenizer.json, no shard set in "
                ".hydra/config.yaml)", run_dir)
    return None


# ----------------------------------------------------------------------------------------------------------
# into a pre-training model

# The decoder weight each family ties to its word embedding: filled by loading the embedding, never stored apart.
_TIED_DECODER = {"bert": "mlm_head.decoder.weight", "encoder": "decoder.weight"}
_MODERNBERT_EMBEDDING = "embeddings.tok_embeddings.weight"


def load_pretraining_weights(model: PretrainingModel, path: str | Path,
                             pretrained: Pretrained | None = None) -> None:
    """Every tensor of `model` (BertForPreTraining: encoder, pooler, MLM and NSP heads; ModernBertForMaskedLM: encoder,
    prediction head, decoder bias) from the checkpoint at `path`, in any format load_pretrained reads; refuses a
    checkpoint of the other family, one of another architecture (pipeline/core/checkpoints/architecture_match.py: equal
    but for what a context extension changes, ModernBERT's RoPE thetas and longest sequence), or one that lacks any of
    them or holds others (a fine-tuned model, the other pre-training objective)."""
    from model.bert.hf_conversion import pretraining_heads_from_hf
    from pipeline.core.checkpoints.architecture_match import check_same_architecture

    pretrained = pretrained or load_pretrained(path, find_tokenizer=False)
    check_same_family(model.config, pretrained.config, path)
    check_same_architecture(model.config, pretrained.config, path)
    if pretrained.has_next_sentence_head != model.next_sentence_prediction:
        objective = {True: "mlm_nsp (with next-sentence prediction)", False: "mlm (MLM only)"}
        raise ValueError(f"{path} was pre-trained with objective {objective[pretrained.has_next_sentence_head]}, and "
                         f"this model's shard set has objective {objective[model.next_sentence_prediction]}: train on "
                         "a shard set of the checkpoint's objective, or start from another checkpoint")
    attribute = encoder_attribute(model.config)
    heads = dict(pretrained.head_state)
    if any(name.startswith("cls.") for name in heads):   # a Hugging Face directory: transformers' head names
        heads = pretraining_heads_from_hf(heads)
    tied = _TIED_DECODER[attribute]
    if is_modernbert(model.config) and tied in heads:   # stored beside the embedding (a Lightning state dict's alias)
        if not torch.equal(heads.pop(tied), pretrained.encoder_state[_MODERNBERT_EMBEDDING]):
            raise ValueError(f"{path} holds a decoder that differs from its token embedding; this model ties them")
    state = {**{f"{attribute}.{name}": tensor for name, tensor in pretrained.encoder_state.items()}, **heads}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:   # a tensor of another shape: another model size
        raise ValueError(f"{path} does not hold this model's weights (model {model.config}): {error}") from None
    missing = [name for name in missing if name != tied]   # tied: the word embedding
    if missing or unexpected:
        raise ValueError(f"{path} does not hold this model's weights: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]} (model {model.config})")


def check_same_family(config: EncoderConfig, checkpoint_config: EncoderConfig, path: str | Path) -> None:
    """A BERT checkpoint cannot start a ModernBERT run, nor the reverse: their tensors have nothing in common."""
    if is_modernbert(config) == is_modernbert(checkpoint_config):
        return
    if is_modernbert(config):
        raise ValueError(f"{path} holds a BERT model ({_brief(checkpoint_config)}); this run trains ModernBERT "
                         f"(model=modernbert_*): start from a ModernBERT checkpoint or choose a BERT model")
    raise ValueError(f"{path} holds a ModernBERT model ({_brief(checkpoint_config)}); this run trains BERT "
                     f"(model=tiny..large): start from a BERT checkpoint or choose a ModernBERT model "
                     f"(model=modernbert_*)")


def _brief(config: EncoderConfig) -> str:
    return (f"{type(config).__name__} num_layers={config.num_layers} hidden_size={config.hidden_size} "
            f"vocab_size={config.vocab_size}")


def load_pretraining_model(path: str | Path) -> PretrainingModel:
    """A pre-training model of the checkpoint's own family, config and objective, holding its weights."""
    pretrained = load_pretrained(path, find_tokenizer=False)
    model = pretraining_model(pretrained.config, next_sentence_prediction=pretrained.has_next_sentence_head)
    load_pretraining_weights(model, path, pretrained)
    return model


# ----------------------------------------------------------------------------------------------------------
# into a task model
#
# The encoder must match exactly (a missing or misshapen tensor stops the run: fine-tuning from half-loaded weights
# would be quietly worse). A checkpoint without a pooler (some exports have none) leaves the pooler at its random
# initialisation, as transformers does, and says so. The head is taken from the checkpoint only when every head tensor
# is there with the right shape (resuming from a fine-tuned model of the same task); otherwise it starts fresh, as
# the paper's heads do. ModernBERT's task heads begin with the masked LM's prediction head (head.dense, head.norm):
# from a pre-trained checkpoint that part is taken and the classifier starts fresh, as transformers' from_pretrained
# does (and ModernBERT's published fine-tuning with it).

_SHARED_WITH_PRETRAINING = {"bert": (), "encoder": ("head.",)}


def load_into_task_model(model: torch.nn.Module, pretrained: Pretrained) -> str:
    """Load what fits; returns what was loaded, for logs and metrics.json."""
    check_same_family(model.config, pretrained.config, pretrained.source)
    attribute = encoder_attribute(model.config)
    encoder = encoder_of(model)
    pooler = getattr(encoder, "pooler", None)   # ModernBERT has none; BERT's span and token heads neither
    encoder_state = dict(pretrained.encoder_state)
    if pooler is None:   # span and token heads read every token, not the pooled [CLS]: no pooler
        encoder_state = {k: v for k, v in encoder_state.items() if not k.startswith("pooler.")}
    try:
        missing, unexpected = encoder.load_state_dict(encoder_state, strict=False)
    except RuntimeError as error:   # a tensor of another shape: another model size
        raise ValueError(f"{pretrained.source} does not fit the encoder {pretrained.config}: {error}") from None
    pooler_missing = sorted(k for k in missing if k.startswith("pooler."))
    missing = [k for k in missing if not k.startswith("pooler.")]
    if missing or unexpected:
        raise ValueError(f"{pretrained.source} does not fit the encoder {pretrained.config}: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}")
    parts = ["encoder"]
    if pooler_missing and pooler is not None:
        parts.append("pooler left at random initialisation (not in the checkpoint)")

    head = {name: param for name, param in model.state_dict().items() if not name.startswith(f"{attribute}.")}
    if head and _fits(head, pretrained.head_state):
        model.load_state_dict({name: pretrained.head_state[name] for name in head}, strict=False)
        parts.append(f"task head ({', '.join(sorted(head))})")
    elif head:   # an encoder without a head (feature extraction) has none to start fresh
        shared = {name: tensor for name, tensor in head.items()
                  if name.startswith(_SHARED_WITH_PRETRAINING[attribute])}
        if shared and _fits(shared, pretrained.head_state):
            model.load_state_dict({name: pretrained.head_state[name] for name in shared}, strict=False)
            parts.append(f"prediction head ({', '.join(sorted(shared))}); new classifier")
        else:
            parts.append("new task head")
    return "; ".join(parts)


def _fits(wanted: dict[str, torch.Tensor], available: dict[str, torch.Tensor]) -> bool:
    """Every wanted tensor is available, in its shape."""
    return all(name in available and available[name].shape == tensor.shape for name, tensor in wanted.items())
