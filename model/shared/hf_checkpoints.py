"""What both architectures' Hugging Face conversions share: reading any transformers checkpoint directory (such as a
model downloaded from a hub), writing the weights of one, splitting a state dict into the encoder's tensors and the
rest, a task model's labels in its config.json, and a short list of names for an error."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


def short_list(names: list[str], limit: int = 10) -> str:
    return f"{names[:limit]}{f' and {len(names) - limit} more' if len(names) > limit else ''}"


def split_encoder(state: Mapping[str, torch.Tensor], names: set[str], prefix: str, encoder_roots: tuple[str, ...],
                  family: str, num_layers: int, may_lack: frozenset[str] = frozenset()
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(encoder, others) of a transformers state dict, with or without the task models' `prefix` on the encoder's
    names: encoder holds `names` (transformers' names of a `num_layers`-layer encoder, without the prefix), others
    everything else under its own name. All of `names` must be there, except exactly the set may_lack (BERT's pooler,
    which a checkpoint may not have); a name under one of the encoder's roots ("embeddings.", ...) that is not in
    `names` raises too: more layers in the checkpoint than asked for would otherwise vanish silently into others."""
    encoder, others = {}, {}
    for name, tensor in state.items():
        bare = name.removeprefix(prefix)
        if bare in names:
            if bare in encoder:
                raise ValueError(f"{bare} appears both with and without the {prefix!r} prefix")
            encoder[bare] = tensor
        else:
            others[name] = tensor
    missing = sorted(names - encoder.keys())
    if missing and set(missing) != may_lack:
        raise ValueError(f"not a {family} encoder with {num_layers} layers: missing {len(missing)} encoder tensors "
                         f"{short_list(missing)}")
    stray = sorted(name for name in others if name.removeprefix(prefix).startswith(encoder_roots))
    if stray:
        raise ValueError(f"encoder tensors that a {num_layers}-layer {family} does not have (more layers in the "
                         f"checkpoint?): {short_list(stray)}")
    return encoder, others


def with_task_labels(values: dict, kind: str, model, id2label: Mapping[int | str, str] | Sequence[str] | None) -> dict:
    """`values` (a task model's config.json) with its labels, as hf_task_config_dict says, for the task heads of
    either family. kind: question_answering, sequence_classification, token_classification or multiple_choice."""
    if kind == "question_answering":
        if id2label is not None:
            raise ValueError(f"a question-answering model has no labels (its 2 outputs are the start and end "
                             f"scores), got id2label {id2label!r}")
        return values
    if kind in ("sequence_classification", "token_classification"):
        names = _label_names(id2label, model.num_labels)
        if kind == "sequence_classification":
            # Set, so that transformers does not infer it from the labels' dtype (float labels would make a
            # classifier "multi_label_classification").
            values["problem_type"] = "regression" if model.is_regression else "single_label_classification"
    elif id2label is not None:
        names = _label_names(id2label, len(id2label))
    else:
        return values
    values["num_labels"] = len(names)
    values["id2label"] = {str(i): name for i, name in enumerate(names)}  # JSON keys: transformers writes "0"
    values["label2id"] = {name: i for i, name in enumerate(names)}
    return values


def _label_names(id2label: Mapping[int | str, str] | Sequence[str] | None, num_labels: int) -> list[str]:
    if id2label is None:
        return [f"LABEL_{i}" for i in range(num_labels)]
    if isinstance(id2label, Mapping):
        by_id = {int(i): str(name) for i, name in id2label.items()}
        if sorted(by_id) != list(range(num_labels)):
            raise ValueError(f"id2label must name the ids 0..{num_labels - 1}, got ids {sorted(by_id)}")
        names = [by_id[i] for i in range(num_labels)]
    else:
        names = [str(name) for name in id2label]
    if len(names) != num_labels:
        raise ValueError(f"{len(names)} label names for {num_labels} labels: {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"label names must be distinct (label2id maps them back): {names}")
    return names


def write_hf_weights(out_dir: str | Path, config_dict: dict, hf_state: Mapping[str, torch.Tensor]) -> Path:
    """out_dir/config.json and out_dir/model.safetensors (transformers' names and config, from either family's
    hf_conversion): the weights of a directory that from_pretrained loads offline. Returns out_dir."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n", encoding="utf-8")
    # Own contiguous CPU copies: safetensors refuses tensors that share memory (the q, k, v views of one fused
    # weight).
    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in hf_state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


# Where transformers' save_pretrained puts the weights, in the order from_pretrained prefers them.
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin.index.json",
                    "pytorch_model.bin")


def read_hf_checkpoint(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, state dict) of a transformers checkpoint directory, such as a model downloaded from a hub.

    Weights from model.safetensors, a sharded checkpoint's index (*.index.json), or pytorch_model.bin (loaded
    with weights_only=True: tensors only, no pickled code). The state dict has the checkpoint's own names;
    encoder_state_from_hf or from_hf_state_dict convert it.
    """
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {directory}: not a transformers checkpoint directory")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for name in HF_WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            return config, _read_sharded(path) if name.endswith(".index.json") else _read_weights(path)
    raise FileNotFoundError(f"no PyTorch weights in {directory}: looked for {', '.join(HF_WEIGHT_FILES)}")


def _read_sharded(index_file: Path) -> dict[str, torch.Tensor]:
    weight_map = json.loads(index_file.read_text(encoding="utf-8"))["weight_map"]  # tensor name -> shard file
    state = {}
    for shard in sorted(set(weight_map.values())):
        if not (index_file.parent / shard).is_file():
            raise FileNotFoundError(f"{index_file} lists the shard {shard}, which is not in {index_file.parent}")
        state.update(_read_weights(index_file.parent / shard))
    missing = sorted(weight_map.keys() - state.keys())
    if missing:
        raise ValueError(f"{index_file} lists tensors that its shards lack: {short_list(missing)}")
    return state


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)
