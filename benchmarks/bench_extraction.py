"""Feature extraction speed: ours against transformers' BertModel on the same sentences and weights.

    python benchmarks/bench_extraction.py --shared-data ../shared/data --init <run>/hf_export

--sentences SST-2 training sentences, pooled ([CLS], mean) vectors of the last four layers: ours
(pipeline/extraction, tokenization included, length-grouped batches padded to each batch's longest) against
transformers' BertModel(output_hidden_states=True) fed the usual way (its tokenizer, every sentence padded to 128,
tokenization included), batch 128 both, in the same run; the vectors are checked equal on the first batch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import REPO_ROOT, add_shared_data_flag, shared_path  # noqa: E402


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
            "ratio": theirs_seconds / ours_seconds, "ours_seconds": ours_seconds,
            "transformers_seconds": theirs_seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_data_flag(parser)
    parser.add_argument("--init", type=Path, required=True,
                        help="a Hugging Face directory of BERT (e.g. a run's hf_export)")
    parser.add_argument("--sentences", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pipeline.extraction.run import read_sst2_sentences

    texts, _ = read_sst2_sentences(shared_path(args, "downstream", "glue", "SST-2"), args.sentences,
                                   str(REPO_ROOT / "outputs" / "bench_extraction" / "cache"))
    speed = extraction_speed(args.init, texts)
    print(f"{speed['sentences']:,} sentences, {args.threads} threads: ours {speed['ours_per_second']:,.0f}/s, "
          f"transformers padded to 128 {speed['transformers_per_second']:,.0f}/s: {speed['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
