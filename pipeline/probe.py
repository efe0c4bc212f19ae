"""Entry point: how much of SST-2's sentiment a linear classifier reads off each layer combination of a frozen BERT.

    python pipeline/probe.py init=outputs/train/demo                   # the bundled SST-2 sample, 2,000 sentences
    python pipeline/probe.py init=<run> data_dir=/data/glue/SST-2 sentences=5000 seed=2

The run itself: pipeline/extraction/run.py (run_probe); the probe: pipeline/extraction/probe.py.
"""
import hydra
from omegaconf import DictConfig

from pipeline.core import app  # noqa: F401  (first: silences known noise, registers the config resolvers)
from pipeline.extraction.run import probe_summary, run_probe


@hydra.main(config_path="../conf/features", config_name="probe", version_base="1.3")
def main(cfg: DictConfig) -> None:
    print(probe_summary(run_probe(cfg)))


if __name__ == "__main__":
    main()
