"""benchmarks/gpu_check.py: the attention-kernel probe names the kernel SDPA really ran, and `--cpu` runs every row of
the GPU check (the pipeline's train() and finetune() under DDP and DeepSpeed ZeRO-2, in bf16) at tiny sizes, so the
script cannot rot while no GPU runs it."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile


def operators_of_attention(backend: SDPBackend | None) -> list[str]:
    """The operators a forward and backward of SDPA dispatch on the CPU (with a padding mask, as BERT's)."""
    q = torch.randn(2, 2, 16, 8, requires_grad=True)
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[0, ..., 10:] = False
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if backend is None:
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        else:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        out.sum().backward()
    return [event.name for event in prof.events()]


def test_attention_probe_names_the_kernel_that_ran(benchmarks_importable):
    from gpu_probes import NO_SDPA, attention_backends

    assert attention_backends(operators_of_attention(SDPBackend.MATH)) == "math"
    assert attention_backends(operators_of_attention(SDPBackend.FLASH_ATTENTION)) == "flash (CPU kernel)"
    with profile(activities=[ProfilerActivity.CPU]) as prof:   # attention written out by hand: no SDPA
        q = torch.randn(2, 2, 16, 8)
        (q @ q.transpose(-2, -1)).softmax(-1) @ q
    assert attention_backends(event.name for event in prof.events()) == NO_SDPA


def test_cuda_kernel_operators_are_mapped(benchmarks_importable):
    """The CUDA backends' operators exist under the names the probe looks for (torch.ops.aten), so a GPU run can
    find them; which one runs there is what gpu_check.py reports."""
    from gpu_probes import SDPA_OPERATORS

    for name in SDPA_OPERATORS:
        assert hasattr(torch.ops.aten, name.removeprefix("aten::")), name


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_row(benchmark_script, tmp_path, torch_extensions_dir):
    done = benchmark_script("gpu_check.py", "--cpu", "--workdir", str(tmp_path),
                            TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "gpu_check.md").read_text()
    assert text.strip() in done.stdout
    table, profiles = text.split("One optimizer step of each run, profiled (step 2):")

    def cells_by_row(part: str) -> dict[str, list[str]]:
        return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
                for line in part.splitlines() if re.match(r"\| (pretrain|finetune)-", line)}

    rows = cells_by_row(table)
    assert set(rows) == {"pretrain-128-ddp", "pretrain-128-deepspeed_stage_2", "pretrain-512-ddp",
                         "pretrain-512-deepspeed_stage_2", "finetune-sst2"}
    for _name, cells in rows.items():
        model, seq, strategy, optimizer, batch, seqs, padded, real, mfu, memory, attention = cells
        assert float(seqs.replace(",", "")) > 0 and float(padded.replace(",", "")) >= float(real.replace(",", "")) > 0
        assert mfu == "n/a (no peak)"             # no peak FLOP/s for a CPU: no MFU, rather than a made-up one
        assert memory.endswith("GiB") and float(memory.split()[0]) > 0
        assert attention                          # what the profiled step ran (on the CPU with dropout: no SDPA)
    assert rows["pretrain-128-ddp"][3] == "lamb" and rows["pretrain-128-deepspeed_stage_2"][3] == "adamw"
    assert rows["pretrain-512-ddp"][1] == "512"
    assert "precision bf16-mixed" in table and "not measured here" in table
    # where step 2 of each row spent its time (benchmarks/gpu_step_profile.py): on the CPU, its operators by class
    profiled = cells_by_row(profiles)
    assert set(profiled) == set(rows)
    for name, (busy, launches, syncs, by_class) in profiled.items():
        assert (busy, launches, syncs) == ("n/a", "n/a", "n/a"), name
        assert "matmul" in by_class and by_class.endswith("(CPU operators)"), name


@pytest.mark.slow
def test_a_row_that_cannot_run_says_why_and_the_check_goes_on(benchmark_script, tmp_path):
    """Pre-training rows given a shard set that does not exist stop at their pre-flight check; the table says why
    (the run's own message), and the fine-tuning row after them still runs."""
    done = benchmark_script("gpu_check.py", "--cpu", "--workdir", str(tmp_path), "--shards-128",
                            str(tmp_path / "no_shards"), "--only", "pretrain-128-ddp", "finetune-sst2")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "gpu_check.md").read_text().split("profiled (step 2)")[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if re.match(r"\| (pretrain|finetune)-", line)}
    assert set(rows) == {"pretrain-128-ddp", "finetune-sst2"}
    assert re.search(r"not run: FileNotFoundError: no shard set at .*shards128", rows["pretrain-128-ddp"])
    assert "not run: FileNotFoundError" in done.stdout                       # printed when it happened
    assert "not run" not in rows["finetune-sst2"] and float(rows["finetune-sst2"].split("|")[7].replace(",", "")) > 0


@pytest.mark.slow
def test_overrides_reach_the_pre_training_rows(benchmark_script, benchmarks_importable, tmp_path):
    """--override adds Hydra overrides to every pre-training row (how a GPU run tries model.compile=true, say): here
    trainer.max_steps=2 where the rows train 4 steps; the header's command says what was run."""
    done = benchmark_script("gpu_check.py", "--cpu", "--workdir", str(tmp_path), "--only", "pretrain-128-ddp",
                            "--override", "trainer.max_steps=2", "trainer.log_every_n_steps=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from common import metrics_rows

    assert max(int(row["step"]) for row in metrics_rows(tmp_path / "pretrain-128-ddp") if row["step"]) == 1
    assert "--override trainer.max_steps=2 trainer.log_every_n_steps=1" in (tmp_path / "gpu_check.md").read_text()


def test_a_spent_budget_starts_no_row_and_still_writes_the_table(benchmark_script, tmp_path):
    """--budget bounds the whole check (a GPU machine lent for minutes): rows it leaves no time for are reported
    as not started, and the table is written all the same."""
    done = benchmark_script("gpu_check.py", "--cpu", "--workdir", str(tmp_path), "--budget", "0",
                            "--only", "pretrain-128-ddp", "finetune-sst2")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in (tmp_path / "gpu_check.md").read_text().splitlines()
            if re.match(r"\| (pretrain|finetune)-", line)]
    assert len(rows) == 2 and all("not run: not started: 0 s of the check's 0 s budget left" in row for row in rows)
