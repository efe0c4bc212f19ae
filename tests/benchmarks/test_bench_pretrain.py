"""benchmarks/bench_pretrain.py --quick: ours and transformers' BertForPreTraining, from the same weights on the same
static-masked batches of real shards, agree within fp32 noise at every step; and the check fails on a real
difference (a learning rate off by 1%)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow   # each run trains three tiny BERTs for up to 50 steps on one thread


def test_quick_run_agrees_at_every_step(benchmark_script):
    done = benchmark_script("bench_pretrain.py", "--quick")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "AGREE: MLM, NSP and gradient norm within numerical noise at every one of the 50 steps" in out
    summary = dict(re.findall(r"^  (\w+)\s+max \|ours - transformers\| .*steps outside: (\d+)$", out, re.M))
    assert summary == {"mlm": "0", "nsp": "0", "grad_norm": "0"}
    shares = [float(s) for s in re.findall(r"largest share of the allowed difference ([\d.]+)", out)]
    assert len(shares) == 3 and all(share <= 1.0 for share in shares)
    # the table has a row for the first and the last step, with the two sides' losses side by side
    rows = {int(m[0]): m for m in re.findall(r"^\s+(\d+)\s+\S+ \|\s+([\d.]+)\s+([\d.]+)", out, re.M)}
    assert {1, 25, 50} <= set(rows)
    assert abs(float(rows[50][1]) - float(rows[1][1])) > 0.1   # the MLM loss moved: parity of a run that learns


def test_a_one_percent_learning_rate_error_is_caught(benchmark_script):
    done = benchmark_script("bench_pretrain.py", "--quick", "--steps", "6", "--inject-lr-error", "0.01")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DISAGREE: mlm, nsp, grad_norm outside numerical noise" in done.stdout
