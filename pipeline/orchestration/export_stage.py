"""The export stage: a pre-training run's final weights as a Hugging Face BERT directory, the workflow's model.

    python -m pipeline.orchestration.export_stage --run=<train stage dir> --output=DIR [--tokenizer=<shards dir>]

Reads the run's checkpoints/last.ckpt (a Lightning file or a DeepSpeed checkpoint directory, as
pipeline/train.py's load_pretrained_weights does) with the model config the run was trained with (.hydra/), and
writes config.json, model.safetensors and the tokenizer (from the shard set it was trained on) to DIR, where
transformers and pipeline/finetune.py (init=DIR) load it. Then it loads DIR back and checks the weights are equal.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def export_run(run_dir: Path, output_dir: Path, tokenizer: Path | None) -> Path:
    import torch
    from omegaconf import OmegaConf

    from model import BertForPreTraining
    from model.hf_conversion import export_hf, from_hf_state_dict
    from pipeline.train import load_pretrained_weights, model_config_of

    config_file = run_dir / ".hydra" / "config.yaml"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    for path in (config_file, checkpoint):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: --run must be a finished pipeline/train.py run directory")
    model = BertForPreTraining(model_config_of(OmegaConf.load(config_file)))
    load_pretrained_weights(model, checkpoint)
    tokenizer = tokenizer or run_dir / "hf_export"
    export_hf(model.eval(), output_dir, tokenizer)

    from safetensors.torch import load_file
    reloaded = from_hf_state_dict(load_file(str(output_dir / "model.safetensors")), model.config)
    expected = model.state_dict()
    mismatched = [k for k, v in reloaded.state_dict().items() if not torch.equal(v, expected[k])]
    if mismatched:
        raise RuntimeError(f"the export in {output_dir} does not give back the checkpoint's weights: {mismatched[:5]}")
    (output_dir / "export.json").write_text(json.dumps(
        {"checkpoint": str(checkpoint), "tokenizer": str(tokenizer), "parameters": sum(
            p.numel() for p in model.parameters())}, indent=2) + "\n", encoding="utf-8")
    return output_dir


def main(argv: list[str] | None = None) -> int:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="the pre-training run directory")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="vocab.txt or a directory with it (a shard set); default: the run's hf_export/")
    args = parser.parse_args(argv)
    out = export_run(args.run.resolve(), args.output.resolve(), args.tokenizer)
    print(f"exported {args.run} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
