"""Packing efficiency of BERT's sentence pairs (data.packing, pipeline/pretraining/data/pair_packing.py) on a shard
set: real tokens over the token slots the model computes, one pair per row against pairs packed per micro-batch.

    python data_prep/run.py preset=sample_phase2        # the bundled sample at phase 2's shape (seq 512)
    python benchmarks/bench_pair_packing.py [--shards outputs/shards/sample_phase2] [--batch-sizes 8 32 64 256]

One epoch of the set, in the training loader's order (epoch 0's shuffle), collated as training collates it at a fixed
width of max_seq_length (the shape of a compiled phase-2 run): per micro-batch size, the rows the model computes,
unpacked and packed (at most --max-pairs-per-row pairs a row), the pairs per packed row, and each side's efficiency.
The window of the packing is the micro-batch, so larger micro-batches pack tighter. No timing: the speed that this
buys is measured on a GPU (benchmarks/gpu_variants.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def efficiency_rows(shards: Path, batch_sizes: list[int], max_pairs_per_row: int) -> list[dict]:
    from pipeline.pretraining.data.dataset import PretrainingDataset
    from pipeline.pretraining.data.shard_set import ShardSet

    manifest = json.loads((shards / "manifest.json").read_text())
    shard_set = ShardSet.open(shards, max_seq_length=manifest["parameters"]["max_seq_length"],
                              vocab_size=manifest["tokenizer"]["vocab_size"])
    width = shard_set.max_seq_length
    results = []
    for batch_size in batch_sizes:
        counts = {}
        for name, pairs_per_row in (("unpacked", None), ("packed", max_pairs_per_row)):
            dataset = PretrainingDataset(shard_set, batch_size, pad_to_multiple_of=width,
                                         max_pairs_per_row=pairs_per_row)
            rows = tokens = pairs = 0
            for batch in dataset:
                rows += batch["input_ids"].shape[0]
                tokens += int(batch["attention_mask"].sum())
                pairs += int((batch["next_sentence_labels"] != -100).sum())
            counts[name] = (rows, tokens, pairs)
        (rows, tokens, pairs), (packed_rows, packed_tokens, packed_pairs) = counts["unpacked"], counts["packed"]
        assert (tokens, pairs) == (packed_tokens, packed_pairs), "packing lost or added tokens"
        results.append({"batch_size": batch_size, "pairs": pairs, "tokens": tokens, "rows": rows,
                        "packed_rows": packed_rows, "efficiency": tokens / (rows * width),
                        "packed_efficiency": tokens / (packed_rows * width), "pairs_per_row": pairs / packed_rows})
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=Path, default=REPO / "outputs" / "shards" / "sample_phase2")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64, 256])
    parser.add_argument("--max-pairs-per-row", type=int, default=3)
    args = parser.parse_args(argv)
    if not (args.shards / "manifest.json").exists():
        sys.exit(f"no shard set at {args.shards}: python data_prep/run.py preset=sample_phase2 makes it")
    print(f"{args.shards}, at most {args.max_pairs_per_row} pairs a row; efficiency = real tokens / row slots")
    print(f"{'micro-batch':>11} {'pairs':>7} {'rows':>7} {'efficiency':>10} {'packed rows':>11} {'efficiency':>10} "
          f"{'pairs/row':>9} {'rows saved':>10}")
    for r in efficiency_rows(args.shards, args.batch_sizes, args.max_pairs_per_row):
        print(f"{r['batch_size']:>11} {r['pairs']:>7} {r['rows']:>7} {r['efficiency']:>10.3f} {r['packed_rows']:>11} "
              f"{r['packed_efficiency']:>10.3f} {r['pairs_per_row']:>9.2f} {1 - r['packed_rows'] / r['rows']:>10.1%}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
