"""data.packing (MLPerf-style packing of BERT's sentence pairs, pipeline/pretraining/data/pair_packing.py): what a
run packs with, and the combinations refused before anything starts, each saying what to change.

- A ModernBERT-class model: it trains on rows of packed documents already (data prep's objective=mlm), which the
  collator describes with document_layout; pair packing is BERT's, for sentence-pair rows.
- model.compile: a packed batch's row count follows its pairs' lengths, so it varies from batch to batch, and the
  compiled layers (fullgraph, static shapes) compile a graph per row count until torch's recompile limit stops the
  run (measured, torch 2.13 on the CPU: a compiled EncoderLayer fed 1, 2, ... rows raised FailOnRecompileLimitHit at
  the 9th row count); CUDA graphs (which need compile) capture one shape. Packed rows run eager.
- A shard set without sentence pairs (objective=mlm): its rows are full packed documents, with nothing to pack.
data.unpad with packing is supported: the layers then run on the packed rows' real tokens (tests/model/
test_bert_packing.py, tests/pretraining/test_pair_packing.py); so are batch warm-up and DeepSpeed ZeRO-2, tested on the
CPU (tests/pretraining/test_pair_packing.py, test_packed_training.py).
"""
from __future__ import annotations

from typing import Any

from model.architectures import family_name, is_modernbert


def max_pairs_per_row(cfg: Any, model_config: Any) -> int | None:
    """The most pairs a packed row holds (data.max_pairs_per_row) with data.packing=true, else None; refuses what
    cannot run (see the module docstring)."""
    data = cfg.data
    if not data.get("packing", False):
        return None
    most = data.get("max_pairs_per_row", 3)
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"data.max_pairs_per_row must be a positive integer (MLPerf BERT packs at most 3), "
                         f"got {most!r}")
    if is_modernbert(model_config):
        raise ValueError(f"data.packing=true packs BERT's sentence pairs; a {family_name(model_config)} model trains "
                         "on rows of packed documents already (data prep's objective=mlm) and attends within each "
                         "document: set data.packing=false")
    if cfg.model.get("compile"):
        raise ValueError("data.packing=true with model.compile=true: a packed batch has as many rows as its pairs "
                         "need, a number that varies from batch to batch, and the compiled layers (fullgraph, static "
                         "shapes) would compile a graph per row count until torch's recompile limit stops the run; "
                         "set model.compile=false (and model.cuda_graphs=false), or data.packing=false")
    return most


def check_shard_set_for_packing(shard_set: Any, path: str) -> None:
    """data.packing needs rows of sentence pairs (objective mlm_nsp) to pack."""
    if shard_set.objective == "mlm":
        raise ValueError(f"data.packing=true packs BERT's sentence pairs, but shard set {path} holds MLM-only rows "
                         "(objective=mlm): full rows of packed documents, with nothing to pack; set data.packing=false")
