"""benchmarks/gpu_step.py: the bare pre-training step (our model, the pipeline's optimizers, bf16 autocast) runs as
users run it, on the CPU at BERT-tiny, and its table holds a figure for every variant, so the script cannot rot
while no GPU runs it. (The compiled variants run the same code under BertModel.compile(), which the pre-training
tests cover; they are left out here for CI's time.)"""
from __future__ import annotations

import re


def test_cpu_run_times_every_eager_variant(benchmark_script):
    done = benchmark_script("gpu_step.py", "--cpu", "--eager-only", "--steps", "1", "--warmup", "1", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {cells[0]: cells[1:] for cells in
            ([cell.strip() for cell in line.split("|")[1:-1]] for line in done.stdout.splitlines())
            if cells and re.match(r"(fwd\+bwd|step), ", cells[0])}
    assert set(rows) == {"fwd+bwd, eager", "step, eager, lamb", "step, eager, fused adamw"}
    for name, (ms, sequences_s, mfu, rest) in rows.items():
        assert float(ms.replace(",", "")) > 0 and float(sequences_s.replace(",", "")) > 0
        assert mfu == "n/a"                  # no peak FLOP/s for a CPU
        assert (rest == "") == name.startswith("fwd+bwd")


def test_zero_timed_steps_is_refused_by_name(benchmark_script):
    """A time per step needs a step: --steps 0 stops at the argument, not in a division (ZeroDivisionError before)."""
    done = benchmark_script("gpu_step.py", "--cpu", "--steps", "0", timeout=120)
    assert done.returncode == 2 and "argument --steps: must be 1 or more, not 0" in done.stderr
