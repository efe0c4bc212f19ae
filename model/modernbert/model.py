"""ModernBERT (Warner et al. 2024): the encoder and its masked-LM model.

Read it bottom-up: embeddings, rotary position embeddings, self-attention, GeGLU feed-forward, encoder layer, the
encoder (ModernBertModel), the masked-LM head, the masked-LM model (ModernBertForMaskedLM).

It is transformers' ModernBertForMaskedLM computation: pre-LayerNorm residual blocks (the first layer's attention
reads the embeddings' own LayerNorm), LayerNorms and linear layers without biases, rotary positions with one theta
for global and another for local layers, every global_attn_every_n_layers-th layer global and the others attending in
a sliding window, a GeGLU MLP, a final LayerNorm, and a decoder tied to the token embeddings. Inside the encoder the
parameter names are transformers' (model/modernbert/hf_conversion.py only renames the prefix), and the tests check
both give the same logits.

Beyond transformers: packed rows (document_ids: several documents per row, each attending only within itself) and
unpadding (token_index, model/shared/unpadding.py); who attends to whom is model/modernbert/attention_masks.py.

Shapes: B batch, T sequence length, N computed (unpadded) tokens, C hidden size, nh heads, hs head size
(C = nh * hs), F GeGLU width, P masked positions per sequence, V vocabulary size.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.modernbert.attention_masks import AttentionMasks, build_attention_masks, token_documents
from model.modernbert.config import ModernBertConfig
from model.shared.dropout import dropout
from model.shared.losses import classification_loss
from model.shared.outputs import EncoderOutput, PreTrainingOutput
from model.shared.unpadding import UnpaddedLayout


class Embeddings(nn.Module):
    """Token embeddings, LayerNorm (no bias) and dropout; positions enter later, as rotations in attention."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        # padding_idx as transformers': the [PAD] row gets no gradient from the lookup.
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=False)
        self.dropout_p = config.embedding_dropout

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return dropout(self.norm(self.tok_embeddings(input_ids)), self.dropout_p, self.training)  # (B, T, C)


def rotary_cos_sin(positions: torch.Tensor, head_size: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (..., hs) for positions (...): transformers' default RoPE.

    The frequencies are computed here (hs / 2 of them), not kept as a buffer: a model cast to bf16 would cast the
    buffer too, and every angle with it.
    """
    exponents = torch.arange(0, head_size, 2, dtype=torch.float, device=positions.device) / head_size
    inv_freq = 1.0 / (theta ** exponents)  # (hs / 2,)
    angles = positions[..., None].float() * inv_freq  # (..., hs / 2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., hs): the two halves rotate together (rotate_half)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: (..., nh, hs); cos, sin: (..., hs). In fp32 whatever the dtype (as transformers): bf16 angles of
    positions in the thousands would lose the relative offsets RoPE exists to encode."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()  # broadcast over heads
    q_rotated = q.float() * cos + rotate_half(q.float()) * sin
    k_rotated = k.float() * cos + rotate_half(k.float()) * sin
    return q_rotated.to(q.dtype), k_rotated.to(k.dtype)


@functools.cache
def _compiled_flex_attention():
    # Eager flex_attention materialises every score (a reference path); compiled, it is a fused kernel.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> torch.Tensor:
    """flex_attention compiled on a GPU, eager on the CPU (there the compile takes longer than small runs).

    On the CPU torch 2.13 runs it forward only, eager or compiled ("FlexAttention does not support backward on CPU"):
    training there takes the sdpa backend, as "auto" does.
    """
    if q.device.type == "cpu":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("attention_backend='flex' cannot train on the CPU: torch's FlexAttention has no "
                                      "CPU backward; use attention_backend='sdpa' (or 'auto') there")
        from torch.nn.attention.flex_attention import flex_attention as eager_flex_attention

        return eager_flex_attention(q, k, v, block_mask=block_mask)
    return _compiled_flex_attention()(q, k, v, block_mask=block_mask)


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with rotary positions, over the whole row (global layers) or a
    sliding window (local layers)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.dropout_p = config.attention_dropout

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], masks: AttentionMasks,
                mask, unpadded: UnpaddedLayout | None) -> torch.Tensor:
        """x: (B, T, C), or (N, C) with `unpadded`. rotary: cos, sin in the layout attention runs in (masks.on_tokens:
        (N, hs), else (B, T, hs)). mask: this layer's, from masks."""
        qkv = self.Wqkv(x)  # (B, T, 3C) or (N, 3C)
        if unpadded is not None and not masks.on_tokens:
            qkv = unpadded.pad(qkv)  # (B, T, 3C): SDPA attends within rows
        # Rows [0, C) of Wqkv are the query, then the key, then the value, each head after head (transformers').
        q, k, v = qkv.unflatten(-1, (3, self.num_heads, self.head_size)).unbind(-3)  # (..., nh, hs)
        q, k = apply_rotary(q, k, *rotary)
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # (B, nh, T, hs) or (nh, N, hs)
        if masks.backend == "flex":
            batched = q.dim() == 4
            q, k, v = (t if batched else t[None] for t in (q, k, v))  # (B, nh, T, hs) or (1, nh, N, hs)
            y = flex_attention(q, k, v, block_mask=mask)
            y = y if batched else y[0]  # (B, nh, T, hs) or (nh, N, hs)
        else:
            dropout_p = self.dropout_p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # (B, nh, T, hs)
        y = y.transpose(-3, -2).flatten(-2)  # heads side by side: (B, T, C) or (N, C)
        if unpadded is not None and not masks.on_tokens:
            y = unpadded.unpad(y)  # (N, C)
        return dropout(self.Wo(y), self.dropout_p, self.training)


class GeGLU(nn.Module):
    """The MLP: C -> 2F, split into an input and a gate, gelu(input) * gate, F -> C (Shazeer 2020)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.dropout_p = config.mlp_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input, gate = self.Wi(x).chunk(2, dim=-1)  # (..., F) each
        return self.Wo(dropout(F.gelu(input) * gate, self.dropout_p, self.training))  # exact (erf) GELU


class EncoderLayer(nn.Module):
    """A pre-LN block: x = x + Attention(LayerNorm(x)), then x = x + MLP(LayerNorm(x)).

    The residual stream stays in the dtype of the embeddings (fp32 under autocast): unlike BERT's post-LN blocks,
    nothing renormalises it between layers, and it sums every layer's output.
    """

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        self.is_global = config.layer_is_global(index)
        # Layer 0 reads the embeddings, which have just been normalised.
        self.attn_norm = (nn.Identity() if index == 0 else
                          nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=False))
        self.attn = SelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=False)
        self.mlp = GeGLU(config)

    def forward(self, x: torch.Tensor, rotary: dict[bool, tuple[torch.Tensor, torch.Tensor]], masks: AttentionMasks,
                unpadded: UnpaddedLayout | None = None) -> torch.Tensor:
        """rotary: cos, sin by is_global."""
        mask = masks.for_layer(self.is_global)
        x = x + self.attn(self.attn_norm(x), rotary[self.is_global], masks, mask, unpadded)  # (B, T, C) or (N, C)
        return x + self.mlp(self.mlp_norm(x))


def truncated_normal_(weight: torch.Tensor, std: float, cutoff_factor: float) -> None:
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-cutoff_factor * std, b=cutoff_factor * std)


def init_modernbert_weights(module: nn.Module, config: ModernBertConfig) -> None:
    """transformers' ModernBERT initialisation, module by module: normals truncated at cutoff_factor std, with std
    initializer_range for inputs (Wqkv, Wi, embeddings) and initializer_range / sqrt(2 L) for the projections back
    into the residual stream (each Wo), which L layers add up; LayerNorm scales 1. Heads initialise their own."""
    out_std = config.initializer_range / math.sqrt(2.0 * config.num_layers)
    cutoff = config.initializer_cutoff_factor
    if isinstance(module, Embeddings):
        truncated_normal_(module.tok_embeddings.weight, config.initializer_range, cutoff)
    elif isinstance(module, (SelfAttention, GeGLU)):
        truncated_normal_((module.Wqkv if isinstance(module, SelfAttention) else module.Wi).weight,
                          config.initializer_range, cutoff)
        truncated_normal_(module.Wo.weight, out_std, cutoff)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)


def resolve_backend(config: ModernBertConfig, device: torch.device, training: bool) -> str:
    """config.attention_backend, with "auto" made concrete: flex on a GPU, unless attention dropout is to be applied
    (flex_attention has none); sdpa elsewhere."""
    if config.attention_backend != "auto":
        return config.attention_backend
    wants_dropout = training and config.attention_dropout > 0
    return "flex" if device.type == "cuda" and not wants_dropout else "sdpa"


class ModernBertModel(nn.Module):
    """The encoder: embeddings, num_layers pre-LN blocks, and the final LayerNorm. No pooler (ModernBERT has none)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=False)
        self.apply(functools.partial(init_modernbert_weights, config=config))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                token_index: torch.Tensor | None = None, output_hidden_states: bool = False) -> EncoderOutput:
        """input_ids, attention_mask (1 = token, 0 = padding; default none), document_ids (the document of its row
        each token belongs to, -1 at padding; default one per row), position_ids (within its document; default
        0..T-1): all (B, T). token_index (N,): the layers compute on these tokens only (flat indices b * T + t,
        model/shared/unpadding.py); their states are zeros elsewhere.
        hidden_states: the embeddings, each layer's output, and for the last layer its output after the final
        LayerNorm (sequence_output), as transformers 5's."""
        B, T = input_ids.shape
        config, device = self.config, input_ids.device
        if attention_mask is None and document_ids is not None:
            attention_mask = document_ids >= 0  # padding marked by document -1 alone
        unpadded = UnpaddedLayout.of(token_index, input_ids, attention_mask)
        backend = resolve_backend(config, device, self.training)
        masks = build_attention_masks(backend, token_documents(attention_mask, document_ids), unpadded, T,
                                      config.local_attention // 2, device)

        x = self.embeddings(input_ids)  # (B, T, C)
        hidden_states = [x] if output_hidden_states else None
        if position_ids is None:
            position_ids = torch.arange(T, device=device).expand(B, T)
        if masks.on_tokens:
            position_ids = unpadded.unpad(position_ids)  # (N,)
        rotary = {is_global: rotary_cos_sin(position_ids, config.head_size, theta, x.dtype)  # (B, T, hs) or (N, hs)
                  for is_global, theta in ((True, config.global_rope_theta), (False, config.local_rope_theta))}

        x = x if unpadded is None else unpadded.unpad(x)  # (N, C)
        for i, layer in enumerate(self.layers):
            x = layer(x, rotary, masks, unpadded)  # (B, T, C) or (N, C)
            if hidden_states is not None and i < len(self.layers) - 1:
                hidden_states.append(x if unpadded is None else unpadded.pad(x))
        x = self.final_norm(x)
        x = x if unpadded is None else unpadded.pad(x)  # (B, T, C)
        if hidden_states is not None:
            hidden_states.append(x)  # the last layer's after the final LayerNorm: sequence_output, as BertModel's
        return EncoderOutput(sequence_output=x, pooled_output=None,
                             hidden_states=tuple(hidden_states) if hidden_states is not None else None)


class PredictionHead(nn.Module):
    """dense (no bias) + GELU + LayerNorm: the transform before the MLM decoder and before every task classifier."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=False)
        truncated_normal_(self.dense.weight, config.initializer_range / math.sqrt(2.0 * config.num_layers),
                          config.initializer_cutoff_factor)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(hidden)))


class ModernBertForMaskedLM(nn.Module):
    """ModernBertModel, the prediction head, and a decoder tied to the token embeddings (with its own bias).

    Its forward has BertForPreTraining's interface, so that one training loop runs either; there is no next-sentence
    head, and no segments (token_type_ids are accepted and ignored).
    """

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.encoder = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        nn.init.zeros_(self.decoder.bias)
        # Tied after init: the embedding keeps its own initialisation, and one Parameter gets gradient from the
        # input lookup and from the output projection.
        self.decoder.weight = self.encoder.embeddings.tok_embeddings.weight

    @property
    def next_sentence_prediction(self) -> bool:
        return False

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None,
                masked_lm_labels: torch.Tensor | None = None, next_sentence_labels: torch.Tensor | None = None,
                token_index: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> PreTrainingOutput:
        """As BertForPreTraining.forward, with document_ids and position_ids as for ModernBertModel.

        masked_positions: (B, P) positions to predict (padding slots: any position, label -100); masked_lm_labels:
        (B, P), or (B, T) with -100 where nothing is predicted when masked_positions is None. nsp_logits is None.
        """
        if next_sentence_labels is not None:
            raise ValueError("next_sentence_labels given to ModernBERT, which has no next-sentence head (MLM only)")
        encoded = self.encoder(input_ids, attention_mask, document_ids=document_ids, position_ids=position_ids,
                               token_index=token_index)
        hidden = encoded.sequence_output  # (B, T, C)
        if masked_positions is not None:
            # Gather before the head: the transform and the (C x V) projection then run on P instead of T positions.
            index = masked_positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (B, P, C)
            hidden = torch.gather(hidden, 1, index)  # (B, P, C)
        out = PreTrainingOutput(mlm_logits=self.decoder(self.head(hidden)), nsp_logits=None)
        if masked_lm_labels is not None:
            if masked_lm_labels.shape != out.mlm_logits.shape[:2]:
                raise ValueError(f"masked_lm_labels has shape {tuple(masked_lm_labels.shape)}, expected "
                                 f"{tuple(out.mlm_logits.shape[:2])} (one label per scored position)")
            out.mlm_loss, out.mlm_correct, out.mlm_total = classification_loss(out.mlm_logits, masked_lm_labels)
            out.loss = out.mlm_loss
        return out
