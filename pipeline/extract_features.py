"""Entry point: per-layer feature vectors of any BERT checkpoint fine-tuning accepts, for a file of sentences.

    python pipeline/extract_features.py init=outputs/train/demo input=sentences.txt layers=[-1,-2]
    python pipeline/extract_features.py init=<run> input=pipeline/finetuning/sample_data/SST-2/dev.tsv \
        column=sentence combinations=[sum_last_four,concat_last_four] per_token=false output_format=numpy
    python pipeline/extract_features.py init=<run> input=in.txt output_format=jsonl   # the reference's layout

The run itself: pipeline/extraction/run.py (extract_features).
"""
import hydra
from omegaconf import DictConfig

from pipeline.core import app  # noqa: F401  (first: silences known noise, registers the config resolvers)
from pipeline.extraction.run import extract_features, extraction_summary


@hydra.main(config_path="../conf/features", config_name="extract_features", version_base="1.3")
def main(cfg: DictConfig) -> None:
    print(extraction_summary(extract_features(cfg)))


if __name__ == "__main__":
    main()
