"""Optimizers and learning-rate schedules: AdamW, LAMB and StableAdamW with BERT's parameter groups, warm-up with
linear or polynomial decay, and warmup-stable-decay whose decay runs as a phase of its own. Imports no other room."""
