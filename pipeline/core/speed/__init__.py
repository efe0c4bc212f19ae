"""How a step runs on its devices, and how fast: the strategies (DDP, DeepSpeed's ZeRO, on GPUs or CPU ranks), the
largest micro-batch that fits, FP8, gradient clipping without a host sync, step statistics read at log steps only,
and the throughput and MFU logged. Uses checkpoints/ (DeepSpeed's checkpoint directories, atomic files)."""
