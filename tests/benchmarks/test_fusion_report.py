"""benchmarks/fusion_report.py on the CPU: what inductor fused in the compiled pre-training step (issue 35, item 4),
read from the code it generated; on a GPU the same script names the triton kernels."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_compiler_fuses_dropout_residual_and_layernorm_and_leaves_the_matmuls(benchmark_script):
    done = benchmark_script("fusion_report.py", "--cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    fused = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| cpp_fused_")]
    # the forward's dropout + residual add + LayerNorm in one kernel, and GELU with the cast to bf16 after it
    assert any(all(op in name for op in ("add", "native_dropout", "native_layer_norm")) for name in fused), fused
    assert any("gelu" in name for name in fused)
    # the losses are compiled too: log-softmax, the gather at the labels and argmax in one kernel
    assert any(all(op in name for op in ("log_softmax", "gather", "argmax")) for name in fused), fused
    calls = {line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| extern_kernels")}
    assert {"extern_kernels.mm", "extern_kernels.addmm"} <= calls   # the matmuls (bias in addmm) stay library calls
