"""benchmarks/gpu_variants.py: each variant of gpu_check's seq-128 row runs beside the baseline in rotated rounds, on
the same machine, and the table compares them there (its `--cpu` rehearsal, so the script cannot rot between GPU
sessions)."""
from __future__ import annotations

import re

import pytest


def table_rows(text: str) -> dict[str, list[str]]:
    """The summary table's rows (not each run's lines before it, nor the profile table after it)."""
    table = text.split("Summary")[1].split("profiled:")[0]
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in table.splitlines() if re.match(r"\| (baseline|workers|compiled)", line)}


@pytest.mark.slow
def test_variants_run_beside_the_baseline_in_rotated_rounds(benchmark_script, benchmarks_importable, tmp_path):
    done = benchmark_script("gpu_variants.py", "--cpu", "--rounds", "2", "--workdir", str(tmp_path),
                            "--variant", "workers_2=data.num_workers=2,trainer.log_every_n_steps=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    starts = re.findall(r"^\[round (\d)\] (\S+):", done.stdout, flags=re.MULTILINE)
    assert starts == [("1", "baseline"), ("1", "workers_2"), ("2", "workers_2"), ("2", "baseline")]
    # the variant's overrides reach its runs, and only its runs: it logs every step, the baseline every second one
    from common import metrics_rows

    def windows(name: str, round_number: int) -> int:
        return sum(1 for row in metrics_rows(tmp_path / name / f"round{round_number}" / "pretrain-128-ddp")
                   if row.get("perf/sequences_per_s"))
    assert [windows("workers_2", r) for r in (1, 2)] == [4, 4]
    assert [windows("baseline", r) for r in (1, 2)] == [2, 2]
    rows = table_rows((tmp_path / "gpu_variants.md").read_text())
    assert set(rows) == {"baseline", "workers_2"}
    overrides, runs, each, median, ratio, mfu, mfu_bf16, memory = rows["workers_2"]
    assert overrides == "data.num_workers=2 trainer.log_every_n_steps=1" and runs == "2"
    seqs = [float(s.replace(",", "")) for s in each.split(", ")]
    shown = float(median.replace(",", ""))
    assert len(seqs) == 2 and shown == pytest.approx(sum(seqs) / 2, abs=0.1)
    base_median = float(rows["baseline"][3].replace(",", ""))
    # the script divides the unrounded medians; the table shows them to 0.1, so the ratio of the shown ones can round
    # the other way (64.9 / 68.7 = 0.9447, shown 0.95x from 64.90 / 68.67)
    slack = 0.005 + shown / base_median * (0.05 / shown + 0.05 / base_median)
    assert ratio.endswith("x") and float(ratio[:-1]) == pytest.approx(shown / base_median, abs=slack)
    assert rows["baseline"][4] == "1 (the baseline)" and mfu == mfu_bf16 == "n/a" and memory.endswith("GiB")


@pytest.mark.slow
def test_the_levers_rehearse_on_the_cpu_with_a_profile_of_each(benchmark_script, benchmarks_importable, tmp_path,
                                                                 torch_extensions_dir):
    """The default variants (issue 35's levers, then ModernBERT through the same row) at tiny sizes, one round: every
    lever that runs without a GPU runs and gets its row and its profiled step; FP8 and CUDA graphs are the GPU's
    only."""
    from gpu_variants import GPU_ONLY, LEVERS, MODERNBERT

    done = benchmark_script("gpu_variants.py", "--cpu", "--workdir", str(tmp_path),
                            TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "gpu_variants.md").read_text()
    table, profiles = text.split("Summary")[1].split("Step 2 of each variant's first run, profiled:")
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| variant |")]
    assert [row[0] for row in rows] == ["baseline", *(name for name in LEVERS if name not in GPU_ONLY), MODERNBERT]
    assert all(row[2] == "1" for row in rows), rows                # each ran once
    names = [row[0] for row in rows]
    profiled = [line for line in profiles.splitlines() if line.startswith("| ") and "CPU operators" in line]
    assert len(profiled) == len(names) and all("matmul" in line for line in profiled)


def test_a_spent_budget_starts_no_run_and_still_writes_the_table(benchmark_script, tmp_path):
    done = benchmark_script("gpu_variants.py", "--cpu", "--budget", "0", "--rounds", "2", "--workdir", str(tmp_path),
                            "--shards-128", str(tmp_path / "given"), "--variant", "compiled=model.compile=true")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = table_rows((tmp_path / "gpu_variants.md").read_text())
    assert set(rows) == {"baseline", "compiled"}
    for name, cells in rows.items():
        assert cells[1].startswith("0 (2 not run: not started: 0 s of the budget left, expected ")
        assert cells[3:5] == ["-", "-" if name == "compiled" else "1 (the baseline)"]


@pytest.mark.parametrize("given, why", [("compiled", "expected NAME=KEY=VALUE"),
                                         ("compiled=true", "expected NAME=KEY=VALUE"),
                                         ("baseline=model.compile=true", "is the row without overrides")])
def test_a_malformed_variant_is_refused_by_name(benchmark_script, given, why):
    done = benchmark_script("gpu_variants.py", "--cpu", "--variant", given)
    assert done.returncode == 2 and why in done.stderr, done.stderr[-2000:]


def test_a_variant_name_given_twice_is_refused(benchmark_script):
    """Two variants of one name would share a run folder and a table row, the first's results lost."""
    done = benchmark_script("gpu_variants.py", "--cpu", "--variant", "fast=data.num_workers=4", "--variant",
                            "fast=data.num_workers=8")
    assert done.returncode == 2 and "--variant: each name once (given: fast, fast)" in done.stderr, done.stderr


def test_a_run_the_budget_cannot_finish_is_not_started(benchmarks_importable, tmp_path):
    """Less time left than the variant's last run took (or, before it has one, than its expected cost): the run would
    be stopped before its end, so it does not start (and the time goes to a run that can finish)."""
    import argparse
    import time

    from gpu_variants import run_variant

    args = argparse.Namespace(cpu=True, budget=100.0)
    result = run_variant("compiled", ("model.compile=true",), 1, tmp_path, tmp_path / "shards", args,
                         started=time.perf_counter() - 60, last_took=45.0)
    assert result == {"error": "not started: 40 s of the budget left, expected 45 s (its last run here)"}
    assert not (tmp_path / "compiled").exists()
    args = argparse.Namespace(cpu=False, budget=100.0)
    result = run_variant("compiled", ("model.compile=true",), 0, tmp_path, tmp_path / "shards", args,
                         started=time.perf_counter() - 60, last_took=None)
    assert result == {"error": "not started: 40 s of the budget left, expected 90 s (estimate: one layer's "
                               "compile)"}


def test_the_first_round_runs_the_baseline_then_the_cheapest_first(benchmarks_importable):
    """Issue 48, finding 4: the most expensive row ("all") ran second; a budget that runs out now leaves out the
    dearest rows, never the cheap ones."""
    from gpu_variants import BASELINE, EXPECTED_S, LEVERS, MODERNBERT, first_round_order

    order = first_round_order([BASELINE, *LEVERS, MODERNBERT], cpu=False)
    assert order[0] == BASELINE and order[-1] == max(LEVERS, key=lambda name: EXPECTED_S[name][0])
    costs = [EXPECTED_S[name][0] for name in order[1:]]
    assert costs == sorted(costs)
    assert all(source == "measured" or source.startswith("estimate") for _, source in EXPECTED_S.values())
    assert set(EXPECTED_S) == {BASELINE, *LEVERS, MODERNBERT}


def test_each_run_is_appended_to_the_table_as_it_ends_with_its_mfu_against_the_peak_it_ran_at(benchmarks_importable):
    from gpu_variants import run_line

    fp8 = {"windows": [{"perf/sequences_per_s": 1.0, "perf/mfu": 0.1, "perf/mfu_bf16": 0.2}] * 2,
           "peak_memory": 2**30}
    line = run_line("fp8_compiled", 0, ("model.fp8=true",), (180, "estimate"), 200.0, fp8, baseline_rate=0.5)
    assert line == ("| fp8_compiled | 1 | model.fp8=true | 180 (estimate) | 200 | 1.0 | 2.00x | 10.0% | 20.0% | "
                    "1.00 GiB | done |")
    bf16 = {"windows": [{"perf/sequences_per_s": 1.0, "perf/mfu": 0.1}], "peak_memory": 2**30}
    assert "| 10.0% | 10.0% |" in run_line("compiled", 0, (), (150, "estimate"), 1.0, bf16, baseline_rate=1.0)


def test_phase2_runs_every_run_at_seq_512_with_packing_against_unpacked(benchmarks_importable, tmp_path):
    """--phase2 (issue 48, item 4): the baseline is the row at seq 512 unpacked, and packing's variants are measured
    against it; their expected costs have a table of their own, every entry an estimate until measured."""
    from gpu_variants import (
        BASELINE,
        PHASE2_EXPECTED_S,
        PHASE2_LEVERS,
        expected_cost,
        first_round_order,
        phase2_overrides,
    )

    assert set(PHASE2_EXPECTED_S) == {BASELINE, *PHASE2_LEVERS}
    assert all(source == "measured" or source.startswith("estimate") for _, source in PHASE2_EXPECTED_S.values())
    assert PHASE2_LEVERS["packed"] == ("data.packing=true",)
    order = first_round_order([BASELINE, *PHASE2_LEVERS], cpu=False, expected=PHASE2_EXPECTED_S)
    assert order[0] == BASELINE and sorted(order[1:]) == sorted(PHASE2_LEVERS)
    assert expected_cost("packed", cpu=True, last_took=None, expected=PHASE2_EXPECTED_S) == (
        PHASE2_EXPECTED_S["packed"][0] / 10, f"{PHASE2_EXPECTED_S['packed'][1]}, a tenth on the CPU")
    gpu = phase2_overrides(cpu=False, shards=tmp_path)
    assert gpu == (f"data.path={tmp_path}", "data.max_seq_length=512", "data.max_predictions_per_seq=80",
                   "data.micro_batch_size=32", "data.global_batch_size=128")


@pytest.mark.slow
def test_phase2_rehearses_packing_on_the_cpu(benchmark_script, tmp_path):
    done = benchmark_script("gpu_variants.py", "--cpu", "--phase2", "--workdir", str(tmp_path),
                            "--variant", "packed=data.packing=true")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "gpu_variants.md").read_text()
    assert "data.max_seq_length=512" in text.splitlines()[0]
    summary = text.split("Summary")[1].split("profiled:")[0]
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines()
            if re.match(r"\| (baseline|packed)", line)}
    assert set(rows) == {"baseline", "packed"} and "data.packing=true" in rows["packed"]
    assert re.search(r"\| \d+\.\d+x \|", rows["packed"]), rows["packed"]   # measured against the seq-512 baseline
