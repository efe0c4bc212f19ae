"""Does our pre-training make a better encoder? Pre-trained BERT-mini against the same architecture at random
initialisation on real SST-2, by linear probes and by fine-tuning; and extraction speed against transformers.

    python benchmarks/bench_downstream.py                      # the full run (see "Budget" below)
    python benchmarks/bench_downstream.py --pretrain-steps 20 --seeds 1 2 --probe-sentences 200 \
        --finetune-examples 300 --speed-sentences 500          # a toy run: every part end to end in a few minutes

What it does, in order, all in one process with --threads torch threads (default 2):
1. Shards: the bundled sample corpus's (`python data_prep/run.py`, outputs/shards/sample); built here with one
   Beam worker when missing, or --shards=<a shard set>.
2. Pre-training: pipeline/train.py's train() with model=mini and AdamW at --pretrain-lr (3e-4), everything else
   its defaults (batch 32, seq 128, 30 warmup steps then linear decay to 0 at the last step, static masking from
   the shards), for --pretrain-steps steps. Why not the default lr of 1e-3 (fine for the tiny demo model): at 1e-3
   BERT-mini never left the unigram plateau in a 1,800-step run (MLM loss 7.0-7.2 and MLM accuracy ~5% from step
   200 to step 1,350, NSP at chance); at 3e-4 it leaves it by step ~250 (NSP 0.77, MLM loss 6.82 at step 279); 1e-4
   was slower (MLM loss 7.00, NSP 0.55 at step 299). Those three curves, one seed each, are all the tuning there was.
   Budget: 1,800 steps = 57,600 sequences, about 1.1 passes over the sample's ~51k instances; at the README's
   train-step figure for the mini preset (4,199 tokens/s, 2 threads) that is about 30 minutes on a 2-core CPU.
   Reported: the final MLM and NSP accuracy (training, the mean of the last five logged windows) and the curve
   (csv/metrics.csv, curves.png in the run).
3. The random side: BertForPreTraining(the same config) at BERT's initialisation, one per seed (torch seed = seed),
   exported as a Hugging Face directory with the same tokenizer; everything downstream reads both sides through
   the same init= path.
4. Linear probe (pipeline/extraction/probe.py, what pipeline/probe.py runs): the first --probe-sentences sentences
   of the real SST-2 training set, split 75/25 by the seed, LogisticRegression per layer combination and pooling.
   The pre-trained encoder is embedded once (its weights do not depend on the seed; the split does); each random
   encoder is embedded with its own weights.
5. Fine-tuning (pipeline/finetune.py's finetune()): one epoch on the real SST-2 training set (or its first
   --finetune-examples), evaluated on the real dev set (872), seed = the seed, length-grouped batches of 32,
   lr --finetune-lr (1e-4, fixed before any run: the paper's 2e-5..5e-5 are for BERT-Base; compact models train
   with larger rates), the same for both sides.
6. Extraction speed: --speed-sentences SST-2 training sentences, the pre-trained weights, pooled ([CLS], mean)
   vectors of the last four layers: ours (pipeline/extraction, tokenization included) against transformers'
   BertModel(output_hidden_states=True) fed the usual way (its tokenizer, every sentence padded to 128, tokenization
   included), batch 128 both, same run; the vectors are checked equal on the first batch.

Three seeds per side, mean and sample standard deviation. Prints Markdown tables; writes results.json and
report.md into --out (default outputs/bench_downstream/).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

DEFAULT_SST2 = REPO_ROOT.parent / "shared" / "data" / "downstream" / "glue" / "SST-2"
DEFAULT_SHARDS = REPO_ROOT / "outputs" / "shards" / "sample"
DEFAULT_PRETRAIN_STEPS = 1800
DEFAULT_PRETRAIN_LR = 3e-4


# ----------------------------------------------------------------------------------------------------------
# 1-3: shards, pre-training, random initialisations

def ensure_shards(path: Path) -> Path:
    if (path / "manifest.json").is_file():
        return path
    if path != DEFAULT_SHARDS:
        sys.exit(f"no shard set at {path} (no manifest.json): leave --shards out to build the bundled sample's")
    from data_prep.run import run

    print(f"building the bundled sample's shards into {path} (data_prep/run.py, one Beam worker)", flush=True)
    run([f"output_dir={path}", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return path


def pretrain(shards: Path, out: Path, steps: int, lr: float) -> dict:
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    overrides = ["model=mini", f"data.path={shards}", f"output_dir={out}", f"trainer.max_steps={steps}",
                 f"optimizer.lr={lr}",
                 "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
                 f"callbacks.checkpoint.every_n_train_steps={max(steps, 1)}"]
    if steps <= 30:   # the default warmup is 30 steps; a toy run still needs a schedule that fits
        overrides.append(f"scheduler.warmup_steps={max(steps // 10, 1)}")
    started = time.perf_counter()
    result = train(compose("train", overrides))
    seconds = time.perf_counter() - started
    return summarize_run(out, Path(result["csv"]), result["global_step"], round(seconds, 1), result["plot"])


def summarize_run(run: Path, csv_path: Path, steps: int | None, seconds: float | None, curves_png) -> dict:
    """Final MLM/NSP accuracy (the mean of the last five logged windows) and the curve of a pre-training run."""
    curve = read_curve(csv_path) if csv_path.is_file() else []
    if steps is None and curve:
        steps = curve[-1]["step"] + 1
    last = curve[-5:]
    return {"run": str(run), "steps": steps, "seconds": seconds, "curve": curve,
            "final_mlm_acc": statistics.fmean(p["mlm_acc"] for p in last) if last else None,
            "final_nsp_acc": statistics.fmean(p["nsp_acc"] for p in last) if last else None,
            "final_loss": statistics.fmean(p["loss"] for p in last) if last else None,
            "curves_png": str(curves_png)}


def read_curve(csv_path: Path) -> list[dict]:
    """(step, loss, mlm_acc, nsp_acc) of every logged window."""
    import csv

    points = []
    with csv_path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get("train/mlm_acc"):
                points.append({"step": int(float(row["step"])), "loss": float(row["train/loss"]),
                               "mlm_acc": float(row["train/mlm_acc"]), "nsp_acc": float(row["train/nsp_acc"])})
    return points


def random_init(config, tokenizer_dir: Path, out: Path, seed: int) -> Path:
    from model import BertForPreTraining
    from model.hf_files import export_hf

    torch.manual_seed(seed)
    return export_hf(BertForPreTraining(config), out, tokenizer_dir)


# ----------------------------------------------------------------------------------------------------------
# 4: linear probes

def probe_side(inits: dict[int, Path], texts: list[str], labels: list[int], seeds: list[int]) -> dict[int, dict]:
    """seed -> probe result. inits: seed -> weights (the same path for every seed on the pre-trained side)."""
    from pipeline.extraction import probe
    from pipeline.extraction.extractor import Extractor

    embedded: dict[Path, object] = {}
    results = {}
    for seed in seeds:
        init = inits[seed]
        if init not in embedded:
            extractor = Extractor.from_init(init, layers=None, per_token=False)
            embedded[init] = probe.embed(extractor, texts, labels)
        results[seed] = probe.probe(embedded[init], seed)
    return results


# ----------------------------------------------------------------------------------------------------------
# 5: fine-tuning

def finetune_once(init: Path, sst2: Path, out: Path, seed: int, lr: float, examples: int | None) -> dict:
    from pipeline.core.app import compose
    from pipeline.finetuning.run import finetune

    overrides = [f"init={init}", "task=sst2", f"data.dir={sst2}", f"output_dir={out}",
                 f"data.cache_dir={out.parent / 'cache'}", "trainer.max_epochs=1", f"optimizer.lr={lr}",
                 "data.group_by_length=true", "trainer.enable_progress_bar=false", "export.hf=false",
                 "export.plot=false", f"seed={seed}"]
    if examples:
        overrides.append(f"data.limit_train_examples={examples}")
    started = time.perf_counter()
    result = finetune(compose("finetune", overrides))
    record = json.loads((out / "metrics.json").read_text())
    return {"dev_acc": result["score"], "train_examples": record["data"]["train"]["examples"],
            "weights_loaded": record["weights_loaded"], "seconds": round(time.perf_counter() - started, 1)}


# ----------------------------------------------------------------------------------------------------------
# 6: extraction speed

def extraction_speed(init: Path, texts: list[str], batch_size: int = 128) -> dict:
    import transformers

    from pipeline.extraction.extractor import Extractor
    from pipeline.extraction.inputs import TextRecord

    extractor = Extractor.from_init(init, layers=[-1, -2, -3, -4], per_token=False, batch_size=batch_size)
    started = time.perf_counter()
    ours = list(extractor.extract(TextRecord(i, t) for i, t in enumerate(texts)))
    ours_seconds = time.perf_counter() - started

    transformers.logging.set_verbosity_error()   # its load report lists our MLM/NSP heads as unexpected: known
    tokenizer = transformers.AutoTokenizer.from_pretrained(init)
    model = transformers.BertModel.from_pretrained(init, add_pooling_layer=False).eval()
    started = time.perf_counter()
    first_batch = None
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            inputs = tokenizer(texts[start:start + batch_size], padding="max_length", truncation=True,
                               max_length=128, return_tensors="pt")
            hidden = model(**inputs, output_hidden_states=True).hidden_states
            mask = inputs["attention_mask"].unsqueeze(-1).float()
            pooled = {f"layer_{-k}": ((hidden[-k] * mask).sum(1) / mask.sum(1), hidden[-k][:, 0])
                      for k in range(1, 5)}
            if first_batch is None:
                first_batch = pooled
    theirs_seconds = time.perf_counter() - started
    for view, (mean, cls) in first_batch.items():   # same weights, same sentences: the same vectors
        np.testing.assert_allclose(np.stack([s.pooled["mean"][view] for s in ours[:len(mean)]]), mean.numpy(),
                                   atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(np.stack([s.pooled["cls"][view] for s in ours[:len(cls)]]), cls.numpy(),
                                   atol=1e-4, rtol=1e-4)
    n = len(texts)
    return {"sentences": n, "ours_per_second": n / ours_seconds, "transformers_per_second": n / theirs_seconds,
            "ratio": theirs_seconds / ours_seconds, "ours_seconds": ours_seconds, "transformers_seconds": theirs_seconds}


# ----------------------------------------------------------------------------------------------------------
# report

def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {sd:.4f}"


def gap(a: list[float], b: list[float]) -> str:
    return f"{statistics.fmean(a) - statistics.fmean(b):+.4f}"


def report(results: dict) -> str:
    from pipeline.extraction.probe import PROBE_ROWS

    seeds = results["seeds"]
    pre, lines = results["pretraining"], []
    how = (f"lr {results['pretrain_lr']:g}, {pre['seconds']:,.0f} s" if pre["seconds"] is not None
           else f"the given run {pre['run']}")
    lines += [f"## Pre-training: BERT-mini, {pre['steps'] or 0:,} steps of 32 sequences on {results['shards']} ({how})",
              ""]
    if pre["curve"]:
        lines += [f"final (mean of the last five logged windows): MLM accuracy {pre['final_mlm_acc']:.4f}, NSP "
                  f"accuracy {pre['final_nsp_acc']:.4f}, loss {pre['final_loss']:.4f}; curve: {pre['curves_png']}", ""]
    lines += ["| step | loss | MLM accuracy | NSP accuracy |", "|---|---|---|---|"]
    curve = pre["curve"]
    shown = sorted({round(i * (len(curve) - 1) / 9) for i in range(10)}) if curve else []
    lines += [f"| {curve[i]['step']} | {curve[i]['loss']:.4f} | {curve[i]['mlm_acc']:.4f} | {curve[i]['nsp_acc']:.4f} |"
              for i in shown]

    probes = results["probe"]
    lines += ["", f"## Linear probe: SST-2, first {results['probe_sentences']:,} training sentences, 75/25 split by "
              f"seed, seeds {seeds} (mean ± sd)", "",
              "| layers | pooling | pre-trained | random init | gap |", "|---|---|---|---|---|"]
    for pooling in probes["pretrained"][seeds[0]]["accuracy"]:
        for row in PROBE_ROWS:
            a = [probes["pretrained"][s]["accuracy"][pooling][row] for s in seeds]
            b = [probes["random"][s]["accuracy"][pooling][row] for s in seeds]
            lines.append(f"| {row} | {pooling} | {spread(a)} | {spread(b)} | {gap(a, b)} |")

    fine = results["finetune"]
    a = [fine["pretrained"][s]["dev_acc"] for s in seeds]
    b = [fine["random"][s]["dev_acc"] for s in seeds]
    examples = fine["pretrained"][seeds[0]]["train_examples"]
    lines += ["", f"## Fine-tuning: one epoch on {examples:,} SST-2 training sentences, lr {results['finetune_lr']:g}, "
              f"dev accuracy (872), seeds {seeds}", "",
              "| init | dev accuracy (mean ± sd) | per seed |", "|---|---|---|",
              f"| pre-trained | {spread(a)} | {', '.join(f'{x:.4f}' for x in a)} |",
              f"| random init | {spread(b)} | {', '.join(f'{x:.4f}' for x in b)} |",
              f"| gap | {gap(a, b)} | |",
              "", f"weights loaded (pre-trained side): {fine['pretrained'][seeds[0]]['weights_loaded']}"]

    speed = results["speed"]
    lines += ["", f"## Extraction speed: {speed['sentences']:,} SST-2 sentences, pooled vectors of the last four "
              f"layers, BERT-mini, batch 128, {results['threads']} threads", "",
              "| extractor | sentences/s |", "|---|---|",
              f"| ours (length-grouped, padded to each batch's longest) | {speed['ours_per_second']:,.0f} |",
              f"| transformers BertModel, padded to 128 | {speed['transformers_per_second']:,.0f} |",
              f"| ratio | {speed['ratio']:.2f}x |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sst2", type=Path, default=DEFAULT_SST2, help="real SST-2 folder (train.tsv, dev.tsv)")
    parser.add_argument("--shards", type=Path, default=DEFAULT_SHARDS, help="pre-training shard set")
    parser.add_argument("--pretrain-steps", type=int, default=DEFAULT_PRETRAIN_STEPS)
    parser.add_argument("--pretrain-lr", type=float, default=DEFAULT_PRETRAIN_LR)
    parser.add_argument("--pretrained", type=Path, default=None,
                        help="skip pre-training: use this finished run directory of pipeline/train.py (mini)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--probe-sentences", type=int, default=2000)
    parser.add_argument("--finetune-examples", type=int, default=None, help="first N training rows (default all)")
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--speed-sentences", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench_downstream")
    args = parser.parse_args()
    if not (args.sst2 / "train.tsv").is_file() or not (args.sst2 / "dev.tsv").is_file():
        sys.exit(f"no SST-2 train.tsv / dev.tsv in {args.sst2}: pass --sst2=<GLUE SST-2 folder>")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)   # a previous run's fine-tuning directories would otherwise mix with this one's
    out.mkdir(parents=True)

    from pipeline.core.weights import load_pretrained
    from pipeline.extraction.run import read_sst2_sentences

    results: dict = {"seeds": args.seeds, "threads": args.threads, "probe_sentences": args.probe_sentences,
                     "finetune_lr": args.finetune_lr, "sst2": str(args.sst2),
                     "pretrain_lr": None if args.pretrained else args.pretrain_lr}
    if args.pretrained:
        run = args.pretrained.resolve()
        results["shards"] = "(given run)"
        results["pretraining"] = summarize_run(run, run / "csv" / "metrics.csv", None, None, run / "curves.png")
    else:
        shards = ensure_shards(args.shards.resolve())
        results["shards"] = str(shards)
        print(f"pre-training BERT-mini for {args.pretrain_steps:,} steps at lr {args.pretrain_lr:g}", flush=True)
        results["pretraining"] = pretrain(shards, out / "pretrain", args.pretrain_steps, args.pretrain_lr)
        run = out / "pretrain"
    pretrained = load_pretrained(run)
    init = run / "hf_export"   # the export the run wrote, with its tokenizer: what users hand to the next stages
    inits = {"pretrained": {seed: init for seed in args.seeds},
             "random": {seed: random_init(pretrained.config, init, out / f"random-{seed}", seed)
                        for seed in args.seeds}}

    texts, labels = read_sst2_sentences(args.sst2, args.probe_sentences, str(out / "cache"))
    print(f"probing {len(texts):,} sentences, seeds {args.seeds}", flush=True)
    results["probe"] = {side: probe_side(inits[side], texts, labels, args.seeds) for side in inits}

    results["finetune"] = {}
    for side in inits:
        results["finetune"][side] = {}
        for seed in args.seeds:
            print(f"fine-tuning {side}, seed {seed}", flush=True)
            results["finetune"][side][seed] = finetune_once(inits[side][seed], args.sst2,
                                                            out / "finetune" / f"{side}-{seed}", seed,
                                                            args.finetune_lr, args.finetune_examples)

    speed_texts, _ = read_sst2_sentences(args.sst2, args.speed_sentences, str(out / "cache"))
    print(f"extraction speed on {len(speed_texts):,} sentences", flush=True)
    results["speed"] = extraction_speed(init, speed_texts)

    text = report(results)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nwritten: {out / 'report.md'}, {out / 'results.json'}")


if __name__ == "__main__":
    main()
