"""BERT (Devlin et al. 2019) for pre-training: the encoder and its masked-LM and next-sentence heads.

Read it bottom-up: embeddings, self-attention, feed-forward, encoder layer, pooler, masked-LM head, the encoder
(BertModel), then the pre-training model (BertForPreTraining).

It is the paper's model as google-research/bert implements it: post-LayerNorm residual blocks, exact (erf)
GELU, learned absolute positions, token-type embeddings, and an MLM decoder tied to the word embeddings.
Parameter names are our own; model/bert/hf_conversion.py maps them to and from transformers' BertForPreTraining,
and the tests check both give the same logits.

Shapes: B batch, T sequence length, C hidden size, nh heads, hs head size (C = nh * hs), P masked positions
per sequence, V vocabulary size.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.bert.config import BertConfig
from model.shared.document_masks import document_attention_mask, token_documents
from model.shared.dropout import dropout
from model.shared.losses import classification_loss
from model.shared.outputs import EncoderOutput, PreTrainingOutput
from model.shared.unpadding import UnpaddedLayout
from model.shared.vocab_padding import padded_vocab_linear


def residual_stream(x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm's output as the residual stream carries it: in autocast's dtype under autocast (bf16-mixed), else
    as it is. Autocast runs LayerNorm in fp32 and returns fp32, so without this the stream between the blocks (and
    every activation saved from it for the backward) would be fp32: twice the memory traffic of the matmuls' bf16
    inputs, which autocast would cast it to anyway. The residual additions are then in bf16, as in NVIDIA's and
    Megatron's BERT (the LayerNorm itself still computes its statistics in fp32)."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        # No padding_idx: in google-research/bert [PAD] is a row like any other (it is never attended to).
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p = config.hidden_dropout

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """position_ids (B, T): packed rows' positions, restarting at 0 at each pair; default 0..T-1 for every row."""
        T = input_ids.shape[1]
        if T > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"({self.position_embeddings.num_embeddings})")
        positions = torch.arange(T, device=input_ids.device) if position_ids is None else position_ids  # (T,), (B, T)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, T, C)
        x = x + self.position_embeddings(positions)  # (T, C) broadcasts over the batch
        return dropout(residual_stream(self.layer_norm(x)), self.dropout_p, self.training)


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention; padding keys are masked out."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        # Query, key and value in one matmul (one kernel launch instead of three).
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_dropout

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None,
                unpadded: UnpaddedLayout | None = None) -> torch.Tensor:
        """x: (B, T, C), or (N, C) with `unpadded`: the real tokens of a (B, T) batch (model/shared/unpadding.py)."""
        qkv = self.qkv(x) if unpadded is None else unpadded.pad(self.qkv(x))  # (B, T, 3C): attention needs rows
        B, T, C = qkv.shape[0], qkv.shape[1], x.shape[-1]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        # key_padding_mask is (B, 1, 1, T): broadcast over heads and queries. Padded queries still attend to
        # the real tokens; their outputs are simply never used.
        dropout_p = self.dropout_p if self.training else 0.0
        if dropout_p > 0.0 and x.device.type == "cpu":
            # SDPA has no CPU kernel with dropout and falls back to its math path; this is that path, with the
            # cheaper dropout above and a plain softmax (every row has a real key: [CLS]).
            y = attention_with_dropout(q, k, v, key_padding_mask, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_padding_mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.output(y if unpadded is None else unpadded.unpad(y))  # (B, T, C) or (N, C)


def attention_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
                           dropout_p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs), keys masked) with dropout on the probabilities, times v: SDPA's math path.

    q, k, v: (B, nh, T, hs); key_padding_mask: (B, 1, 1, T) boolean, True where a key may be attended to.
    """
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, nh, T, T)
    if key_padding_mask is not None:
        scores = scores.masked_fill_(~key_padding_mask, float("-inf"))
    return dropout(scores.softmax(dim=-1), dropout_p, training=True) @ v  # (B, nh, T, hs)


class FeedForward(nn.Module):
    """Position-wise MLP: C -> intermediate -> C with exact (erf) GELU, as in the paper's code."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class EncoderLayer(nn.Module):
    """A post-LN Transformer block: x = LayerNorm(x + Dropout(Sublayer(x))) for attention, then the MLP.

    Post-LN (not the pre-LN of GPT-2 and later) is what BERT's published weights expect.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(config)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p = config.hidden_dropout

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None,
                unpadded: UnpaddedLayout | None = None) -> torch.Tensor:
        p, training = self.dropout_p, self.training
        attended = self.attention(x, key_padding_mask, unpadded)
        x = residual_stream(self.attention_norm(x + dropout(attended, p, training)))  # (B, T, C), or (N, C) unpadded
        x = residual_stream(self.feed_forward_norm(x + dropout(self.feed_forward(x), p, training)))
        return x


class Pooler(nn.Module):
    """The sequence summary NSP (and later sentence classifiers) read: dense + tanh on the [CLS] state."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor, cls_positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C) from each row's first token; with cls_positions (B, K), a packed row's K pairs' [CLS] positions,
        (B, K, C)."""
        if cls_positions is None:
            return torch.tanh(self.dense(sequence_output[:, 0]))  # (B, C)
        index = cls_positions.long().unsqueeze(-1).expand(-1, -1, sequence_output.shape[-1])  # (B, K, C)
        return torch.tanh(self.dense(torch.gather(sequence_output, 1, index)))  # (B, K, C)


class MaskedLMHead(nn.Module):
    """A "transform" (dense + GELU + LayerNorm), then a score for every vocabulary token.

    The decoder's weight is the word-embedding matrix (tied by BertForPreTraining), so a hidden state is scored
    against the input embedding of each token; the decoder's bias is the head's own.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.vocab_multiple = 1   # how the decoder runs, not what it is: model.pad_vocab_to_multiple_of

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        transformed = self.layer_norm(F.gelu(self.dense(hidden)))
        if self.vocab_multiple > 1:
            return padded_vocab_linear(transformed, self.decoder.weight, self.decoder.bias, self.vocab_multiple)
        return self.decoder(transformed)  # (..., C) -> (..., V)


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: weights ~ N(0, std), biases 0, LayerNorm scale 1 and shift 0.

    google-research/bert draws from a normal truncated at 2 std; the difference does not matter in practice and
    the plain normal is what transformers uses.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def attention_mask_for(attention_mask: torch.Tensor | None,
                       document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The boolean mask every layer attends with: (B, 1, 1, T) over the keys for rows of one sequence each, or for
    packed rows (document_ids: the pair of each token) (B, 1, T, T), block-diagonal, so that each pair attends to
    itself alone, as in a row of its own (model/shared/document_masks.py)."""
    if document_ids is None:
        return key_padding_mask(attention_mask)
    return document_attention_mask(token_documents(attention_mask, document_ids))


def key_padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) with 1 for tokens and 0 for padding -> (B, 1, 1, T) boolean, True where a key may be attended to.

    Every sequence needs at least one real token ([CLS] always is): a row with none would attend to nothing
    and give NaN.
    """
    if attention_mask is None:
        return None  # lets SDPA pick its fastest (mask-free) kernel
    return attention_mask.bool()[:, None, None, :]


class BertModel(nn.Module):
    """The encoder: embeddings, num_layers post-LN blocks, and the pooler. For features and fine-tuning.

    add_pooling_layer=False leaves the pooler out (pooled_output None), as transformers does for the heads that read
    every token's state (question answering, token classification): a pooler that no loss reaches would be a
    parameter without gradients, which DDP with find_unused_parameters=False refuses.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.apply(functools.partial(init_bert_weights, std=config.initializer_range))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                token_index: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cls_positions: torch.Tensor | None = None) -> EncoderOutput:
        """input_ids, token_type_ids (0 = segment A, 1 = B; default all 0), attention_mask (1 = token,
        0 = padding; default no padding): all (B, T). token_index (N,): the layers compute on these tokens only
        (flat indices b * T + t, from the collator; model/shared/unpadding.py), their states are zeros elsewhere.

        Packed rows (several sentence pairs per row, Krell et al. 2021): document_ids (B, T) the pair of each token
        in its row (0, 0, ..., 1, 1, ...; -1 at padding), position_ids (B, T) its position within its pair, and
        cls_positions (B, K) where each pair's [CLS] is (padding slots: any position); the pooled output is then
        (B, K, C), one per pair. Each pair is encoded as it would be in a row of its own."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None and document_ids is not None:
            attention_mask = (document_ids >= 0).long()  # padding marked by document -1 alone
        mask = attention_mask_for(attention_mask, document_ids)
        unpadded = UnpaddedLayout.of(token_index, input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, C)
        hidden_states = [x] if output_hidden_states else None
        x = x if unpadded is None else unpadded.unpad(x)  # (N, C)
        for layer in self.layers:
            x = layer(x, mask, unpadded)  # (B, T, C) or (N, C)
            if hidden_states is not None:
                hidden_states.append(x if unpadded is None else unpadded.pad(x))
        x = x if unpadded is None else unpadded.pad(x)  # (B, T, C)
        pooled = self.pooler(x, cls_positions) if self.pooler is not None else None  # (B, C), or (B, K, C) packed
        return EncoderOutput(sequence_output=x, pooled_output=pooled,
                             hidden_states=tuple(hidden_states) if hidden_states is not None else None)


class BertForPreTraining(nn.Module):
    """BertModel with the masked-LM head (tied to the word embeddings) and the next-sentence head.

    next_sentence_prediction=False: the MLM-only objective (RoBERTa, MosaicBERT), transformers' BertForMaskedLM:
    neither the next-sentence head nor the pooler that only it reads (a parameter no loss reaches).
    """

    def __init__(self, config: BertConfig, next_sentence_prediction: bool = True):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=next_sentence_prediction)
        self.mlm_head = MaskedLMHead(config)
        self.nsp_head = nn.Linear(config.hidden_size, 2) if next_sentence_prediction else None
        for head in (self.mlm_head, self.nsp_head):
            if head is not None:
                head.apply(functools.partial(init_bert_weights, std=config.initializer_range))
        # Tie after init, so the embedding keeps its one initialisation; both modules now hold one Parameter,
        # which gets gradient from the input lookup and from the output projection.
        self.mlm_head.decoder.weight = self.bert.embeddings.word_embeddings.weight

    @property
    def next_sentence_prediction(self) -> bool:
        return self.nsp_head is not None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None,
                masked_lm_labels: torch.Tensor | None = None,
                next_sentence_labels: torch.Tensor | None = None,
                token_index: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                cls_positions: torch.Tensor | None = None) -> PreTrainingOutput:
        """input_ids, token_type_ids, attention_mask: (B, T), as for BertModel.

        masked_positions: (B, P) positions to predict; only there are the MLM logits computed. Padding slots
        may hold any valid position (0 is fine) and are marked by masked_lm_labels == -100.
        masked_lm_labels: (B, P) original token ids, -100 for padding slots; or (B, T) with -100 at every
        unmasked position when masked_positions is None (the transformers convention).
        next_sentence_labels: (B,) 0 = B follows A, 1 = B is random (refused without the next-sentence head).
        Without masked_positions the MLM logits cover every position, (B, T, V).
        token_index (N,): unpadding (model/shared/unpadding.py), as for BertModel.

        Packed rows (document_ids, position_ids, cls_positions as for BertModel): masked_positions are positions in
        the packed row, every pair's together; next_sentence_labels is (B, K), one per pair at cls_positions, -100 in
        the slots of a row with fewer than K pairs; nsp_logits is (B, K, 2). The losses are the unpacked batch's:
        the MLM loss is the mean over every scored position of the batch and the NSP loss the mean over every pair
        of the batch (the slots labelled -100 take no part), so the same pairs, packed or one per row, give the same
        losses, accuracies and gradients (tests/model/test_bert_packing.py).
        """
        if document_ids is not None and next_sentence_labels is not None and cls_positions is None:
            raise ValueError("packed rows (document_ids) with next_sentence_labels need cls_positions: the [CLS] of "
                             "each pair, where its next-sentence logits are read")
        encoded = self.bert(input_ids, token_type_ids, attention_mask, token_index=token_index,
                            document_ids=document_ids, position_ids=position_ids, cls_positions=cls_positions)
        hidden = encoded.sequence_output  # (B, T, C)
        if masked_positions is not None:
            # Gather before the head: the transform and the (C x V) projection then run on P instead of T
            # positions per sequence (20 of 128 in phase 1), with the same loss.
            index = masked_positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (B, P, C)
            hidden = torch.gather(hidden, 1, index)  # (B, P, C)
        nsp_logits = self.nsp_head(encoded.pooled_output) if self.nsp_head is not None else None
        out = PreTrainingOutput(mlm_logits=self.mlm_head(hidden), nsp_logits=nsp_logits)

        losses = []
        if masked_lm_labels is not None:
            if masked_lm_labels.shape != out.mlm_logits.shape[:2]:
                raise ValueError(f"masked_lm_labels has shape {tuple(masked_lm_labels.shape)}, expected "
                                 f"{tuple(out.mlm_logits.shape[:2])} (one label per scored position)")
            out.mlm_loss, out.mlm_correct, out.mlm_total = classification_loss(out.mlm_logits, masked_lm_labels)
            losses.append(out.mlm_loss)
        if next_sentence_labels is not None:
            if nsp_logits is None:
                raise ValueError("next_sentence_labels given to a model without the next-sentence head (MLM only)")
            if next_sentence_labels.shape != nsp_logits.shape[:-1]:
                raise ValueError(f"next_sentence_labels has shape {tuple(next_sentence_labels.shape)}, expected "
                                 f"{tuple(nsp_logits.shape[:-1])} (one label per sequence, or per cls_positions slot)")
            out.nsp_loss, out.nsp_correct, out.nsp_total = classification_loss(out.nsp_logits, next_sentence_labels)
            losses.append(out.nsp_loss)
        if losses:
            out.loss = losses[0] if len(losses) == 1 else losses[0] + losses[1]
        return out
