"""What a finished pre-training run leaves besides checkpoints: its Hugging Face export and its curves.

    <output_dir>/hf_export/   config.json, model.safetensors, vocab.txt, tokenizer files: loads with
                              transformers.BertForPreTraining.from_pretrained (and AutoTokenizer) offline; for a
                              ModernBERT-class model, transformers.AutoModelForMaskedLM (ModernBertForMaskedLM)
    <output_dir>/curves.png   MLM / NSP / total loss and MLM / NSP accuracy against the optimizer step, from the
                              CSV log (csv/metrics.csv)

`export_run` does the same for any finished run directory afterwards (the workflow's export stage), and checks that
the export gives back the checkpoint's weights.
"""
from __future__ import annotations

import json
from pathlib import Path

from model.architectures import PretrainingModel, is_modernbert
from model.bert.hf_files import export_hf
from model.modernbert.hf_files import export_modernbert_hf
from pipeline.core.checkpoints.weights import HF_EXPORT_DIR
from pipeline.core.run.curves import PLOT_NAME, Panel, plot_curves, read_metrics

PRETRAINING_PANELS = [Panel("loss", ("train/loss", "train/mlm_loss", "train/nsp_loss")),
                      Panel("accuracy", ("train/mlm_acc", "train/nsp_acc"), unit_interval=True)]


def export_model(model: PretrainingModel, output_dir: str | Path, shard_dir: str | Path) -> Path:
    """The HF export of `model` with the tokenizer of the shard set it was trained on (vocab.txt, tokenizer.json)."""
    return export_pretraining_hf(model, Path(output_dir) / HF_EXPORT_DIR, shard_dir)


def export_pretraining_hf(model: PretrainingModel, out_dir: str | Path, tokenizer: str | Path | None) -> Path:
    """A pre-training model as the transformers directory of its family (BERT's or ModernBERT's)."""
    if is_modernbert(model.config):
        return export_modernbert_hf(model, out_dir, tokenizer)
    return export_hf(model, out_dir, tokenizer)


def plot_pretraining_curves(csv_path: str | Path, output_dir: str | Path) -> Path:
    return plot_curves(read_metrics(csv_path), Path(output_dir) / PLOT_NAME, PRETRAINING_PANELS,
                       f"BERT pre-training: {Path(output_dir).name}", strip_prefix="train/")


def export_run(run_dir: Path, output_dir: Path, tokenizer: Path | None = None) -> Path:
    """A finished run's final weights (checkpoints/last.ckpt: a Lightning file or a DeepSpeed directory) as a Hugging
    Face directory, with the tokenizer of the shard set it was trained on (default: the run's own hf_export/); then
    the directory is read back and must give the checkpoint's weights exactly."""
    import torch

    from pipeline.core.checkpoints.weights import LAST_CHECKPOINT, load_pretraining_model

    checkpoint = run_dir / LAST_CHECKPOINT
    if not checkpoint.exists():
        raise FileNotFoundError(f"{checkpoint} not found: the run must be a finished pipeline/train.py run directory")
    model = load_pretraining_model(checkpoint)
    tokenizer = tokenizer or run_dir / HF_EXPORT_DIR
    export_pretraining_hf(model.eval(), output_dir, tokenizer)

    expected, reloaded = model.state_dict(), load_pretraining_model(output_dir).state_dict()
    mismatched = [name for name, tensor in reloaded.items() if not torch.equal(tensor, expected[name])]
    if mismatched:
        raise RuntimeError(f"the export in {output_dir} does not give back the checkpoint's weights: {mismatched[:5]}")
    (output_dir / "export.json").write_text(json.dumps(
        {"checkpoint": str(checkpoint), "tokenizer": str(tokenizer), "parameters": sum(
            p.numel() for p in model.parameters())}, indent=2) + "\n", encoding="utf-8")
    return output_dir
