"""The four downstream measures of bench_cpu_hour_curve.py, for one encoder and one seed.

Settings fixed before the first pre-trained point ran, the same for every checkpoint, random initialisation included.
The rate is the README demo's rate for BERT-tiny, 5e-4 (compact models fine-tune with larger rates than BERT-Base's
2e-5..5e-5). It was drafted as 1e-4, the earlier BERT-mini comparison's rate, but the first run (random
initialisation, seed 1) showed BERT-tiny at 1e-4 still predicting one class after 3 epochs (CoLA MCC 0.0, SST-2
0.538, STS-B Pearson 0.014), a comparison of nothing; it was changed before any pre-trained point had run.

- SST-2 linear probe: the first 2,000 sentences of the real training set, split 75/25 by the seed, frozen encoder,
  LogisticRegression (pipeline/extraction/probe.py, what pipeline/probe.py runs). Rows: the learned scalar mix of
  every layer and the last layer, each with mean pooling and with [CLS].
- CoLA: fine-tuning on in_domain_train (8,551), Matthews correlation on in_domain_dev (527).
- STS-B: fine-tuning on sts-train (5,749), Pearson and Spearman on sts-dev (1,500).
- SST-2: fine-tuning on the first 5,000 training sentences, accuracy on dev (872).
Fine-tuning: pipeline/finetuning/run.py's finetune(), batch 32, 3 epochs, AdamW at 5e-4 with weight decay 0.01,
10% warm-up then linear decay, dropout 0.1, sequences of 128, gradient clipping 1.0, length-grouped batches.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

FINETUNE_LR = 5e-4
FINETUNE_EPOCHS = 3
PROBE_SENTENCES = 2000
SST2_TRAIN_EXAMPLES = 5000
# measure -> (task, metric key in metrics.json, data overrides relative to downstream/glue)
FINETUNING = {
    "cola_mcc": ("cola", "mcc", ["data.train={glue}/CoLA/in_domain_train.tsv",
                                 "data.dev={glue}/CoLA/in_domain_dev.tsv"]),
    "stsb_pearson": ("stsb", "pearson", ["data.dir={glue}/STS-B"]),
    "sst2_acc": ("sst2", "acc", ["data.dir={glue}/SST-2", f"data.limit_train_examples={SST2_TRAIN_EXAMPLES}"]),
}
# The probe rows reported: (pooling, row of pipeline.extraction.probe.PROBE_ROWS)
PROBE_VIEWS = {"probe_mix_mean": ("mean", "scalar_mix"), "probe_last_mean": ("mean", "last"),
               "probe_mix_cls": ("cls", "scalar_mix"), "probe_last_cls": ("cls", "last")}


def probe_sst2(init: Path, glue: Path, seed: int, cache: Path) -> dict[str, float]:
    from pipeline.extraction import probe
    from pipeline.extraction.extractor import Extractor
    from pipeline.extraction.run import read_sst2_sentences

    texts, labels = read_sst2_sentences(glue / "SST-2", PROBE_SENTENCES, str(cache))
    extractor = Extractor.from_init(init, layers=None, per_token=False)
    accuracy = probe.probe(probe.embed(extractor, texts, labels), seed)["accuracy"]
    return {name: float(accuracy[pooling][row]) for name, (pooling, row) in PROBE_VIEWS.items()}


def finetune_task(measure: str, init: Path, glue: Path, seed: int, out: Path, cache: Path) -> dict[str, float]:
    from pipeline.core.app import compose
    from pipeline.finetuning.run import finetune

    task, metric, data = FINETUNING[measure]
    overrides = [f"init={init}", f"task={task}", *(d.format(glue=glue) for d in data), f"output_dir={out}",
                 f"data.cache_dir={cache}", f"trainer.max_epochs={FINETUNE_EPOCHS}", f"optimizer.lr={FINETUNE_LR}",
                 "data.group_by_length=true", "trainer.enable_progress_bar=false", "export.hf=false",
                 "export.plot=false", "logger=csv", f"seed={seed}"]
    finetune(compose("finetune", overrides))
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]["dev"]
    values = {measure: float(metrics[metric])}
    if task == "stsb":
        values["stsb_spearman"] = float(metrics["spearman"])
    return values


def run_suite(init: Path, glue: Path, seed: int, out: Path) -> dict[str, float]:
    """Every measure for one encoder and seed: {measure: value, "seconds": wall time}."""
    started = time.perf_counter()
    cache = out.parent / "datasets_cache"
    values = probe_sst2(init, glue, seed, cache)
    for measure in FINETUNING:
        values.update(finetune_task(measure, init, glue, seed, out / measure, cache))
    values["seconds"] = round(time.perf_counter() - started, 1)
    return values
