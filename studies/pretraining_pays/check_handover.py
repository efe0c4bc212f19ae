"""Is what fine-tuning starts from the pre-trained model? A check behind bench_cpu_hour_curve.py's comparison.

    python studies/pretraining_pays/check_handover.py outputs/pretrain_mini_lr3e-4 [--batches 20]

1. The run's Hugging Face export, loaded by transformers' own BertForPreTraining (not our code), scores MLM and NSP
   on --batches batches of the run's own shards (static masks, the batches training read first), beside the same
   architecture at random initialisation and the unigram floor (always the most frequent masked token).
2. The task model fine-tuning builds from that export (pipeline/finetuning: load_pretrained, load_into_task_model)
   holds the export's encoder tensors exactly, pooler included, before its first step.
"""
from __future__ import annotations

import argparse
import collections
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def score(model, batches) -> tuple[float, float]:
    mlm_right = mlm_total = nsp_right = nsp_total = 0
    with torch.no_grad():
        for batch in batches:
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                        attention_mask=batch["attention_mask"])
            logits = out.prediction_logits.gather(
                1, batch["masked_positions"][..., None].expand(-1, -1, out.prediction_logits.shape[-1]))
            labels = batch["masked_lm_labels"]
            real = labels >= 0
            mlm_right += int((logits.argmax(-1)[real] == labels[real]).sum())
            mlm_total += int(real.sum())
            nsp_right += int((out.seq_relationship_logits.argmax(-1) == batch["next_sentence_labels"]).sum())
            nsp_total += len(labels)
    return mlm_right / mlm_total, nsp_right / nsp_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished pipeline/train.py run directory (with hf_export/)")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    export = args.run / "hf_export"

    import transformers
    from omegaconf import OmegaConf

    from pipeline.pretraining.data.datamodule import PretrainingDataModule

    shards = OmegaConf.load(args.run / ".hydra" / "config.yaml").data.path
    module = PretrainingDataModule(shards, 128, 30522, 32, num_workers=0)
    loader = iter(module.train_dataloader())
    batches = [next(loader) for _ in range(args.batches)]

    pretrained = transformers.BertForPreTraining.from_pretrained(export).eval()
    torch.manual_seed(0)
    random = transformers.BertForPreTraining(pretrained.config).eval()
    labels = torch.cat([b["masked_lm_labels"][b["masked_lm_labels"] >= 0] for b in batches])
    commonest, count = collections.Counter(labels.tolist()).most_common(1)[0]
    print(f"{len(labels):,} masked tokens, {32 * args.batches:,} pairs of {shards}")
    print("| model | MLM accuracy | NSP accuracy |\n|---|---|---|")
    for name, model in (("pre-trained (transformers loads hf_export)", pretrained), ("random init", random)):
        mlm, nsp = score(model, batches)
        print(f"| {name} | {mlm:.4f} | {nsp:.4f} |")
    print(f"| unigram floor (always token {commonest}) | {count / len(labels):.4f} | |")

    from model.bert.heads import BertForSequenceClassification
    from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained

    loaded = load_pretrained(export)
    task_model = BertForSequenceClassification(loaded.config, num_labels=2)
    what = load_into_task_model(task_model, loaded)
    task_model.eval()
    batch = batches[0]
    inputs = {name: batch[name] for name in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        theirs = pretrained.bert(**inputs)
        ours = task_model.bert(**inputs)
        untouched = BertForSequenceClassification(loaded.config, num_labels=2).eval().bert(**inputs)   # control
    real = batch["attention_mask"].bool()
    token_gap = (theirs.last_hidden_state - ours.sequence_output)[real].abs().max().item()
    pooled_gap = (theirs.pooler_output - ours.pooled_output).abs().max().item()
    print(f"\nfine-tuning's task model: loaded {what!r}; on the first batch its encoder against transformers' "
          f"BertModel of the export: last layer max |difference| {token_gap:.2e} (real tokens), pooled [CLS] "
          f"{pooled_gap:.2e}; a task model left at random initialisation (the control): "
          f"{(theirs.last_hidden_state - untouched.sequence_output)[real].abs().max().item():.2e}")

if __name__ == "__main__":
    main()
