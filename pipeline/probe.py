"""Entry point: how much of SST-2's sentiment a linear classifier reads off each layer combination of a frozen BERT.

    python pipeline/probe.py init=outputs/train/demo                   # the bundled SST-2 sample, 2,000 sentences
    python pipeline/probe.py init=<run> data_dir=/data/glue/SST-2 sentences=5000 seed=2

Writes probe.md (a table: layer combination x pooling -> test accuracy), probe.json and probe.png (a bar chart) into
its output directory. `run_probe(cfg)` is the same run as a function. See pipeline/extraction/probe.py.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import InterpolationResolutionError  # noqa: E402

CONFIG_DIR = REPO_ROOT / "conf"
log = logging.getLogger("pipeline.probe")

if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python pipeline/probe.py <overrides>` would run (pass output_dir=...)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="probe", overrides=list(overrides))


def read_sst2_sentences(data_dir: str | Path, count: int, cache_dir: str | None = None) -> tuple[list[str], list[int]]:
    """The first `count` sentences of SST-2's training split and their labels, through the task's own reader."""
    from pipeline.tasks import get_task

    task = get_task("sst2")
    path = Path(data_dir).expanduser()
    if not (path / task.splits["train"]).is_file():
        raise FileNotFoundError(f"no SST-2 {task.splits['train']} in {path}: pass data_dir=<an SST-2 folder>")
    rows = task.read("train", str(path), cache_dir=cache_dir)
    if len(rows) < count:
        raise ValueError(f"{path} holds {len(rows):,} training sentences, fewer than sentences={count:,}")
    rows = rows.select(range(count))
    return list(rows["text_a"]), [int(label) for label in rows["label"]]


def run_probe(cfg: DictConfig) -> dict[str, Any]:
    """Run as `cfg` says; returns what probe.json holds, with the table."""
    import torch

    from pipeline.extraction import probe
    from pipeline.extraction.extractor import Extractor

    if not cfg.get("init"):
        raise ValueError("init= is required: the weights to probe (anything fine-tuning's init= takes)")
    try:
        output_dir = Path(cfg.output_dir).resolve()
    except (InterpolationResolutionError, ValueError) as error:
        raise ValueError("output_dir is not set: pass output_dir=<directory> when calling run_probe()") from error
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    texts, labels = read_sst2_sentences(cfg.data_dir, int(cfg.sentences), cfg.get("cache_dir"))
    extractor = Extractor.from_init(str(cfg.init), layers=None, tokenizer=cfg.get("tokenizer"),
                                    poolings=list(cfg.pooling), per_token=False,
                                    max_seq_length=int(cfg.max_seq_length), batch_size=int(cfg.batch_size))
    result = probe.probe(probe.embed(extractor, texts, labels), int(cfg.seed), float(cfg.test_fraction))
    result["table"] = probe.table(result["accuracy"])
    result["settings"] = {"init": extractor.source, "data_dir": str(cfg.data_dir), "sentences": len(texts),
                          "test_fraction": float(cfg.test_fraction), "seed": int(cfg.seed)}
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "probe.md").write_text(result["table"] + "\n", encoding="utf-8")
    (output_dir / "probe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    result["chart"] = str(probe.bar_chart(
        result["accuracy"], output_dir / "probe.png",
        f"SST-2 linear probe: {len(texts):,} sentences, {result['train']:,} train / {result['test']:,} test"))
    result["output_dir"] = str(output_dir)
    return result


@hydra.main(config_path="../conf", config_name="probe", version_base="1.3")
def main(cfg: DictConfig) -> None:
    result = run_probe(cfg)
    print(f"SST-2 probe ({result['train']:,} train / {result['test']:,} test sentences, {result['settings']['init']})"
          f"\n\n{result['table']}\n\nlearned scalar-mix weights (embeddings first): "
          + "; ".join(f"{p} {w}" for p, w in result["mix_weights"].items())
          + f"\noutputs in {result['output_dir']}")


if __name__ == "__main__":
    main()
