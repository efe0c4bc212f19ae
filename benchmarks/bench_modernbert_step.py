"""One ModernBERT pre-training step on the CPU: our model/modernbert/ against transformers' ModernBertForMaskedLM.

    python benchmarks/bench_modernbert_step.py [--preset modernbert_mini] [--batch 16] [--seq 512] [--steps 8]
                                               [--warmup 2] [--threads 2] [--documents 3]

Both models hold the same weights (transformers' random init, read into ours with model/modernbert/hf_conversion.py)
and take the same batches: rows packed with several documents each, every token real (packed rows have no padding),
30% of the tokens masked (the 80/10/10 rule changes no cost: all [MASK] here). The attention each side computes is the
same: a token sees its own document, and on local layers only its half-window. transformers is given that as its
per-layer-kind 4D masks (a dict, which ModernBertModel takes as is) and per-document position_ids, built inside its
timed step as our model builds its masks inside its forward.

transformers in two settings: as its config comes (sparse_prediction=False: the decoder scores all T positions) and
with sparse_prediction=True (it scores only the masked ones, as ours does through masked_positions). A step is forward,
backward, clipping to 1.0 and an AdamW step (benchmarks/bench_train_step.py's), the same on every side. Before timing,
two steps with the same weights give the same losses (dropout is 0 in ModernBERT). tokens/s counts the real tokens.
Steps of the contenders alternate, so a change of load on this shared machine hits all of them; figures are medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from bench_train_step import make_optimizer, optimizer_kwargs, train_step  # noqa: E402
from common import REPO_ROOT  # noqa: E402,F401  (puts the repository root on sys.path)

from model.modernbert.config import ModernBertConfig  # noqa: E402
from model.modernbert.hf_conversion import from_hf_state_dict, hf_config_from  # noqa: E402

IGNORE = -100


def make_packed_batch(config: ModernBertConfig, batch: int, seq: int, documents: int, seed: int) -> dict:
    """Rows of `seq` real tokens holding about `documents` documents each ([CLS] ... [SEP] ... [SEP]), 30% masked."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(10, config.vocab_size, (batch, seq), generator=g)
    document_ids = torch.zeros(batch, seq, dtype=torch.long)
    position_ids = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        cuts = sorted(torch.randperm(seq - 2, generator=g)[:documents - 1].add(1).tolist())
        starts = [0, *cuts]
        for d, (start, stop) in enumerate(zip(starts, [*cuts, seq])):
            document_ids[b, start:stop] = d
            position_ids[b, start:stop] = torch.arange(stop - start)
            input_ids[b, stop - 1] = config.sep_token_id
        input_ids[b, 0] = config.cls_token_id
    predictions = round(0.3 * seq)
    candidates = input_ids != config.sep_token_id
    candidates[:, 0] = False
    scores = torch.rand(batch, seq, generator=g).masked_fill(~candidates, -1.0)
    masked_positions = scores.topk(predictions, dim=1).indices.sort(dim=1).values  # (B, P)
    labels = torch.gather(input_ids, 1, masked_positions)
    input_ids = input_ids.scatter(1, masked_positions, config.mask_token_id)
    full_labels = torch.full((batch, seq), IGNORE).scatter(1, masked_positions, labels)
    return dict(input_ids=input_ids, document_ids=document_ids, position_ids=position_ids,
                masked_positions=masked_positions, masked_lm_labels=labels, full_mlm_labels=full_labels)


def hf_masks(document_ids: torch.Tensor, half_window: int) -> dict[str, torch.Tensor]:
    """transformers' per-layer-kind boolean masks (B, 1, T, T) for packed rows."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    positions = torch.arange(document_ids.shape[1])
    near = (positions[:, None] - positions[None, :]).abs() <= half_window
    return {"full_attention": same[:, None], "sliding_attention": (same & near)[:, None]}


def hf_loss(model, batch):
    masks = hf_masks(batch["document_ids"], model.config.local_attention // 2)
    return model(input_ids=batch["input_ids"], attention_mask=masks, position_ids=batch["position_ids"],
                 labels=batch["full_mlm_labels"]).loss


def our_loss(model, batch):
    return model(input_ids=batch["input_ids"], document_ids=batch["document_ids"],
                 position_ids=batch["position_ids"], masked_positions=batch["masked_positions"],
                 masked_lm_labels=batch["masked_lm_labels"]).loss


def build(config: ModernBertConfig, seed: int, sparse_prediction: bool = False):
    import transformers
    torch.manual_seed(seed)
    hf_config = hf_config_from(config, attn_implementation="sdpa")
    hf_config.sparse_prediction = sparse_prediction
    hf = transformers.ModernBertForMaskedLM(hf_config)
    ours = from_hf_state_dict({k: v.detach().clone() for k, v in hf.state_dict().items()}, config)
    return hf, ours


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="modernbert_mini")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--documents", type=int, default=3, help="documents packed into a row")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per contender")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    import transformers
    config = ModernBertConfig.from_preset(args.preset, vocab_size=30522)
    batch = make_packed_batch(config, args.batch, args.seq, args.documents, args.seed)
    opt_kwargs = optimizer_kwargs()
    tokens = args.batch * args.seq   # every token real
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"config: {args.preset} {config}")
    print(f"batch: B={args.batch} T={args.seq}, {args.documents} documents a row, "
          f"{batch['masked_positions'].shape[1]} masked positions a row; AdamW {opt_kwargs}, clip 1.0")

    hf, ours = build(config, args.seed)
    hf_sparse = build(config, args.seed, sparse_prediction=True)[0]
    contenders = {"hf": (hf, hf_loss), "hf_sparse": (hf_sparse, hf_loss), "ours": (ours, our_loss)}
    state = {name: (model.train(), fn, make_optimizer(model, opt_kwargs), list(model.parameters()))
             for name, (model, fn) in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in state}
    losses: dict[str, list[float]] = {name: [] for name in state}
    for i in range(args.warmup + args.steps):
        for name, (model, fn, opt, params) in state.items():
            start = time.perf_counter()
            loss = train_step(model, fn, opt, params, batch)
            elapsed = time.perf_counter() - start
            if i < 2:
                losses[name].append(float(loss))
            if i >= args.warmup:
                times[name].append(elapsed)
    for step in range(2):   # the same weights and batch: the same losses, also after one optimizer step
        row = "  ".join(f"{name} {values[step]:.7f}" for name, values in losses.items())
        print(f"parity step {step + 1}: {row}")
    diff = max(abs(losses[name][s] - losses["hf"][s]) for name in losses for s in range(2))
    if diff > 1e-5:
        raise SystemExit(f"losses differ by {diff:.2e}")
    results = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        results[name] = tokens / median
        print(f"{name:10s} median step {median * 1000:8.1f} ms  (min {min(ts) * 1000:.1f}, max {max(ts) * 1000:.1f}, "
              f"n={len(ts)})  {results[name]:8.0f} real tokens/s")
    print(f"ratio ours / hf: {results['ours'] / results['hf']:.2f}x   "
          f"ours / hf_sparse: {results['ours'] / results['hf_sparse']:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
