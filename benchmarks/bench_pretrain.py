"""Convergence parity: our pre-training against transformers' BertForPreTraining, step by step, on real shards.

    python benchmarks/bench_pretrain.py            # BERT-mini, 300 steps of 32 sequences (about half an hour)
    python benchmarks/bench_pretrain.py --quick    # BERT-tiny, 50 steps of 8 (a few minutes)
    python benchmarks/bench_pretrain.py --shards <a static shard set> [--steps N] [--lr 3e-4] [--every 25]
    python benchmarks/bench_pretrain.py --figure benchmarks/figures/pretrain_parity.png   # also plot every step

What is compared, and why it is a fair comparison:
- Weights: our model.BertForPreTraining at its own initialisation (seeded), copied into transformers'
  BertForPreTraining (SDPA attention) by model.hf_conversion.to_hf_state_dict.
- Data: the same static-masked batches, made by the real data_prep job from the bundled sample corpus
  (data_prep/sample_corpus/books) and read by the trainer's own PretrainingDataset (shuffling, padding to a
  multiple of 8). Ours scores the masked positions (masked_positions, labels); transformers takes the same labels
  laid out (B, T), -100 elsewhere, as its examples feed it.
- Optimizer and schedule: both built by pipeline/core/optim/optimizers.py from the composed training config
  (`pipeline/train.py model=<preset> optimizer.lr=<lr> trainer.max_steps=<steps>`): AdamW with BERT's parameter
  groups (no decay on biases and LayerNorm), eps 1e-6, weight decay 0.01, linear warmup (30 steps) and decay; the
  config's gradient clipping (global norm 1.0, torch.nn.utils.clip_grad_norm_, as Lightning clips); fp32 (the CPU
  trainer's precision, 32-true).
- Dropout off on both sides (hidden and attention dropout 0): the two implementations draw their dropout masks
  from different RNG calls (ours torch.rand on the CPU, theirs bernoulli_), so with dropout on they would train on
  different masks and differ by sampling, not by arithmetic.
- Steps interleaved in one process at one thread count: step t of every side runs before step t + 1 of any, so
  a change of load on a shared machine reaches all sides alike. The wall-time ratio is the median step of each.

The tolerance: what fp32 rounding alone makes of the same training. A third side, the control, is our model again,
from the same weights, fed each batch with its rows in reverse order: mathematically the same step (the losses are
means over rows and masked positions), but every sum over the batch (the weight gradients, the means) adds in
another order, so it differs from ours by fp32 rounding only, as transformers' different but equivalent sequence
of operations does. Training can amplify such differences, so the control's gap to ours may grow over the run;
its running maximum is the envelope of numerical noise up to each step. Ours and transformers agree at step t when

    |ours - theirs| <= FACTOR * envelope_t + FLOOR_ULPS * eps32 * |ours|     (FACTOR 10, FLOOR_ULPS 16)

for the MLM loss, the NSP loss and the gradient norm, at every step. The second term, 16 units in the last place
of the value (eps32 * |x| is within a factor 2 of x's ulp), covers the steps where the control happens to round
alike while the two implementations' different operations round differently: one forward pass through separate
or fused matmuls, the MLM head at P or at T positions, a boolean or an additive mask, rounds each sum a few ulps
apart, and the measured step differences were 0-2 ulps. FACTOR covers transformers doing more operations
differently than a reordering does, once training has grown the rounding differences. A real discrepancy (another
schedule, a lost weight-decay group, a wrong mask) is not bounded by rounding and fails: --inject-lr-error checks
that a learning rate off by 1% does. The script exits 1 when any step disagrees.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import REPO_ROOT  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps   # 2**-23: the spacing of fp32 numbers in [1, 2)
FLOOR_ULPS = 16
FACTOR = 10.0
METRICS = ("mlm", "nsp", "grad_norm")
BUNDLED_BOOKS = REPO_ROOT / "data_prep" / "sample_corpus" / "books"
QUICK = {"preset": "tiny", "steps": 50, "batch": 8, "warmup": 10, "books": ("chesterton-ball.txt",), "dupe_factor": 1}
FULL = {"preset": "mini", "steps": 300, "batch": 32, "warmup": 30, "books": ("austen-emma.txt", "austen-persuasion.txt",
                                                                              "chesterton-ball.txt"), "dupe_factor": 2}


# ----------------------------------------------------------------------------------------------------------
# data

def build_shards(out: Path, books: tuple[str, ...], dupe_factor: int) -> Path:
    """Phase-1 shards (seq 128, 20 predictions, static masking, BERT's uncased vocabulary) of bundled books."""
    from tests.helpers.shard_sets import build_books_set

    build_books_set(out, [BUNDLED_BOOKS / name for name in books], f"dupe_factor={dupe_factor}")
    return out


def training_batches(shards: Path, batch_size: int, steps: int, seed: int, vocab_size: int):
    """`steps` batches of the trainer's own stream (one rank, in-process), epoch after epoch."""
    from pipeline.pretraining.data import PretrainingDataset, ShardSet

    shard_set = ShardSet.open(shards, max_seq_length=128, vocab_size=vocab_size)
    if shard_set.masking != "static":
        sys.exit(f"{shards} is masked dynamically; this comparison feeds static-masked batches "
                 "(data_prep masking=static)")
    dataset = PretrainingDataset(shard_set, batch_size, seed=seed)
    produced, epoch = 0, 0
    while produced < steps:
        dataset.set_epoch(epoch)
        for batch in dataset:
            yield batch
            produced += 1
            if produced == steps:
                return
        epoch += 1


def hf_mlm_labels(batch: dict) -> torch.Tensor:
    """(B, T) labels, -100 except at the masked positions: transformers' layout of the same targets. Padding slots
    (position 0, label -100) write -100 over [CLS], which is never masked."""
    labels = torch.full_like(batch["input_ids"], -100)
    return labels.scatter_(1, batch["masked_positions"], batch["masked_lm_labels"])


def reversed_rows(batch: dict) -> dict:
    return {key: value.flip(0) for key, value in batch.items()}


# ----------------------------------------------------------------------------------------------------------
# the sides

@dataclasses.dataclass
class Side:
    name: str
    model: torch.nn.Module
    losses: object               # callable(model, batch) -> (loss to train on, mlm loss, nsp loss)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    clip: float
    feed: object = None          # callable(batch) -> batch; None: as is
    seconds: list = dataclasses.field(default_factory=list)

    def step(self, batch: dict) -> dict[str, float]:
        """One training step, as Lightning's loop takes it with gradient_clip_val (norm)."""
        batch = self.feed(batch) if self.feed else batch
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss, mlm, nsp = self.losses(self.model, batch)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.seconds.append(time.perf_counter() - started)
        return {"mlm": float(mlm), "nsp": float(nsp), "grad_norm": float(norm)}


def our_losses(model, batch):
    # A batch whose rows all fill its width has no attention_mask (the collator drops it); None is "all tokens"
    # for both models.
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch.get("attention_mask"), masked_positions=batch["masked_positions"],
                masked_lm_labels=batch["masked_lm_labels"], next_sentence_labels=batch["next_sentence_labels"])
    return out.loss, out.mlm_loss.detach(), out.nsp_loss.detach()


def hf_losses(model, batch):
    """transformers' own loss (its sum of the two cross-entropies) to train on; its two parts recomputed from its
    logits by the same calls it makes, for the report."""
    labels = hf_mlm_labels(batch)
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch.get("attention_mask"), labels=labels,
                next_sentence_label=batch["next_sentence_labels"])
    with torch.no_grad():
        logits = out.prediction_logits
        mlm = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        nsp = F.cross_entropy(out.seq_relationship_logits.view(-1, 2), batch["next_sentence_labels"].view(-1))
    return out.loss, mlm, nsp


def training_config(preset: str, steps: int, lr: float, warmup: int):
    """The trainer's config for this run (what `python pipeline/train.py` would compose), dropout off."""
    from pipeline.core.app import compose

    return compose("train", [f"model={preset}", "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
                             f"optimizer.lr={lr}", f"trainer.max_steps={steps}", f"scheduler.warmup_steps={warmup}"])


def build_sides(cfg, steps: int, seed: int, lr_error: float) -> tuple[list[Side], float]:
    """ours, transformers and the control, from one initialisation; returns them and the largest difference of
    their initial MLM logits (transformers vs ours) on a probe batch."""
    import transformers
    from omegaconf import OmegaConf

    from model import BertForPreTraining
    from model.bert.hf_conversion import hf_config_from, to_hf_state_dict
    from pipeline.core.optim.optimizers import build_optimizer, build_scheduler
    from pipeline.pretraining.checks import model_config_of

    config = model_config_of(cfg)
    optimizer_cfg = OmegaConf.to_container(cfg.optimizer, resolve=True)
    scheduler_cfg = OmegaConf.to_container(cfg.scheduler, resolve=True)
    if str(cfg.trainer.precision) != "32-true" or cfg.trainer.gradient_clip_algorithm != "norm":
        sys.exit(f"expected the CPU trainer's fp32 and norm clipping, got {cfg.trainer.precision}, "
                 f"{cfg.trainer.gradient_clip_algorithm}")
    clip = float(cfg.trainer.gradient_clip_val)

    torch.manual_seed(seed)
    ours = BertForPreTraining(config)
    control = BertForPreTraining(config)
    control.load_state_dict(ours.state_dict())
    hf = transformers.BertForPreTraining(hf_config_from(config, attn_implementation="sdpa"))
    hf.load_state_dict({k: v.detach().clone() for k, v in to_hf_state_dict(ours).items()})

    def side(name, model, losses, feed=None, lr_scale=1.0):
        model.train()
        optimizer = build_optimizer(model, {**optimizer_cfg, "lr": float(optimizer_cfg["lr"]) * lr_scale})
        return Side(name, model, losses, optimizer, build_scheduler(optimizer, scheduler_cfg, steps), clip, feed)

    sides = [side("ours", ours, our_losses), side("transformers", hf, hf_losses, lr_scale=1.0 + lr_error),
             side("control", control, our_losses, feed=reversed_rows)]
    groups = {s.name: [(g["weight_decay"], sum(p.numel() for p in g["params"])) for g in s.optimizer.param_groups]
              for s in sides}
    if groups["ours"] != groups["transformers"]:
        sys.exit(f"the parameter groups differ: ours {groups['ours']}, transformers {groups['transformers']}")
    return sides, groups["ours"]


# ----------------------------------------------------------------------------------------------------------
# agreement

def allowed(envelope: float, value: float) -> float:
    return FACTOR * envelope + FLOOR_ULPS * EPS32 * abs(value)


def agreement(history: list[dict]) -> dict:
    """Per metric: the largest |ours - transformers| (absolute, relative to ours, and as a share of the allowed
    difference), the control's, and the steps where the two implementations disagree."""
    result = {}
    for metric in METRICS:
        envelope, worst = 0.0, {"abs": 0.0, "rel": 0.0, "of_allowed": 0.0, "step": 0, "control_abs": 0.0}
        failures, gaps = [], []
        for row in history:
            ours = row["ours"][metric]
            envelope = max(envelope, abs(row["control"][metric] - ours))
            gap = abs(row["transformers"][metric] - ours)
            gaps.append(gap)
            share = gap / allowed(envelope, ours)
            worst["abs"] = max(worst["abs"], gap)
            worst["rel"] = max(worst["rel"], gap / max(abs(ours), 1e-30))
            worst["control_abs"] = envelope
            if share > worst["of_allowed"]:
                worst["of_allowed"], worst["step"] = share, row["step"]
            if not math.isfinite(share) or share > 1.0:
                failures.append(row["step"])
        result[metric] = {**worst, "mean_abs": statistics.fmean(gaps), "failures": failures}
    return result


HEADER = (f"{'step':>5} {'lr':>9} | {'MLM ours':>10} {'MLM HF':>10} {'|diff|':>8} {'control':>8} | "
          f"{'NSP ours':>9} {'NSP HF':>9} {'|diff|':>8} {'control':>8} | {'grad norm |diff|':>16}")


def table_row(row: dict) -> str:
    """One step; `control` is |control - ours|, the numerical noise of that step."""
    o, h, c = row["ours"], row["transformers"], row["control"]
    return (f"{row['step']:>5} {row['lr']:>9.2e} | {o['mlm']:>10.6f} {h['mlm']:>10.6f} "
            f"{abs(h['mlm'] - o['mlm']):>8.1e} "
            f"{abs(c['mlm'] - o['mlm']):>8.1e} | {o['nsp']:>9.6f} {h['nsp']:>9.6f} {abs(h['nsp'] - o['nsp']):>8.1e} "
            f"{abs(c['nsp'] - o['nsp']):>8.1e} | {abs(h['grad_norm'] - o['grad_norm']):>16.1e}")


def plot(history: list[dict], path: Path, title: str) -> None:
    """Per objective: both sides' loss (top) and, log-scaled, |transformers - ours| beside |control - ours| (bottom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in history]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    for column, (metric, label) in enumerate((("mlm", "MLM loss"), ("nsp", "NSP loss"))):
        top, bottom = axes[0][column], axes[1][column]
        for side, style in (("ours", "-"), ("transformers", "--")):
            top.plot(steps, [row[side][metric] for row in history], style, label=side)
        top.set_title(label)
        top.legend()
        for side, colour in (("transformers", "C1"), ("control", "C2")):
            gaps = [max(abs(row[side][metric] - row["ours"][metric]), 1e-9) for row in history]
            bottom.semilogy(steps, gaps, ".", color=colour, markersize=3,
                            label=f"|{side} - ours|" + (" (reordered rows: fp32 noise)" if side == "control" else ""))
        bottom.set_xlabel("optimizer step")
        bottom.set_ylabel("absolute difference (1e-9 = equal)")
        bottom.legend(fontsize=8)
    fig.suptitle(f"Convergence parity with transformers' BertForPreTraining: {title}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


def stop_early(signum, frame):
    """SIGTERM as Ctrl-C: a run in the background (where SIGINT is ignored) can be stopped with its summary."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['preset']}, {QUICK['steps']} steps of "
                        f"{QUICK['batch']}, one bundled book (a few minutes)")
    parser.add_argument("--preset", help=f"model preset (default {FULL['preset']}; --quick {QUICK['preset']})")
    parser.add_argument("--steps", type=int,
                        help=f"optimizer steps (default {FULL['steps']}; --quick {QUICK['steps']})")
    parser.add_argument("--batch", type=int,
                        help=f"sequences per step (default {FULL['batch']}; --quick {QUICK['batch']})")
    parser.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4: BERT-mini leaves the "
                        "unigram plateau within the run's 300 steps; at 1e-3 it stays on it, "
                        "studies/pretraining_pays/README.md)")
    parser.add_argument("--shards", type=Path, help="a static-masked shard set at seq 128 (default: made from the "
                        "bundled books with data_prep, in a temporary directory)")
    parser.add_argument("--every", type=int, default=25, help="print a table row every N steps")
    parser.add_argument("--threads", type=int, help="torch threads of every side (default 2; --quick 1: a check "
                        "meant for a shared CI runner)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", type=Path, help="also plot the losses and |ours - transformers| at every step "
                        "against the control's noise into this image (PNG)")
    parser.add_argument("--inject-lr-error", type=float, default=0.0, metavar="FRACTION",
                        help="a check of the check: give transformers' side a learning rate off by this fraction "
                             "(e.g. 0.01); the comparison must then fail")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    preset, steps, batch_size = args.preset or size["preset"], args.steps or size["steps"], args.batch or size["batch"]

    torch.set_num_threads(args.threads or (1 if args.quick else 2))
    import transformers
    print("command: python benchmarks/bench_pretrain.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, "
          f"threads {torch.get_num_threads()}, CPU cores {os.cpu_count()}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cfg = training_config(preset, steps, args.lr, min(size["warmup"], steps - 1))
    sides, groups = build_sides(cfg, steps, args.seed, args.inject_lr_error)
    print(f"model {preset} (dropout 0 on every side), {steps} steps of {batch_size} sequences, fp32; "
          f"optimizer {cfg.optimizer.name} lr {args.lr:g} eps {cfg.optimizer.eps} weight decay "
          f"{cfg.optimizer.weight_decay}, groups (weight decay, parameters) {groups}; warmup "
          f"{cfg.scheduler.warmup_steps} steps then linear decay to 0 at step {steps}; "
          f"clip {cfg.trainer.gradient_clip_val}")
    if args.inject_lr_error:
        print(f"INJECTED ERROR: transformers' learning rate x {1 + args.inject_lr_error:g}")

    with tempfile.TemporaryDirectory() as tmp:
        shards = args.shards
        if shards is None:
            started = time.perf_counter()
            shards = build_shards(Path(tmp) / "shards", size["books"], size["dupe_factor"])
            print(f"shards: data_prep phase1 (static masking, dupe_factor {size['dupe_factor']}) of "
                  f"{', '.join(size['books'])} in {time.perf_counter() - started:.0f} s")
        history = []
        signal.signal(signal.SIGTERM, stop_early)
        try:
            for step, batch in enumerate(training_batches(shards, batch_size, steps, args.seed,
                                                          sides[0].model.config.vocab_size), start=1):
                lr = sides[0].optimizer.param_groups[0]["lr"]
                order = sides if step % 2 else [sides[1], sides[0], sides[2]]   # neither side always runs first
                row = {"step": step, "lr": lr, **{side.name: side.step(batch) for side in order}}
                history.append(row)
                if step == 1:
                    print("\n" + HEADER)
                if step in (1, steps) or step % args.every == 0:
                    print(table_row(row), flush=True)
        except KeyboardInterrupt:   # Ctrl-C or kill (SIGTERM) on a slow machine: keep what the finished steps measured
            print(f"\nINTERRUPTED after step {len(history)} of {steps}: "
                  "the figures below cover the finished steps only")
            if history and history[-1]["step"] % args.every:
                print(table_row(history[-1]))
    if not history:
        return 2
    result = agreement(history)
    if args.figure:
        plot(history, args.figure, f"{preset}, {len(history)} of {steps} steps of {batch_size}, lr {args.lr:g}, fp32")
    print(f"\nover all {len(history)} steps (allowed |diff| at a step: {FACTOR:g} x control envelope + "
          f"{FLOOR_ULPS} x eps32 "
          f"x |ours|, eps32 = {EPS32:.3g}):")
    for metric, r in result.items():
        print(f"  {metric:9s} max |ours - transformers| {r['abs']:.2e} (relative {r['rel']:.2e}), mean "
              f"{r['mean_abs']:.2e}; control envelope "
              f"at the end {r['control_abs']:.2e}; largest share of the allowed difference {r['of_allowed']:.2f} "
              f"(step {r['step']}); steps outside: {len(r['failures'])}")
    times = {side.name: statistics.median(side.seconds[1:] or side.seconds) for side in sides}
    print(f"median step (first excluded): ours {times['ours'] * 1000:.0f} ms, transformers "
          f"{times['transformers'] * 1000:.0f} ms: wall-time ratio ours / transformers "
          f"{times['ours'] / times['transformers']:.2f} "
          f"(transformers takes {times['transformers'] / times['ours']:.2f}x ours), "
          f"{torch.get_num_threads()} threads each")
    failed = [metric for metric, r in result.items() if r["failures"]]
    if failed:
        print(f"DISAGREE: {', '.join(failed)} outside numerical noise (first at step "
              f"{min(min(result[m]['failures']) for m in failed)})")
        return 1
    print(f"AGREE: MLM, NSP and gradient norm within numerical noise at every one of the {len(history)} steps")
    return 0 if len(history) == steps else 2   # an interrupted run agreed so far, but is not the whole comparison


if __name__ == "__main__":
    sys.exit(main())
