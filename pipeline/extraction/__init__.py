"""Feature extraction from any BERT checkpoint fine-tuning accepts: per-layer vectors, layer combinations, probes."""
