"""One BERT pre-training step on the CPU: our model/ against transformers.BertForPreTraining (SDPA attention).

    python benchmarks/bench_train_step.py [--preset mini] [--batch 32] [--seq 128] [--steps 10] [--warmup 3]
                                          [--threads 2] [--compile | --compare-compile] [--short-fraction F]
                                          [--skip-hf] [--profile]

Both models are built from one config and hold the same weights (transformers' random init, loaded into ours
with model.hf_conversion.from_hf_state_dict). A step is forward, backward, gradient clipping to 1.0 and a torch
AdamW step (lr 1e-4, eps 1e-6 as in BERT, weight decay 0.01 except on biases and LayerNorm parameters; fused if
it runs on the CPU, else foreach), with the same settings on both sides. transformers scores all T positions against the
vocabulary with (B, T) MLM labels (-100 where nothing is predicted); ours takes masked_positions (B, P) and
labels (B, P) and scores the P masked positions only.

The batch looks like BERT phase-1 input: most rows full, a few shorter ones padded (attention_mask 0; a share of
--short-fraction, default 1/8), two segments per row (token types 0 then 1), 20 masked positions per full row (fewer on
a short row: 15% of its tokens, the rest of the 20 slots padding with label -100), and NSP labels. With
--short-fraction 0 every row is full and ours gets no attention mask, as the pipeline's collator sends none then.

--compile compiles our model as model.compile=true does (the whole model, in place); --compare-compile times
our model eager and compiled side by side and prints the ratio compiled / eager.

Before timing, a parity check with dropout off (config copies with dropout 0, same weights): the losses of two
consecutive training steps, so the second also checks the gradients and the optimizer update. The timed steps
run in training mode with dropout on. tokens/s counts B * T tokens per step, padding included. The steps of
the two models alternate, so a change of load on this shared machine hits both; the figure is the median.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn as nn

from model import BertConfig  # noqa: E402
from model.bert.hf_conversion import from_hf_state_dict, hf_config_from  # noqa: E402
from pipeline.pretraining.compiled import apply_compile_settings  # noqa: E402

CLS_ID, SEP_ID, PAD_ID, MASK_ID = 101, 102, 0, 103
IGNORE = -100


def make_batch(vocab_size: int, batch: int, seq: int, max_predictions: int, seed: int,
               short_fraction: float = 0.125) -> dict:
    """A phase-1-like batch; full_mlm_labels is the (B, T) layout transformers takes."""
    g = torch.Generator().manual_seed(seed)
    num_short = round(batch * short_fraction)
    lengths = [seq] * batch
    for row in torch.randperm(batch, generator=g)[:num_short].tolist():
        lengths[row] = int(torch.randint(seq // 4, seq, (1,), generator=g))
    input_ids = torch.full((batch, seq), PAD_ID, dtype=torch.long)
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq, dtype=torch.long)
    masked_positions = torch.zeros(batch, max_predictions, dtype=torch.long)
    masked_lm_labels = torch.full((batch, max_predictions), IGNORE, dtype=torch.long)
    full_mlm_labels = torch.full((batch, seq), IGNORE, dtype=torch.long)
    for b, n in enumerate(lengths):
        # [CLS] A [SEP] B [SEP]
        sep_a = int(torch.randint(2, n - 2, (1,), generator=g))
        input_ids[b, :n] = torch.randint(1000, vocab_size, (n,), generator=g)
        input_ids[b, 0], input_ids[b, sep_a], input_ids[b, n - 1] = CLS_ID, SEP_ID, SEP_ID
        token_type_ids[b, sep_a + 1:n] = 1
        attention_mask[b, :n] = 1
        candidates = torch.tensor([i for i in range(1, n - 1) if i != sep_a])
        k = max_predictions if n == seq else min(max_predictions, max(1, round(0.15 * n)))
        positions = torch.sort(candidates[torch.randperm(len(candidates), generator=g)[:k]]).values
        labels = input_ids[b, positions].clone()
        input_ids[b, positions] = MASK_ID  # (all [MASK]: the 80/10/10 rule changes no cost)
        masked_positions[b, :k] = positions
        masked_lm_labels[b, :k] = labels
        full_mlm_labels[b, positions] = labels
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                masked_positions=masked_positions, masked_lm_labels=masked_lm_labels,
                full_mlm_labels=full_mlm_labels,
                next_sentence_labels=torch.randint(0, 2, (batch,), generator=g), lengths=lengths)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on everything but biases and LayerNorm parameters (named differently by the two models,
    hence by module type). A tied parameter is listed once."""
    no_decay = set()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    decay, rest = [], []
    for name, p in model.named_parameters():  # deduplicated: the tied decoder weight appears once
        (rest if id(p) in no_decay or name.endswith("bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def optimizer_kwargs() -> dict:
    probe = nn.Linear(2, 2)
    try:
        opt = torch.optim.AdamW(probe.parameters(), lr=1e-4, fused=True)
        probe(torch.ones(1, 2)).sum().backward()
        opt.step()
        return {"fused": True}
    except (RuntimeError, ValueError):
        return {"foreach": True}


def make_optimizer(model: nn.Module, kwargs: dict) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, **kwargs)


def hf_loss(model, batch):
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["full_mlm_labels"],
                 next_sentence_label=batch["next_sentence_labels"]).loss


def our_loss(model, batch):
    no_padding = all(n == batch["input_ids"].shape[1] for n in batch["lengths"])   # the collator sends no mask then
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=None if no_padding else batch["attention_mask"],
                 masked_positions=batch["masked_positions"],
                 masked_lm_labels=batch["masked_lm_labels"], next_sentence_labels=batch["next_sentence_labels"]).loss


def train_step(model, loss_fn, optimizer, params, batch) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss.detach()


def build(config: BertConfig, seed: int):
    import transformers
    torch.manual_seed(seed)
    hf = transformers.BertForPreTraining(hf_config_from(config, attn_implementation="sdpa"))
    assert hf.config._attn_implementation == "sdpa"
    ours = from_hf_state_dict({k: v.detach().clone() for k, v in hf.state_dict().items()}, config)
    return hf, ours


def parity(config: BertConfig, batch: dict, opt_kwargs: dict, seed: int) -> list[tuple[float, float]]:
    """fp32 losses of two consecutive training steps of both models with dropout 0 (same weights)."""
    hf, ours = build(dataclasses.replace(config, hidden_dropout=0.0, attention_dropout=0.0), seed)
    losses = []
    opts = [make_optimizer(hf, opt_kwargs), make_optimizer(ours, opt_kwargs)]
    for _ in range(2):
        pair = []
        for model, fn, opt in ((hf, hf_loss, opts[0]), (ours, our_loss, opts[1])):
            model.train()
            pair.append(float(train_step(model, fn, opt, list(model.parameters()), batch)))
        losses.append(tuple(pair))
    return losses


def profile(name, model, fn, opt, batch, rows: int = 10) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    params = list(model.parameters())
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            train_step(model, fn, opt, params, batch)
    print(f"\n--- profile: {name} (2 steps, self CPU time; load average {os.getloadavg()[0]:.2f}) ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="our model compiled, as model.compile=true")
    parser.add_argument("--compare-compile", action="store_true",
                        help="time ours eager and ours compiled side by side (ratio compiled / eager)")
    parser.add_argument("--short-fraction", type=float, default=0.125,
                        help="share of short (padded) rows; 0: no padding, no attention mask for ours")
    parser.add_argument("--skip-hf", action="store_true", help="time ours only (no ratio)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of both")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    import transformers
    config = BertConfig.from_preset(args.preset)
    batch = make_batch(config.vocab_size, args.batch, args.seq, args.max_predictions, args.seed, args.short_fraction)
    opt_kwargs = optimizer_kwargs()
    B, T = args.batch, args.seq
    short = sorted(n for n in batch["lengths"] if n < T)
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"config: {args.preset} {config}")
    print(f"batch: B={B} T={T}, {B - len(short)} full rows, short rows of lengths {short}; "
          f"{int((batch['masked_lm_labels'] != IGNORE).sum())} masked positions in {args.max_predictions} slots/row; "
          f"AdamW(lr 1e-4, wd 0.01, {opt_kwargs}), clip 1.0; compile={args.compile}, "
          f"compare-compile={args.compare_compile}")

    # Parity with dropout off.
    losses = parity(config, batch, opt_kwargs, args.seed)
    for step, (theirs, mine) in enumerate(losses, 1):
        print(f"parity step {step} (dropout 0): HF loss {theirs:.7f}  ours {mine:.7f}  |diff| {abs(theirs - mine):.2e}")
    diff = max(abs(a - b) for a, b in losses)
    if diff > 1e-5:
        raise SystemExit(f"losses differ by {diff:.2e}")

    # Timing with dropout on.
    hf, ours = build(config, args.seed)
    hf.train(), ours.train()
    apply_compile_settings(ours, {"compile": args.compile})
    contenders = {"hf": (hf, hf_loss), "ours": (ours, our_loss)}
    if args.compare_compile:   # a second copy of our model, the same weights, its encoder compiled
        compiled = build(config, args.seed)[1].train()
        apply_compile_settings(compiled, {"compile": True})
        contenders["compiled"] = (compiled, our_loss)
    if args.skip_hf:
        del contenders["hf"]
    state = {name: (model, fn, make_optimizer(model, opt_kwargs), list(model.parameters()))
             for name, (model, fn) in contenders.items()}
    times = {name: [] for name in state}
    cpu_times = {name: [] for name in state}
    for i in range(args.warmup + args.steps):
        for name, (model, fn, opt, params) in state.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            train_step(model, fn, opt, params, batch)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            if i >= args.warmup:
                times[name].append(elapsed)
                cpu_times[name].append(cpu)
            elif i == 0:
                print(f"first step {name}: {elapsed:.2f} s")
    results = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        results[name] = B * T / median
        # CPU time (all threads) is less sensitive than wall time to other processes on a shared machine.
        print(f"{name:8s} median step {median * 1000:8.1f} ms  (min {min(ts) * 1000:.1f}, max {max(ts) * 1000:.1f}, "
              f"n={len(ts)})  {results[name]:8.0f} tokens/s (B*T, padding included);  "
              f"CPU time/step {statistics.median(cpu_times[name]) * 1000:.0f} ms")
    if "hf" in results:
        print(f"ratio ours / hf: {results['ours'] / results['hf']:.2f}x")
    if "compiled" in results:
        print(f"ratio compiled / eager (ours): {results['compiled'] / results['ours']:.2f}x")
        if "hf" in results:
            print(f"ratio compiled / hf: {results['compiled'] / results['hf']:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    if args.profile:
        for name, (model, fn, opt, _params) in state.items():
            profile(name, model, fn, opt, batch)


if __name__ == "__main__":
    main()
