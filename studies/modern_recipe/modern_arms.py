"""The arms of protocol.md: what each pre-trains (recipe and overrides), its budget from its own measured speed, its
runs, and the pairing that fine-tunes each run against its random twin.

    build_data(out, shared_data, quick)    the general corpus (second check), BERT-tiny's 15% shard sets, the modern
                                           arm's packed 30% training set
    calibrate_arms(out, arms, quick)       steps per minute of each arm as it trains (out/calibration.json)
    pretrain(out, arm, run, quick)         one pre-training run of 120 minutes' steps (resumable)
    pairing(out, arm, run, quick)          that run against its random twin on CELLS

Everything that does the job in studies/pretraining_pays/ is imported from there (earlier_study puts it on the path):
build_corpora with the second protocol's SecondCheck, shard_sets, train_for, budget_steps, run_pairing.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import earlier_study  # noqa: F401  (the first studies' modules on the path)
from benchmarks_common import metrics_rows
from study_corpora import (
    BEAM_ARGS,
    PREDICTIONS_PER_SEQ,
    QUICK_BEAM_ARGS,
    _data_prep,
    build_corpora,
    is_quick,
    shard_set_name,
    shard_sets,
)
from study_decontamination import SecondCheck
from study_evidence import GENERAL_RECIPE, exit_step, finetune_seeds
from study_pairing import Pairing
from study_recipe import CALIBRATION_SKIP, CALIBRATION_WINDOW, budget_steps, shape_key, train_for, wait_until_quiet
from study_results import finetune_root

CORPUS = "general"
VOCAB, SEQ = 8000, 128                  # the general corpus's own WordPiece (the first study's choice) at length 128
MODERN_MASKING, MODERN_PREDICTIONS = 0.3, 38   # round(128 x 0.3) = 38 masked positions a full packed row
MINUTES = 120
CALIBRATION_STEPS = 60                  # the first study's: the fastest 5-step window after the first 10
QUICK_CALIBRATION_STEPS = 12
QUICK_MINUTES = 0.1                     # the quick chain: a few dozen steps
# The cells every run is fine-tuned on, as the second protocol's general-text arm (study_evidence.REMEDY_CELLS):
# STS-B on its full training set (the first study's (b)), SST-2 at 1,000 labels.
CELLS = (("stsb", "full"), ("sst2", 1000))
PRIMARY_CELL = ("stsb", "full")


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str                  # "modern" or "tiny"
    recipe: dict               # study_recipe's {model, vocab, seq, objective, lr}
    runs: tuple[int, ...]      # pre-training seeds
    quick_runs: tuple[int, ...]
    modern: bool               # the modern recipe's optimizer, schedule and 30% packed set

    def run_name(self, run: int) -> str:
        return f"{self.name}_{MINUTES}_p{run}"

    def random_name(self, run: int) -> str:
        return f"random_{self.name}_p{run}"

    def seeds(self, quick: bool) -> tuple[int, ...]:
        return self.quick_runs if quick else self.runs


# (1) ModernBERT-tiny (model/modernbert/config.py PRESETS: 3 layers, hidden 128, 2 heads, GeGLU 192) at the preset's
# rate; (2) BERT-tiny with the first study's general recipe as recorded (record/search/general/choice.json).
MODERN = Arm("modern", {"model": "modernbert_tiny", "vocab": VOCAB, "seq": SEQ, "objective": "mlm", "lr": 1e-3},
             runs=(1, 2, 3), quick_runs=(1, 2), modern=True)
TINY = Arm("tiny", dict(GENERAL_RECIPE), runs=(1, 2), quick_runs=(1,), modern=False)
ARMS = {arm.name: arm for arm in (MODERN, TINY)}
# The order of the runs: a pair of arms at the same seed first, so a study stopped early has a matched pair.
ORDER = (("modern", 1), ("tiny", 1), ("modern", 2), ("tiny", 2), ("modern", 3))
QUICK_ORDER = (("modern", 1), ("tiny", 1), ("modern", 2))

# The modern recipe past study_recipe's overrides (+experiment=cpu_hour, the recipe's model, vocabulary, rate, data,
# batch 32, seed): StableAdamW at its preset (betas 0.9/0.98, eps 1e-6, decoupled weight decay 1e-5), warmup over 6%
# of the steps (BERT-tiny's share, so the two schedules differ in their shape after it, not in its length), the peak
# held, a 1-sqrt decay to 0 over the last 20%; no batch warm-up (its batch is 32 rows from the first step).
MODERN_OVERRIDES = ("optimizer=stable_adamw", "scheduler=warmup_stable_decay", "scheduler.warmup_steps=null",
                    "scheduler.warmup_fraction=0.06", "scheduler.decay_steps=null", "scheduler.decay_fraction=0.2",
                    "scheduler.decay_shape=1-sqrt", "scheduler.min_lr_ratio=0.0", "data.batch_warmup.tokens=0",
                    f"data.max_predictions_per_seq={MODERN_PREDICTIONS}")


def parameter_counts(arm: Arm) -> dict[str, int]:
    """The arm's pre-training model as instantiated (tied decoder counted once): all parameters, and the embedding's
    (token embeddings and the embedding norm; BERT's position and token-type tables too)."""
    from model.architectures import config_from_preset, pretraining_model

    model = pretraining_model(config_from_preset(arm.recipe["model"], vocab_size=arm.recipe["vocab"]),
                              arm.recipe["objective"] == "mlm_nsp")
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for name, p in model.named_parameters() if ".embeddings." in f".{name}")
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def modern_shard_set(out: Path) -> Path:
    """The general corpus's training side packed into 128-token rows with each document's start (objective=mlm),
    masked 30% by the loader (dynamic), with the 8,000-piece vocabulary of BERT-tiny's set pinned: the same rows as
    that set, only the masking rate and its 38 positions differ."""
    train = out / "shards" / f"{CORPUS}_v{VOCAB}_s{SEQ}_mlm30" / "train"
    if not (train / "manifest.json").exists():
        tiny_train, _ = shard_sets(out, CORPUS, VOCAB, SEQ, "mlm")
        _data_prep([f"inputs=[{{path: '{out / 'corpora' / CORPUS}/train/*.jsonl', format: jsonl}}]",
                    f"output_dir={train}", "preset=phase1", "objective=mlm", "masking=dynamic", "dupe_factor=1",
                    f"max_seq_length={SEQ}", f"masked_lm_prob={MODERN_MASKING}",
                    f"max_predictions_per_seq={MODERN_PREDICTIONS}", f"vocab.file={tiny_train / 'vocab.txt'}",
                    *(QUICK_BEAM_ARGS if is_quick(out) else BEAM_ARGS)], is_quick(out))
    return train


# The vocabulary, once trained, kept in the record and pinned from then on. WordPiece training is not deterministic:
# three trainings on the quick chain's corpus in three processes gave three vocabularies (the same 8,000 pieces but
# for a few ties, in another order), so a sitting on a new machine that trained it again would tokenize the later
# runs and the held-out set differently from the earlier ones.
PINNED_VOCAB = Path("vocab") / f"{CORPUS}_v{VOCAB}.txt"


def _pinned_tiny_sets(out: Path, vocab_file: Path) -> None:
    """BERT-tiny's (general, 8,000, 128, MLM-only) sets where study_corpora.shard_sets puts them, with its arguments
    (it has no way to take a vocabulary for a set that would train one), the vocabulary pinned; shard_sets then finds
    them made."""
    root = out / "shards" / shard_set_name(CORPUS, VOCAB, SEQ, "mlm")
    text = out / "corpora" / CORPUS
    common = ["preset=phase1", f"max_seq_length={SEQ}", f"max_predictions_per_seq={PREDICTIONS_PER_SEQ[SEQ]}",
              "objective=mlm", "dupe_factor=1", f"vocab.file={vocab_file}",
              *(QUICK_BEAM_ARGS if is_quick(out) else BEAM_ARGS)]
    for side, masking in (("train", ["masking=dynamic"]), ("heldout", ["masking=static", "num_shards=1"])):
        if not (root / side / "manifest.json").exists():
            _data_prep([f"inputs=[{{path: '{text}/{side}/*.jsonl', format: jsonl}}]", f"output_dir={root / side}",
                        *masking, *common], is_quick(out))


def build_data(out: Path, shared_data: Path, quick: bool) -> dict[str, Path]:
    """The corpora as the second protocol builds them (its decontamination; build_corpora makes the domain corpus
    too, unused here), then the shard sets both arms read, on the recorded vocabulary where there is one."""
    build_corpora(shared_data, out, quick, check=SecondCheck)
    pinned = out / PINNED_VOCAB
    if pinned.is_file():
        _pinned_tiny_sets(out, pinned)
    train, heldout = shard_sets(out, CORPUS, VOCAB, SEQ, "mlm")
    if not pinned.is_file():
        pinned.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(train / "vocab.txt", pinned)
    for made in (train, heldout):
        if (made / "vocab.txt").read_bytes() != pinned.read_bytes():
            raise RuntimeError(f"{made} was made with another vocabulary than the recorded {pinned}: remove the "
                               "shard sets and run the data stage again")
    return {"tiny_train": train, "heldout": heldout, "modern_train": modern_shard_set(out)}


def overrides(out: Path, arm: Arm) -> tuple[str, ...]:
    """What follows study_recipe's overrides for this arm (last wins): the modern arm's recipe and training set."""
    if not arm.modern:
        return ()
    return (*MODERN_OVERRIDES, f"data.path={modern_shard_set(out)}")


def calibrate_arms(out: Path, arms: list[Arm], quick: bool) -> dict[str, float]:
    """Steps per minute of each arm's shape, measured as the arm trains (its optimizer, masking and rows; 2 threads),
    on a quiet machine: the first study's rule (the fastest 5-step window of 60 steps, the first 10 left out).
    Written to out/calibration.json in study_recipe's format, so budget_steps reads it."""
    path = out / "calibration.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    for arm in arms:
        key = shape_key(arm.recipe)
        if key in result:
            continue
        load_before = os.getloadavg()[0] if quick else wait_until_quiet()
        run_dir = out / "calibration" / key
        shutil.rmtree(run_dir, ignore_errors=True)   # a measurement is whole or made again
        steps = QUICK_CALIBRATION_STEPS if quick else CALIBRATION_STEPS
        train_for(out, CORPUS, arm.recipe, run_dir, steps, checkpoints=False, validations=1,
                  extra=(*overrides(out, arm), "scheduler.warmup_steps=2", "scheduler.warmup_fraction=null",
                         f"trainer.log_every_n_steps={CALIBRATION_WINDOW}", "validation.max_batches=1",
                         "export.hf=false", "export.plot=false"))
        skip = 2 if quick else CALIBRATION_SKIP
        rates = [float(row["perf/sequences_per_s"]) for row in metrics_rows(run_dir)
                 if row.get("perf/sequences_per_s") and int(row["step"]) >= skip]
        batch = arm.recipe.get("batch", 32)
        result[key] = {"steps_per_minute": 60 * max(rates) / batch, "load_before": load_before,
                       "measured": time.strftime("%Y-%m-%d %H:%M"), "arm": arm.name}
        print(f"calibrate {arm.name} ({key}): {result[key]['steps_per_minute']:.1f} steps/min "
              f"(load {load_before:.1f})", flush=True)
        path.write_text(json.dumps(result, indent=1))
    return {key: value["steps_per_minute"] for key, value in result.items()}


def budget(out: Path, arm: Arm, quick: bool) -> int:
    return budget_steps(out, arm.recipe, QUICK_MINUTES if quick else MINUTES)


def pretrain(out: Path, arm: Arm, run: int, quick: bool) -> dict:
    """One run of the arm at pre-training seed `run` (resumed from its newest checkpoint); its DONE record."""
    name = arm.run_name(run)
    steps = budget(out, arm, quick)
    done = train_for(out, CORPUS, arm.recipe, out / "pretrain" / name, steps, checkpoints=True, seed=run,
                     extra=overrides(out, arm))
    print(f"{name}: {steps} steps, held-out MLM accuracy {done['heldout_mlm_acc']:.4f}, plateau exit at step "
          f"{exit_step(metrics_rows(out / 'pretrain' / name))}", flush=True)
    return done


def random_twin_export(like: Path, seed: int, target: Path) -> Path:
    """The initialisation of `like`'s architecture (BERT's or ModernBERT's own), drawn with torch seed `seed`,
    exported with `like`'s tokenizer, once (written aside and renamed). study_tasks.random_export does this for BERT
    only."""
    import torch

    from model.architectures import pretraining_model
    from pipeline.core.checkpoints.weights import load_pretrained
    from pipeline.pretraining.export import export_pretraining_hf

    if (target / "config.json").is_file():
        return target
    pretrained = load_pretrained(like)
    torch.manual_seed(seed)
    model = pretraining_model(pretrained.config, pretrained.has_next_sentence_head)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    export_pretraining_hf(model, partial, pretrained.tokenizer_source)
    os.replace(partial, target)
    return target


@dataclasses.dataclass(frozen=True)
class TwinPairing(Pairing):
    """study_pairing.Pairing whose random arm is drawn in the pre-trained arm's own architecture."""

    def weights(self, arm: str, seed: int, out: Path) -> Path:
        if arm == self.pretrained:
            return self.export
        torch_seed = self.random_seed(seed)
        return random_twin_export(self.export, torch_seed, finetune_root(out) / arm / "init" / f"seed{torch_seed}")


QUICK_FINETUNE_SEEDS = 2     # the quick chain: the first two of each run's nested seeds


def pairing(out: Path, arm: Arm, run: int, quick: bool) -> Pairing:
    """The run against its random twin: fine-tuning seeds nested in the run (1-5, 6-10, 11-15, as the second
    protocol's), the twin's encoder for seed f drawn with torch seed 100 x run + f."""
    seeds = finetune_seeds(run)[:QUICK_FINETUNE_SEEDS] if quick else finetune_seeds(run)
    return TwinPairing(arm.run_name(run), arm.random_name(run), out / "pretrain" / arm.run_name(run) / "hf_export",
                       seeds, lambda seed: 100 * run + seed, CELLS,
                       f"{arm.run_name(run)} against its random twin (studies/modern_recipe/protocol.md)")
