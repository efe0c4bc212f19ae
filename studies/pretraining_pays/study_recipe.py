"""The study's pre-training (study_protocol.md, sections 2 and 3): the speed of each shape, the recipe
tries at equal budgets, the mechanical choice of a recipe per corpus, and the pre-training arms.

    calibrate(out, shapes)       steps per minute of each shape (model, vocabulary, sequence), 2 threads
    search(out, corpora)         every try of TRIES on each corpus; then choose() writes out/search/<corpus>/choice.json
    pretrain(out, arms)          the arms' runs (resumable), each with its own budget and schedule
    heldout_mlm_accuracy(run, heldout)   the MLM head's accuracy on a held-out set (the objective comparison)

A recipe is a dict {model, vocab, seq, objective, lr}; its shape (what sets the speed) is model, vocabulary and
sequence length. Budgets are minutes of a quiet machine: steps = minutes x the shape's measured steps per minute.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks_common import metrics_rows, train_process
from study_corpora import is_quick, shard_sets

THREADS = 2
BATCH = 32
CALIBRATION_STEPS, CALIBRATION_SKIP, CALIBRATION_WINDOW = 60, 10, 5
VALIDATIONS = 10
# A pre-training arm is checkpointed 4 times per validation: a sitting that is stopped (the machine taken back)
# loses at most a fortieth of the run, 3 minutes of a 120-minute arm; the last checkpoint is ~30 MB at BERT-tiny.
CHECKPOINTS_PER_VALIDATION = 4
VALIDATION_BATCHES = 32
TRY_MINUTES = 6
CORPORA = ("domain", "general")
BASE = {"model": "tiny", "vocab": 16000, "seq": 128, "objective": "mlm", "lr": 1e-3}
TRIES = {
    "tiny_v8k_s128_mlm_lr1e-3": {**BASE, "vocab": 8000},
    "tiny_v16k_s128_mlm_lr1e-3": BASE,
    "tiny_v30k_s128_mlm_lr1e-3": {**BASE, "vocab": 30522},
    "mini_v16k_s128_mlm_lr6e-4": {**BASE, "model": "mini", "lr": 6e-4},
    "tiny_v16k_s64_mlm_lr1e-3": {**BASE, "seq": 64},
    "tiny_v16k_s128_nsp_lr1e-3": {**BASE, "objective": "mlm_nsp"},
    "tiny_v16k_s128_mlm_lr2e-3": {**BASE, "lr": 2e-3},
}
VOCAB_TRIES = ("tiny_v8k_s128_mlm_lr1e-3", "tiny_v16k_s128_mlm_lr1e-3", "tiny_v30k_s128_mlm_lr1e-3")
BASE_TRY = "tiny_v16k_s128_mlm_lr1e-3"
SMALL_SHAPE = {**BASE, "model": "small", "lr": 1e-4}   # calibrated and reported only (protocol, section 2)
SST2_SELECTION_ROWS = 2000      # rows 1-1,000 of SST-2's training file train the probe, 1,001-2,000 score it


def shape_key(recipe: dict) -> str:
    return f"{recipe['model']}_v{recipe['vocab']}_s{recipe['seq']}"


def _vocab_size(train: Path) -> int:
    return int(json.loads((train / "manifest.json").read_text())["tokenizer"]["vocab_size"])


def _overrides(out: Path, corpus: str, recipe: dict, seed: int = 1) -> list[str]:
    """A recipe's run: its keys, and "batch" (default BATCH) where the second protocol's plateau tries change it."""
    batch = recipe.get("batch", BATCH)
    train, heldout = shard_sets(out, corpus, recipe["vocab"], recipe["seq"], recipe["objective"])
    predictions = json.loads((train / "manifest.json").read_text())["parameters"]["max_predictions_per_seq"]
    return ["+experiment=cpu_hour", f"model={recipe['model']}", f"model.vocab_size={_vocab_size(train)}",
            f"optimizer.lr={recipe['lr']}", f"data.path={train}", f"validation.path={heldout}",
            f"data.max_seq_length={recipe['seq']}", f"data.max_predictions_per_seq={predictions}",
            f"data.global_batch_size={batch}", f"data.micro_batch_size={batch}",
            "data.verify_checksums=false", f"seed={seed}", "logger=csv", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false"]


def _train(run_dir: Path, overrides: list[str], in_process: bool = False) -> None:
    if in_process:   # the quick chain: no interpreter and torch start-up per run
        from pipeline.core.app import compose
        from pipeline.pretraining.run import train
        train(compose("train", [*overrides, f"output_dir={run_dir}"]))
        return
    train_process(run_dir, overrides, THREADS, append_log=True)   # a resumed run's sittings in one log


QUIET_LOAD = 0.5          # the protocol's amendment: a shape is calibrated only below this 1-minute load average
QUIET_WAIT_S = 3600


def wait_until_quiet(limit_s: float = QUIET_WAIT_S, poll_s: float = 15.0) -> float:
    """The 1-minute load average once it is under QUIET_LOAD; raises RuntimeError after limit_s of a busy machine.
    Even the fastest window of a loaded machine measures a share of it, not its speed (a discarded calibration)."""
    deadline = time.monotonic() + limit_s
    while (load := os.getloadavg()[0]) >= QUIET_LOAD:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the load average stayed at {load:.1f} (over {QUIET_LOAD}) for {limit_s:.0f} s: "
                               "calibrate on a quiet machine (stop other work), then run the stage again")
        print(f"calibrate: waiting for a quiet machine (load {load:.1f})", flush=True)
        time.sleep(poll_s)
    return load


def calibrate(out: Path, recipes: list[dict], quick: bool = False) -> dict[str, float]:
    """Steps per minute of each recipe's shape (measured once, on a quiet machine; the fastest window)."""
    path = out / "calibration.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    for recipe in recipes:
        key = shape_key(recipe)
        if key in result:
            continue
        run_dir = out / "calibration" / key
        load_before = os.getloadavg()[0] if quick else wait_until_quiet()
        steps = 12 if quick else CALIBRATION_STEPS
        _train(run_dir, [*_overrides(out, "domain", recipe), "validation.path=null", f"trainer.max_steps={steps}",
                         "scheduler.warmup_steps=2", "scheduler.warmup_fraction=null",
                         f"trainer.log_every_n_steps={CALIBRATION_WINDOW}",
                         "callbacks.checkpoint.every_n_train_steps=0", "callbacks.checkpoint.save_last=false",
                         "export.hf=false", "export.plot=false"], is_quick(out))
        rates = [float(r["perf/sequences_per_s"]) for r in metrics_rows(run_dir)
                 if r.get("perf/sequences_per_s") and int(r["step"]) >= (2 if quick else CALIBRATION_SKIP)]
        result[key] = {"steps_per_minute": 60 * max(rates) / BATCH, "load_before": load_before,
                       "measured": time.strftime("%Y-%m-%d %H:%M")}
        print(f"calibrate {key}: {result[key]['steps_per_minute']:.1f} steps/min (load {load_before:.1f})", flush=True)
        path.write_text(json.dumps(result, indent=1))
    return {key: value["steps_per_minute"] for key, value in result.items()}


def budget_steps(out: Path, recipe: dict, minutes: float) -> int:
    per_minute = json.loads((out / "calibration.json").read_text())[shape_key(recipe)]["steps_per_minute"]
    return VALIDATIONS * max(1, round(minutes * per_minute / VALIDATIONS))   # ten validations, evenly spaced


def train_for(out: Path, corpus: str, recipe: dict, run_dir: Path, steps: int, checkpoints: bool, seed: int = 1,
              extra: tuple[str, ...] = (), validations: int = VALIDATIONS) -> dict:
    """A run of `steps` on the corpus (resumed from its newest checkpoint where it has one); its final figures.
    `extra` overrides come last (the second protocol's plateau tries: a schedule longer than the run, an
    initialiser)."""
    done = run_dir / "DONE"
    if not done.exists():
        started = time.monotonic()
        every = steps // validations
        _train(run_dir, [*_overrides(out, corpus, recipe, seed), f"trainer.max_steps={steps}", "ckpt_path=auto",
                         f"validation.every_n_steps={every}",
                         f"validation.max_batches={2 if is_quick(out) else VALIDATION_BATCHES}",
                         f"trainer.log_every_n_steps={min(every, 50)}",
                         "callbacks.checkpoint.every_n_train_steps="
                         f"{max(1, every // CHECKPOINTS_PER_VALIDATION) if checkpoints else 0}", *extra], is_quick(out))
        final = [r for r in metrics_rows(run_dir) if r.get("val/mlm_acc")][-1]
        done.write_text(json.dumps({"corpus": corpus, "recipe": recipe, "steps": steps,
                                    **({"seed": seed, "overrides": list(extra)} if seed != 1 or extra else {}),
                                    "heldout_mlm_acc": float(final["val/mlm_acc"]),
                                    "wall_s_last_sitting": round(time.monotonic() - started, 1)}, indent=1))
    return json.loads(done.read_text())


def selection_probe(export: Path, shared_data: Path, quick: bool = False) -> float:
    """SST-2 training rows 1-1,000 train a logistic regression on frozen mean-pooled last-layer features; the
    accuracy on rows 1,001-2,000 (never dev)."""
    import numpy as np

    from pipeline.extraction.extractor import Extractor
    from pipeline.extraction.probe import embed, logistic_regression_accuracy

    lines = (shared_data / "downstream" / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    rows_used = SST2_SELECTION_ROWS // (10 if quick else 1)
    texts, labels = zip(*(line.rsplit("\t", 1) for line in lines[1:rows_used + 1]))
    extractor = Extractor.from_init(export, layers=None, per_token=False)
    embedded = embed(extractor, list(texts), [int(label) for label in labels])
    last = embedded.layers["mean"][:, -1]
    half = rows_used // 2
    y = np.asarray(embedded.labels)
    return logistic_regression_accuracy(last[:half], y[:half], last[half:], y[half:], seed=1)


def search(out: Path, shared_data: Path, tries: dict[str, dict], minutes: float, quick: bool = False) -> None:
    for corpus in CORPORA:
        for name, recipe in tries.items():
            run_dir = out / "search" / corpus / name
            steps = budget_steps(out, recipe, minutes)
            result = train_for(out, corpus, recipe, run_dir, steps, checkpoints=False)
            if "selection_probe" not in result:
                result["selection_probe"] = selection_probe(run_dir / "hf_export", shared_data, quick)
                (run_dir / "DONE").write_text(json.dumps(result, indent=1))
            print(f"{corpus} {name}: {steps} steps, held-out MLM acc {result['heldout_mlm_acc']:.4f}, "
                  f"selection probe {result['selection_probe']:.4f}", flush=True)


def finished_tries(out: Path, corpus: str) -> dict[str, dict]:
    """{try: its DONE record} for every finished try of the search on `corpus`, in name order."""
    return {path.parent.name: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted((Path(out) / "search" / corpus).glob("*/DONE"))}


def choose(out: Path, corpus: str, tries: dict[str, dict]) -> dict:
    """The protocol's selection rule, applied to the finished tries of `corpus`."""
    done = {name: record for name, record in finished_tries(out, corpus).items() if name in tries}

    def figure(name: str, measure: str) -> str:
        return f"{name} {done[name][measure]:.4f}" if name in done else f"{name} (not run)"

    base = done[BASE_TRY]
    vocab_try = max((n for n in VOCAB_TRIES if n in done), key=lambda n: done[n]["selection_probe"])
    recipe = {**BASE, "vocab": tries[vocab_try]["vocab"]}
    reasons = [f"vocabulary {recipe['vocab']}, the highest selection probe: "
               + ", ".join(figure(n, "selection_probe") for n in VOCAB_TRIES)]
    seq64 = "tiny_v16k_s64_mlm_lr1e-3"
    if seq64 in done and done[seq64]["selection_probe"] > base["selection_probe"]:
        recipe["seq"] = 64
    reasons.append(f"sequence {recipe['seq']}, selection probe: {figure(seq64, 'selection_probe')} against "
                   f"{figure(BASE_TRY, 'selection_probe')}")
    nsp = "tiny_v16k_s128_nsp_lr1e-3"
    if nsp in done and done[nsp]["heldout_mlm_acc"] > base["heldout_mlm_acc"]:
        recipe["objective"] = "mlm_nsp"
    reasons.append(f"objective {recipe['objective']}, held-out MLM accuracy: {figure(nsp, 'heldout_mlm_acc')} "
                   f"against {figure(BASE_TRY, 'heldout_mlm_acc')}")
    others = ("mini_v16k_s128_mlm_lr6e-4", "tiny_v16k_s128_mlm_lr2e-3")
    winners = [n for n in others if n in done and done[n]["heldout_mlm_acc"] > base["heldout_mlm_acc"]]
    if winners:
        best = max(winners, key=lambda n: done[n]["heldout_mlm_acc"])
        recipe["model"], recipe["lr"] = tries[best]["model"], tries[best]["lr"]
    reasons.append(f"model {recipe['model']} at {recipe['lr']:g}, held-out MLM accuracy: "
                   + ", ".join(figure(n, "heldout_mlm_acc") for n in others)
                   + f" against {figure(BASE_TRY, 'heldout_mlm_acc')}")
    choice = {"corpus": corpus, "recipe": recipe, "reasons": reasons}
    (out / "search" / corpus / "choice.json").write_text(json.dumps(choice, indent=1))
    return choice


def heldout_mlm_accuracy(export: Path, heldout: Path, batches: int = 64) -> float:
    """The MLM head's accuracy on a static held-out set (its first `batches` batches of 32): the same yardstick for
    models of either objective (a next-sentence head, where there is one, is not read)."""
    import torch

    from pipeline.core.checkpoints.weights import load_pretraining_model
    from pipeline.pretraining.data.datamodule import PretrainingDataModule

    model = load_pretraining_model(export).eval()
    manifest = json.loads((heldout / "manifest.json").read_text())
    data = PretrainingDataModule(path=str(heldout), max_seq_length=int(manifest["parameters"]["max_seq_length"]),
                                 vocab_size=model.config.vocab_size, micro_batch_size=BATCH, num_workers=0, seed=0,
                                 val_path=str(heldout))
    data.setup("fit")
    correct = total = 0
    with torch.no_grad():
        for index, batch in enumerate(data.val_dataloader()):
            if index >= batches:
                break
            batch.pop("next_sentence_labels", None)
            result = model(**batch)
            correct, total = correct + int(result.mlm_correct), total + int(result.mlm_total)
    return correct / max(total, 1)
