"""Pre-trained weights into a task model: the encoder always, the head only when the checkpoint has one that fits.

The encoder must match exactly (a missing or misshapen tensor stops the run: fine-tuning from half-loaded weights
would be quietly worse). A checkpoint without a pooler (some exports have none) leaves the pooler at its random
initialisation, as transformers does, and says so. The head is taken from the checkpoint only when every head tensor
is there with the right shape (resuming from a fine-tuned model of the same task); otherwise it starts fresh, as
the paper's heads do.
"""
from __future__ import annotations

import torch

from pipeline.finetuning.pretrained import Pretrained


def load_into_task_model(model: torch.nn.Module, pretrained: Pretrained) -> str:
    """Load what fits; returns what was loaded, for logs and metrics.json."""
    encoder_state = dict(pretrained.encoder_state)
    if model.bert.pooler is None:   # span and token heads read every token, not the pooled [CLS]: no pooler
        encoder_state = {k: v for k, v in encoder_state.items() if not k.startswith("pooler.")}
    try:
        missing, unexpected = model.bert.load_state_dict(encoder_state, strict=False)
    except RuntimeError as error:   # a tensor of another shape: another model size
        raise ValueError(f"{pretrained.source} does not fit the encoder {pretrained.config}: {error}") from None
    pooler_missing = sorted(k for k in missing if k.startswith("pooler."))
    missing = [k for k in missing if not k.startswith("pooler.")]
    if missing or unexpected:
        raise ValueError(f"{pretrained.source} does not fit the encoder {pretrained.config}: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}")
    parts = ["encoder"]
    if pooler_missing and model.bert.pooler is not None:
        parts.append("pooler left at random initialisation (not in the checkpoint)")

    head = {name: param for name, param in model.state_dict().items() if not name.startswith("bert.")}
    fits = all(name in pretrained.head_state and pretrained.head_state[name].shape == tensor.shape
               for name, tensor in head.items())
    if head and fits:
        model.load_state_dict({name: pretrained.head_state[name] for name in head}, strict=False)
        parts.append(f"task head ({', '.join(sorted(head))})")
    elif head:   # an encoder without a head (feature extraction) has none to start fresh
        parts.append("new task head")
    return "; ".join(parts)
