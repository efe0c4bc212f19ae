"""Text -> per-layer vectors with a frozen BERT (or ModernBERT-class encoder), through fine-tuning's own loading,
featurizer and batching.

    extractor = Extractor.from_init("outputs/train/demo", views=["layer_-1", "sum_last_four"])
    for sentence in extractor.extract(records, report):   # in input order
        sentence.pooled["mean"]["layer_-1"]                # (C,) numpy

The weights and the tokenizer come from `init=` exactly as fine-tuning takes them (pipeline/core/checkpoints/weights.py,
pipeline/finetuning/tokenizer.py), so extraction accepts every checkpoint fine-tuning does. Sentences are featurized by
fine-tuning's sentence_features ([CLS] a [SEP] (b [SEP]), the reference's truncation) and batched by its eval_loader:
a chunk of records at a time, shortest first, each batch padded to its own longest sequence, then put back in input
order. Memory is bounded by the chunk, whatever the size of the input. The layers are the encoder's hidden states:
the embeddings, then each layer's output (the last one after the final LayerNorm for ModernBERT, whose segment ids
are ignored).

Poolings, over a sentence's real tokens only (padding never enters): `cls` the [CLS] vector, `mean` the mean over
every token of the sequence, [CLS] and [SEP] included (as sentence-transformers' mean pooling).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from model import BertModel, ModernBertModel
from model.architectures import EncoderConfig, is_modernbert
from pipeline.extraction.inputs import InputReport, TextRecord
from pipeline.extraction.layers import apply_view, view_names, view_positions
from pipeline.finetuning.tokenizer import LoadedTokenizer

log = logging.getLogger(__name__)
POOLINGS = ("cls", "mean")


class FeatureEncoder(torch.nn.Module):
    """The encoder without a head: what fine-tuning's load_into_task_model fills (the family's encoder attribute,
    pipeline/core/checkpoints/weights.py's encoder_of: BERT's `.bert`, ModernBERT's `.encoder`)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        if is_modernbert(config):
            self.encoder = ModernBertModel(config)
        else:
            self.bert = BertModel(config, add_pooling_layer=False)   # pooled = [CLS] / mean, not BERT's NSP pooler

    def forward(self, input_ids, token_type_ids, attention_mask) -> tuple[torch.Tensor, ...]:
        if is_modernbert(self.config):   # no segments
            return self.encoder(input_ids, attention_mask, output_hidden_states=True).hidden_states
        return self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True).hidden_states


@dataclasses.dataclass
class SentenceFeatures:
    line_index: int
    text_a: str
    text_b: str | None
    input_ids: list[int]
    token_type_ids: list[int]
    tokens_cut: int
    per_token: dict[str, np.ndarray] | None      # view -> (T, C_view) float32; None when not asked for
    pooled: dict[str, dict[str, np.ndarray]]     # pooling -> view -> (C_view,) float32


@dataclasses.dataclass
class Extractor:
    encoder: FeatureEncoder
    tokenizer: LoadedTokenizer
    views: list[str]
    poolings: Sequence[str] = POOLINGS
    per_token: bool = True
    max_seq_length: int = 128
    batch_size: int = 128
    chunk_size: int = 4096          # records featurized and sorted together; bounds memory
    source: str = ""

    @classmethod
    def from_init(cls, init, layers: Sequence[int] | None = None, combinations: Sequence[str] = (), tokenizer=None,
                  **settings) -> Extractor:
        """The encoder of `init` (anything fine-tuning's init= takes). layers: indices as layers.py reads them;
        None for every hidden state, embeddings first (what the probe combines)."""
        from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained
        from pipeline.finetuning.tokenizer import check_special_tokens, load_tokenizer

        pretrained = load_pretrained(init, tokenizer)
        config = pretrained.config
        encoder = FeatureEncoder(config)
        loaded = load_into_task_model(encoder, pretrained)
        log.info("weights from %s: %s", pretrained.source, loaded)
        views = view_names(range(config.num_layers + 1) if layers is None else layers, combinations,
                           config.num_layers)
        if not views:
            raise ValueError("nothing to extract: give layers=[...] and/or combinations=[...]")
        tokenizer = load_tokenizer(pretrained.tokenizer_source, config.vocab_size)
        check_special_tokens(tokenizer, config)
        return cls(encoder=encoder.eval(), tokenizer=tokenizer, views=views, source=pretrained.source, **settings)

    def __post_init__(self) -> None:
        config = self.encoder.config
        for view in self.views:
            view_positions(view, config.num_layers)   # a bad layer fails now, not after the first chunk
        unknown = [p for p in self.poolings if p not in POOLINGS]
        if unknown:
            raise ValueError(f"unknown pooling {unknown}; known: {', '.join(POOLINGS)}")
        if not 4 <= self.max_seq_length <= config.max_position_embeddings:
            raise ValueError(f"max_seq_length must be in [4, {config.max_position_embeddings}] (the model's "
                             f"positions), got {self.max_seq_length}")
        self.encoder.eval()

    def tokens(self, input_ids: list[int]) -> list[str]:
        return [self.tokenizer.tokenizer.id_to_token(i) for i in input_ids]

    def extract(self, records: Iterable[TextRecord], report: InputReport | None = None
                ) -> Iterator[SentenceFeatures]:
        """Features for every record, in the records' order; truncations counted in `report`."""
        records = iter(records)
        while chunk := list(itertools.islice(records, self.chunk_size)):
            yield from self._extract_chunk(chunk, report)

    @torch.inference_mode()
    def _extract_chunk(self, chunk: list[TextRecord], report: InputReport | None) -> list[SentenceFeatures]:
        import datasets

        from pipeline.finetuning.batches import FeatureRows, PaddingCollator, eval_loader
        from pipeline.finetuning.features import sentence_features

        features = sentence_features({"text_a": [r.text_a for r in chunk], "text_b": [r.text_b for r in chunk]},
                                     self.tokenizer, self.max_seq_length)
        if report is not None:
            for record, cut in zip(chunk, features["tokens_cut"]):
                if cut:
                    report.count("truncated", record.index)
                    report.counts["tokens_cut"] += cut
        rows = FeatureRows(datasets.Dataset.from_dict(features), kind="classification")
        out: list[SentenceFeatures | None] = [None] * len(chunk)
        num_layers = self.encoder.config.num_layers
        for batch in eval_loader(rows, self.batch_size, PaddingCollator(self.tokenizer.pad_id)):
            hidden = self.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden[0].dtype)   # (B, T, 1)
            lengths = batch["attention_mask"].sum(dim=1)                      # (B,)
            views = {view: apply_view(view, hidden, num_layers).float() for view in self.views}   # (B, T, C_v)
            pooled = {"cls": {v: x[:, 0] for v, x in views.items()},
                      "mean": {v: (x * mask).sum(dim=1) / lengths[:, None] for v, x in views.items()}}
            for i, (row, n) in enumerate(zip(batch["row"].tolist(), lengths.tolist())):
                record = chunk[row]
                out[row] = SentenceFeatures(
                    line_index=record.index, text_a=record.text_a, text_b=record.text_b,
                    input_ids=rows.input_ids[row], token_type_ids=rows.token_type_ids[row],
                    tokens_cut=features["tokens_cut"][row],
                    per_token={v: x[i, :n].numpy().copy() for v, x in views.items()} if self.per_token else None,
                    pooled={p: {v: x[i].numpy().copy() for v, x in pooled[p].items()} for p in self.poolings})
        return out
