"""Data preparation: raw text to tokenized, masked BERT sentence-pair shards (Apache Beam).

Importable and runnable without torch: Dataflow workers install only what this package needs.
"""
