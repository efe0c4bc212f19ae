"""Fine-tuning throughput: one epoch of SST-2 for the mini preset on the CPU, ours against transformers.

    python benchmarks/bench_finetune.py --shared-data ../shared/data   # real SST-2 train (67,349) and dev (872)
    python benchmarks/bench_finetune.py --shared-data ../shared/data --examples 5000   # the first 5,000 rows
    python benchmarks/bench_finetune.py --shared-data ../shared/data --squad  # SQuAD v1.1 dev inference (10,570)

Both sides start from the same weights (BERT-mini at random initialisation, seed 0, written once as a Hugging Face
directory) and train with the same recipe (AdamW, lr, weight decay 0.01, 10% linear warmup then linear decay,
gradient clipping 1.0, batch 32, dropout 0.1), one epoch, then are evaluated on the dev set:
- ours: the fine-tuning stage's own pieces (weights from init=, the task's reader and featurizer, batches padded to
  their longest, the task model, the pipeline's optimizer and schedule), once with length-grouped batches
  (data.group_by_length=true) and once in plain random order; --end-to-end also times finetune() itself (Lightning);
- the baseline: transformers' BertForSequenceClassification fed as its run_glue example does by default (every
  sequence padded to max_seq_length 128, shuffled batches), in a plain PyTorch loop (no Trainer overhead counted
  against it).
The sides' optimizer steps are interleaved (one step of each in turn, each timed on its own), so that on a shared
machine every side meets the same load. Tokenization is timed apart from training on both sides. Install the
baseline with `pip install -e ".[test]"`.

--squad measures inference on the real SQuAD v1.1 dev set with BERT-mini (random weights: speed, not scores): our
features (384 tokens, stride 128, questions cut to 64), then the forward pass of ours (shortest first, padded to each
batch's longest) and of transformers' BertForQuestionAnswering holding the same weights fed the same features as its
run_qa example does (padded to 384), then our n-best post-processing and the official EM/F1; per second, and the
share of post-processing in our total.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from common import BUNDLED_VOCAB as VOCAB  # noqa: E402
from common import add_shared_data_flag, shared_path  # noqa: E402


def write_initial_weights(out_dir: Path) -> Path:
    from model import BertConfig, BertForPreTraining
    from model.bert.hf_files import export_hf

    torch.manual_seed(0)
    return export_hf(BertForPreTraining(BertConfig.from_preset("mini")), out_dir, VOCAB)


def run_ours_end_to_end(init: Path, data: Path, work: Path, examples: int | None, lr: float) -> dict:
    """pipeline/finetune.py's finetune() itself (Lightning, length-grouped): what a user runs."""
    from pipeline.core.app import compose
    from pipeline.finetuning.run import finetune

    overrides = [f"init={init}", "task=sst2", f"data.dir={data}", f"output_dir={work / 'end_to_end'}",
                 f"data.cache_dir={work / 'cache'}", "trainer.max_epochs=1", f"optimizer.lr={lr}",
                 "data.group_by_length=true", "trainer.enable_progress_bar=false", "export.hf=false",
                 "export.plot=false", "seed=0"]
    if examples:
        overrides.append(f"data.limit_train_examples={examples}")
    finetune(compose("finetune", overrides))
    record = json.loads((work / "end_to_end" / "metrics.json").read_text())
    return {"name": "ours end to end: finetune() with Lightning, length-grouped",
            "examples": record["data"]["train"]["examples"], "train_seconds": record["train_seconds"],
            "dev_acc": record["metrics"]["dev"]["acc"]}


class OursSide:
    """Our fine-tuning step outside Lightning, built from the pipeline's own pieces: the weights and tokenizer of
    `init=`, the task's reader and featurizer, FeatureRows / PaddingCollator / the samplers, the task model, the
    pipeline's AdamW (fused) and schedule. Lightning adds little per step; run_ours_end_to_end measures it whole."""

    def __init__(self, init: Path, data: Path, cache: Path, examples: int | None, lr: float, grouped: bool,
                 batch_size: int = 32):
        from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained
        from pipeline.core.optim.optimizers import build_optimizer, build_scheduler
        from pipeline.finetuning.batches import FeatureRows, PaddingCollator, eval_loader, train_loader
        from pipeline.finetuning.features import featurize
        from pipeline.finetuning.module import build_task_model
        from pipeline.finetuning.tasks import get_task
        from pipeline.finetuning.tokenizer import load_tokenizer

        self.name = f"ours, {'length-grouped' if grouped else 'random order'}, padded to longest"
        torch.manual_seed(0)
        pretrained = load_pretrained(init)
        tokenizer = load_tokenizer(pretrained.tokenizer_source, pretrained.config.vocab_size)
        task = get_task("sst2")
        started = time.perf_counter()
        rows = {}
        for split in ("train", "dev"):
            read = task.read(split, str(data), cache_dir=str(cache))
            if split == "train" and examples:
                read = read.select(range(min(examples, len(read))))
            rows[split] = FeatureRows(featurize(read, task.kind, tokenizer, 128), task.kind)
        self.tokenize_seconds = time.perf_counter() - started
        self.model = build_task_model(pretrained.config, task.kind, 2)
        load_into_task_model(self.model, pretrained)
        collator = PaddingCollator(tokenizer.pad_id)
        self.batches = iter(train_loader(rows["train"], batch_size, collator, grouped, seed=0))
        self.dev = eval_loader(rows["dev"], 128, collator)
        self.examples = len(rows["train"])
        self.steps = math.ceil(self.examples / batch_size)
        self.optimizer = build_optimizer(self.model, {"name": "adamw", "lr": lr, "weight_decay": 0.01, "eps": 1e-6})
        self.schedule = build_scheduler(self.optimizer, {"warmup_fraction": 0.1}, self.steps)
        self.model.train()

    def step(self) -> None:
        batch = next(self.batches)
        out = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], labels=batch["labels"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)

    def dev_accuracy(self) -> float:
        self.model.eval()
        right = total = 0
        with torch.no_grad():
            for batch in self.dev:
                logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
                right += int((logits.argmax(-1) == batch["labels"]).sum())
                total += len(batch["labels"])
        return right / total


class TransformersSide:
    """transformers' BertForSequenceClassification fed as its run_glue example does by default: every sequence padded
    to max_seq_length 128, shuffled batches, and the Trainer's default optimizer with torch >= 2.8 (fused AdamW);
    the same rate, schedule, weight decay and clipping as ours."""

    def __init__(self, init: Path, data: Path, examples: int | None, lr: float, batch_size: int = 32,
                 max_seq_length: int = 128):
        import transformers

        self.name = f"transformers BertForSequenceClassification, padded to {max_seq_length}"
        torch.manual_seed(0)
        tokenizer = transformers.AutoTokenizer.from_pretrained(init)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(init, num_labels=2)

        def read(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
            lines = path.read_text(encoding="utf-8").splitlines()[1:]
            rows = [line.rsplit("\t", 1) for line in lines[:limit] if line]
            return [r[0] for r in rows], [int(r[1]) for r in rows]

        started = time.perf_counter()
        train_text, train_labels = read(data / "train.tsv", examples)
        dev_text, self.dev_labels = read(data / "dev.tsv")
        encode = lambda texts: tokenizer(texts, padding="max_length", truncation=True,  # noqa: E731
                                         max_length=max_seq_length, return_tensors="pt")
        self.train_inputs, self.dev_inputs = encode(train_text), encode(dev_text)
        self.tokenize_seconds = time.perf_counter() - started

        self.examples, self.batch_size = len(train_labels), batch_size
        self.steps = math.ceil(self.examples / batch_size)
        no_decay = ("bias", "LayerNorm.weight")
        named = list(self.model.named_parameters())
        groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": 0.01},
                  {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, eps=1e-6, fused=True)
        self.schedule = transformers.get_linear_schedule_with_warmup(self.optimizer, round(0.1 * self.steps),
                                                                     self.steps)
        self.labels = torch.tensor(train_labels)
        self.order = torch.randperm(self.examples, generator=torch.Generator().manual_seed(0))
        self.position = 0
        self.model.train()

    def step(self) -> None:
        rows = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        out = self.model(input_ids=self.train_inputs["input_ids"][rows],
                         token_type_ids=self.train_inputs["token_type_ids"][rows],
                         attention_mask=self.train_inputs["attention_mask"][rows], labels=self.labels[rows])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)

    def dev_accuracy(self) -> float:
        import numpy as np

        self.model.eval()
        predictions = []
        with torch.no_grad():
            for start in range(0, len(self.dev_labels), 128):
                batch = {k: v[start:start + 128] for k, v in self.dev_inputs.items()}
                predictions.append(self.model(**batch).logits.argmax(-1))
        return float((torch.cat(predictions).numpy() == np.asarray(self.dev_labels)).mean())


def run_interleaved(sides: list) -> list[dict]:
    """One optimizer step of each side in turn, each timed on its own: on a machine shared with other work, every
    side meets the same load, so their ratio holds even when the absolute figures move."""
    seconds = [0.0] * len(sides)
    for _ in range(max(side.steps for side in sides)):
        for i, side in enumerate(sides):
            if side.steps > 0:
                started = time.perf_counter()
                side.step()
                seconds[i] += time.perf_counter() - started
                side.steps -= 1
    return [{"name": side.name, "examples": side.examples, "train_seconds": seconds[i],
             "tokenize_seconds": side.tokenize_seconds, "dev_acc": side.dev_accuracy()}
            for i, side in enumerate(sides)]


def bench_squad_inference(dev_file: Path, questions: int | None, batch_size: int = 64) -> None:
    import transformers

    from model import BertConfig, BertForQuestionAnswering
    from model.bert.hf_conversion import hf_task_config_dict, task_to_hf_state_dict
    from pipeline.finetuning.batches import FeatureRows, PaddingCollator, eval_loader
    from pipeline.finetuning.tasks import get_task
    from pipeline.finetuning.tokenizer import load_tokenizer

    task = get_task("squad_v1")
    settings = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64, "n_best": 20,
                "max_answer_length": 30}
    torch.manual_seed(0)
    ours = BertForQuestionAnswering(BertConfig.from_preset("mini")).eval()
    theirs = transformers.BertForQuestionAnswering(transformers.BertConfig(**hf_task_config_dict(ours))).eval()
    theirs.load_state_dict(task_to_hf_state_dict(ours), strict=False)   # strict=False: HF's position_ids buffer

    with tempfile.TemporaryDirectory() as cache:
        examples = task.read("dev", str(dev_file), cache_dir=cache)
        if questions:
            examples = examples.select(range(min(questions, len(examples))))
        started = time.perf_counter()
        features, _ = task.featurize(examples, load_tokenizer(VOCAB, 30522), settings, training=False)
        feature_seconds = time.perf_counter() - started
        rows = FeatureRows(features, kind="span")

        outputs: list = [None] * len(rows)
        started = time.perf_counter()
        with torch.no_grad():
            for batch in eval_loader(rows, batch_size, PaddingCollator(pad_id=0)):
                logits = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
                for row, n, row_logits in zip(batch["row"].tolist(), batch["attention_mask"].sum(1).tolist(), logits):
                    outputs[row] = row_logits[:n].numpy()
        our_forward_seconds = time.perf_counter() - started

        started = time.perf_counter()
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                chunk = [rows[i] for i in range(start, min(start + batch_size, len(rows)))]
                batch = PaddingCollator(pad_id=0, pad_to_multiple_of=384)(chunk)   # every feature padded to 384
                hf_out = theirs(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                attention_mask=batch["attention_mask"])
                if start == 0:   # same weights, same features: the same logits where ours has tokens
                    n = int(batch["attention_mask"][0].sum())
                    torch.testing.assert_close(hf_out.start_logits[0, :n], torch.from_numpy(outputs[0][:, 0]),
                                               atol=1e-4, rtol=1e-4)
        hf_forward_seconds = time.perf_counter() - started

        started = time.perf_counter()
        metrics, _ = task.evaluate(examples, features, outputs, settings)
        post_seconds = time.perf_counter() - started

    total = feature_seconds + our_forward_seconds + post_seconds
    n_q, n_f = len(examples), len(rows)
    print(f"\nSQuAD v1.1 dev inference: {n_q:,} questions -> {n_f:,} features (384 tokens, stride 128), BERT-mini, "
          f"batch {batch_size}, {torch.get_num_threads()} threads\n")
    print("| step | seconds | features/s | share of our total |")
    print("|---|---|---|---|")
    print(f"| features (tokenize, windows, offsets) | {feature_seconds:.1f} | {n_f / feature_seconds:,.0f} | "
          f"{feature_seconds / total:.1%} |")
    print(f"| forward, ours (padded to longest) | {our_forward_seconds:.1f} | {n_f / our_forward_seconds:,.0f} | "
          f"{our_forward_seconds / total:.1%} |")
    print(f"| forward, transformers (padded to 384) | {hf_forward_seconds:.1f} | {n_f / hf_forward_seconds:,.0f} | "
          f"- |")
    print(f"| post-processing (n-best 20, max 30 tokens) + EM/F1 | {post_seconds:.1f} | {n_f / post_seconds:,.0f} | "
          f"{post_seconds / total:.1%} |")
    print(f"\nforward speed-up {hf_forward_seconds / our_forward_seconds:.2f}x; end to end ours {n_q / total:,.0f} "
          f"questions/s; EM {metrics['exact_match']:.2f}, F1 {metrics['f1']:.2f} (random weights)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shared_data_flag(parser)
    parser.add_argument("--data", type=Path, default=None,
                        help="SST-2 folder (train.tsv, dev.tsv); default <--shared-data>/downstream/glue/SST-2")
    parser.add_argument("--examples", type=int, default=None, help="first N training rows (default: all)")
    parser.add_argument("--lr", type=float, default=1e-4, help="peak learning rate, both sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-random-order", action="store_true", help="run ours length-grouped only")
    parser.add_argument("--end-to-end", action="store_true",
                        help="also time finetune() itself (Lightning), after the interleaved runs")
    parser.add_argument("--squad", action="store_true", help="SQuAD v1.1 dev inference instead of SST-2 training")
    parser.add_argument("--squad-dev", type=Path, default=None,
                        help="default <--shared-data>/downstream/squad/dev-v1.1.json")
    parser.add_argument("--questions", type=int, default=None, help="--squad: first N questions (default: all)")
    args = parser.parse_args()
    if args.squad:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
        bench_squad_inference(args.squad_dev or shared_path(args, "downstream", "squad", "dev-v1.1.json"),
                              args.questions)
        return
    args.data = args.data or shared_path(args, "downstream", "glue", "SST-2")
    if not (args.data / "train.tsv").is_file():
        sys.exit(f"no SST-2 train.tsv in {args.data}: pass --data=<GLUE SST-2 folder>")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = write_initial_weights(work / "init")
        sides = [OursSide(init, args.data, work / "cache", args.examples, args.lr, grouped=True)]
        if not args.skip_random_order:
            sides.append(OursSide(init, args.data, work / "cache", args.examples, args.lr, grouped=False))
        sides.append(TransformersSide(init, args.data, args.examples, args.lr))
        results = run_interleaved(sides)
        if args.end_to_end:
            results.insert(0, run_ours_end_to_end(init, args.data, work, args.examples, args.lr))

    baseline = results[-1]["examples"] / results[-1]["train_seconds"]
    print(f"\nOne epoch of SST-2 ({results[-1]['examples']:,} sentences), BERT-mini, batch 32, lr {args.lr:g}, "
          f"{args.threads} threads; steps of the sides interleaved; dev set {args.data / 'dev.tsv'}\n")
    print("| run | training examples/s | vs transformers | training s | dev accuracy |")
    print("|---|---|---|---|---|")
    for r in results:
        rate = r["examples"] / r["train_seconds"]
        print(f"| {r['name']} | {rate:,.0f} | {rate / baseline:.2f}x | {r['train_seconds']:.1f} | {r['dev_acc']:.4f} |")

if __name__ == "__main__":
    main()
