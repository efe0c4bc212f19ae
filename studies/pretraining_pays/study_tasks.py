"""The downstream comparison of the study for one arm (study_protocol.md, section 4).

    run_arm(arm, shared_data, out, seeds=(1, 2, 3, 4, 5), quick=False, overrides=())

arm: {"name": "domain_120", "init": <a Hugging Face export directory with its vocab.txt / tokenizer.json>} for a
pre-trained arm, or {"name": "random_domain", "random_like": <such a directory>} for random initialisation: a model of
that export's config and objective, with its tokenizer, at BERT's initialisation drawn with torch seed = the
fine-tuning seed (one encoder per seed, exported once to <out>/finetune/<arm>/init/seed<N>/).

What it runs, each result written as soon as it is made and skipped when already there (study_results.py):
1. The rate of each task, from RATE_GRID: fine-tuning with seed 0 on the selection data of study_data.py, scored on
   the rate-selection slice (never dev); SST-2 once, at 1,000 labels, for all three budgets.
2. For each seed: SST-2 at 500, 1,000 and 5,000 labels, IMDB at 1,000, STS-B and CoLA, through
   pipeline/finetuning/run.py's finetune() at the protocol's settings (finetune_overrides); and the SST-2 probe.
3. Zero-shot SST-2 by the MLM head (study_zeroshot.py), once per arm (a random arm's: its first seed's encoder).
The bag-of-words baseline is study_baseline.run_baseline, once for all arms.

Arm names: the report pairs and judges the names of study_results.ARMS (random_general, random_domain, general_60,
general_120, domain_60, domain_120, domain_60_other); another name is tabled but not paired.

quick=True: the same chain at a tiny scale for CI: one epoch, the scored sets cut to their first 200 rows and STS-B's
and CoLA's training sets to 1,000 (the label budgets kept), one rate (QUICK_RATE, no selection), seeds (1,) unless
given; its files go beside the study's but are refused by a full-scale run (and the other way round).
overrides: extra fine-tuning settings (e.g. trainer.accelerator=gpu).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from study_data import BUDGETS, FINETUNE_TASK, SEEDS, SELECTION_BUDGET, SELECTION_SEED, SplitFiles, StudyData
from study_results import (
    finetune_root,
    rate_choice_path,
    rate_try_path,
    read_done,
    result_path,
    write_json,
    zeroshot_path,
)

RATE_GRID = (1e-4, 3e-4, 1e-3)
QUICK_RATE = 3e-4
TASKS = ("sst2", "imdb", "stsb", "cola")
# the metric each task's rate is chosen on: the one the endpoints read
SELECTION_METRIC = {"sst2": "acc", "imdb": "acc", "stsb": "pearson", "cola": "mcc"}
SMALL_SET_EPOCHS = 10     # the 500- and 1,000-example sets (SST-2, IMDB)
LARGE_SET_EPOCHS = 3      # SST-2 at 5,000, STS-B, CoLA
PROBE_BUDGET = 1000


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    init: Path | None = None           # a pre-trained export
    random_like: Path | None = None    # random initialisation of this export's architecture and tokenizer

    @classmethod
    def of(cls, arm: dict) -> Arm:
        unknown = set(arm) - {"name", "init", "random_like"}
        if "name" not in arm or unknown or ("init" in arm) == ("random_like" in arm):
            raise ValueError(f"an arm is {{'name', and one of 'init' or 'random_like'}}; got {sorted(arm)}")
        path = Path(arm.get("init") or arm["random_like"])
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"arm {arm['name']}: {path} is not a Hugging Face export (no config.json)")
        return cls(str(arm["name"]), path if "init" in arm else None, path if "random_like" in arm else None)

    def weights(self, seed: int, out: Path) -> Path:
        """What fine-tuning with `seed` starts from."""
        if self.init is not None:
            return self.init
        return random_export(self.random_like, seed, finetune_root(out) / self.name / "init" / f"seed{seed}")

    def description(self, seed: int) -> str:
        if self.init is not None:
            return str(self.init)
        return f"random initialisation (torch seed {seed}) of the architecture and tokenizer of {self.random_like}"


def random_export(like: Path, seed: int, target: Path) -> Path:
    """BERT's initialisation of `like`'s config and objective, drawn with torch seed `seed`, exported with `like`'s
    tokenizer (once; written aside and renamed, so an interrupted export is never taken for a finished one)."""
    import torch

    from model import BertForPreTraining
    from model.bert.hf_files import export_hf
    from pipeline.core.checkpoints.weights import load_pretrained

    if (target / "config.json").is_file():
        return target
    pretrained = load_pretrained(like)
    torch.manual_seed(seed)
    model = BertForPreTraining(pretrained.config, next_sentence_prediction=pretrained.has_next_sentence_head)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    export_hf(model, partial, pretrained.tokenizer_source)
    try:
        os.replace(partial, target)
    except OSError:   # another process exported the same seed meanwhile: the same weights, keep theirs
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return target


def epochs_for(task: str, budget: int | str, quick: bool) -> int:
    if quick:
        return 1
    return SMALL_SET_EPOCHS if task in ("sst2", "imdb") and budget in (500, 1000) else LARGE_SET_EPOCHS


def finetune_overrides(files: SplitFiles, init: Path, lr: float, epochs: int, seed: int, run_dir: Path,
                       cache: Path, extra: Sequence[str] = ()) -> list[str]:
    """Every setting of the protocol, given explicitly (none left to conf/training/finetune.yaml's defaults): batch 32,
    AdamW with weight decay 0.01, 10% linear warm-up then linear decay to 0, dropout 0.1, sequences of 128, clipping at
    1.0, length-grouped batches. Dev is scored once, after the last epoch (no choice is made on it)."""
    return [f"init={init}", f"task={FINETUNE_TASK[files.task]}", "data.dir=null", f"data.train={files.train}",
            f"data.dev={files.eval}", "data.test=null", f"output_dir={run_dir}", f"data.cache_dir={cache}",
            f"seed={seed}", "optimizer=adamw", f"optimizer.lr={lr}", "optimizer.weight_decay=0.01",
            "data.batch_size=32", "scheduler=linear_warmup", "scheduler.warmup_fraction=0.1",
            "scheduler.warmup_steps=null", "scheduler.power=1.0",
            "model.hidden_dropout=0.1", "model.attention_dropout=0.1", "data.max_seq_length=128",
            "trainer.gradient_clip_val=1.0", "data.group_by_length=true", f"trainer.max_epochs={epochs}",
            f"++trainer.check_val_every_n_epoch={epochs}", "data.limit_train_examples=null",
            "data.limit_eval_examples=null", "trainer.enable_progress_bar=false", "export.hf=false",
            "export.plot=false", "logger=csv", *extra]


def run_finetune(files: SplitFiles, init: Path, lr: float, epochs: int, seed: int, run_dir: Path, cache: Path,
                 extra: Sequence[str] = ()) -> dict:
    """One fine-tuning run in this process; its dev metrics and what it read, checked against what was written."""
    from pipeline.core.app import compose
    from pipeline.finetuning.run import finetune

    started = time.perf_counter()
    result = finetune(compose("finetune", finetune_overrides(files, init, lr, epochs, seed, run_dir, cache, extra)))
    summary = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    read = {split: summary["data"][split]["examples"] for split in ("train", "dev")}
    if read != {"train": files.train_rows, "dev": files.eval_rows}:
        raise RuntimeError(f"{run_dir}: fine-tuning read {read} rows, the files hold {files.train_rows} and "
                           f"{files.eval_rows}: a row was lost or split")
    return {"metrics": {k: float(v) for k, v in result["metrics"]["dev"].items()}, "lr": lr, "epochs": epochs,
            "global_step": result["global_step"], "seconds": round(time.perf_counter() - started, 1),
            "train_rows": files.train_rows, "eval_rows": files.eval_rows, "eval_set": files.eval_name,
            "truncated": {split: summary["data"][split].get("examples_truncated") for split in ("train", "dev")}}


class ArmRun:
    """The runs of one arm; every public method skips what its result file already holds."""

    def __init__(self, arm: Arm, shared_data: Path, out: Path, quick: bool, overrides: Sequence[str] = ()):
        self.arm, self.out, self.quick, self.overrides = arm, Path(out), quick, tuple(overrides)
        self.data = StudyData(shared_data, finetune_root(out) / "data", quick)
        self.cache = finetune_root(out) / "cache"
        self.runs = finetune_root(out) / arm.name / "runs"

    @functools.cached_property
    def objective(self) -> str:
        """The pre-training objective of the arm's export (a random arm: of the export it copies)."""
        from pipeline.core.checkpoints.weights import load_pretrained

        return "mlm_nsp" if load_pretrained(self.arm.init or self.arm.random_like).has_next_sentence_head else "mlm"

    def rate(self, task: str) -> float:
        path = rate_choice_path(self.out, self.arm.name, task)
        done = read_done(path, self.quick)
        if done:
            return float(done["chosen"])
        record = {"arm": self.arm.name, "task": task, "quick": self.quick, "parameter": "lr",
                  "metric": SELECTION_METRIC[task]}
        if self.quick:
            record.update(grid=[QUICK_RATE], chosen=QUICK_RATE, note="quick: one rate, no selection")
        else:
            files = self.data.selection(task)
            scores = {f"{lr:g}": self._rate_try(task, files, lr) for lr in RATE_GRID}
            # a NaN (constant predictions: no correlation) never wins; of equal scores, the lowest rate
            chosen = max(RATE_GRID, key=lambda lr: finite_or_low(scores[f"{lr:g}"]))
            record.update(grid=list(RATE_GRID), scores=scores, chosen=chosen, seed=SELECTION_SEED,
                          train_rows=files.train_rows, eval_rows=files.eval_rows, eval_set=files.eval_name)
        write_json(path, record)
        print(f"{self.arm.name} {task}: rate {record['chosen']:g} ({record.get('scores', 'quick')})", flush=True)
        return float(record["chosen"])

    def _rate_try(self, task: str, files: SplitFiles, lr: float) -> float:
        path = rate_try_path(self.out, self.arm.name, task, lr)
        done = read_done(path, self.quick)
        if not done:
            made = run_finetune(files, self.arm.weights(SELECTION_SEED, self.out), lr,
                                epochs_for(task, SELECTION_BUDGET[task], self.quick), SELECTION_SEED,
                                self.runs / f"rate-{task}-lr{lr:g}", self.cache, self.overrides)
            done = {"arm": self.arm.name, "task": task, "quick": self.quick, "seed": SELECTION_SEED,
                    "init": self.arm.description(SELECTION_SEED), **made}
            write_json(path, done)
        return float(done["metrics"][SELECTION_METRIC[task]])

    def finetune_cell(self, task: str, budget: int | str, seed: int) -> None:
        path = result_path(self.out, self.arm.name, task, budget, seed)
        if read_done(path, self.quick):
            return
        files = self.data.split(task, budget, seed)
        lr = self.rate(task)
        made = run_finetune(files, self.arm.weights(seed, self.out), lr, epochs_for(task, budget, self.quick), seed,
                            self.runs / f"{task}-{budget}-seed{seed}", self.cache, self.overrides)
        write_json(path, {"arm": self.arm.name, "task": task, "budget": str(budget), "seed": seed,
                          "quick": self.quick, "init": self.arm.description(seed), "objective": self.objective,
                          **made})
        shown = ", ".join(f"{k} {v:.4f}" for k, v in made["metrics"].items() if k != "loss")
        print(f"{self.arm.name} {task} {budget} seed {seed}: {shown} (lr {lr:g}, {made['seconds']} s)", flush=True)

    def probe_cell(self, seed: int) -> None:
        """The SST-2 probe: frozen encoder, mean-pooled last layer and the learned scalar mix of all layers, logistic
        regression on the seed's 1,000 training sentences, accuracy on dev (pipeline/extraction/probe.py)."""
        from pipeline.extraction import probe
        from pipeline.extraction.extractor import Extractor

        path = result_path(self.out, self.arm.name, "probe", PROBE_BUDGET, seed)
        if read_done(path, self.quick):
            return
        started = time.perf_counter()
        files = self.data.split("sst2", PROBE_BUDGET, seed)
        extractor = Extractor.from_init(self.arm.weights(seed, self.out), layers=None, per_token=False,
                                        poolings=("mean",), max_seq_length=128)
        train = probe.embed(extractor, *self.data.texts(files.train, "sst2", self.cache))
        scored = probe.embed(extractor, *self.data.texts(files.eval, "sst2", self.cache))
        weights = probe.fit_scalar_mix(train.layers["mean"], train.labels, seed)
        metrics = {}
        for row in ("last", probe.SCALAR_MIX):
            features = [probe.combination(row, side.layers["mean"], side.num_layers, weights)
                        for side in (train, scored)]
            metrics[f"{row}_mean"] = probe.logistic_regression_accuracy(features[0], train.labels, features[1],
                                                                        scored.labels, seed)
        write_json(path, {"arm": self.arm.name, "task": "probe", "budget": str(PROBE_BUDGET), "seed": seed,
                          "quick": self.quick, "init": self.arm.description(seed), "objective": self.objective,
                          "metrics": metrics, "mix_weights": [round(float(w), 4) for w in weights],
                          "train_rows": files.train_rows, "eval_rows": files.eval_rows, "eval_set": files.eval_name,
                          "seconds": round(time.perf_counter() - started, 1)})
        print(f"{self.arm.name} probe seed {seed}: {metrics}", flush=True)

    def zeroshot(self, seed: int) -> None:
        """Zero-shot SST-2 on dev; `seed` names a random arm's encoder (its first seed's)."""
        from study_zeroshot import zero_shot_sst2

        path = zeroshot_path(self.out, self.arm.name)
        if read_done(path, self.quick):
            return
        started = time.perf_counter()
        files = self.data.split("sst2", PROBE_BUDGET, seed)
        found = zero_shot_sst2(self.arm.weights(seed, self.out), *self.data.texts(files.eval, "sst2", self.cache))
        write_json(path, {"arm": self.arm.name, "task": "zeroshot", "quick": self.quick,
                          "init": self.arm.description(seed), "eval_set": files.eval_name,
                          "eval_rows": files.eval_rows, "seconds": round(time.perf_counter() - started, 1), **found})
        print(f"{self.arm.name} zero-shot SST-2: {found['accuracy']:.4f} (split words: {found['split_words']})",
              flush=True)


def finite_or_low(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


def run_arm(arm: dict, shared_data: Path, out: Path, seeds: Sequence[int] | None = None, quick: bool = False,
            overrides: Sequence[str] = ()) -> None:
    """Every result of one arm (see the module docstring); what is already written is skipped."""
    import datasets

    datasets.disable_progress_bars()
    seeds = tuple(seeds) if seeds is not None else ((1,) if quick else SEEDS)
    run = ArmRun(Arm.of(arm), Path(shared_data), Path(out), quick, overrides)
    for task in TASKS:
        run.rate(task)
    for seed in seeds:
        for task in TASKS:
            for budget in BUDGETS[task]:
                run.finetune_cell(task, budget, seed)
        run.probe_cell(seed)
    run.zeroshot(seeds[0])
