"""bench_downstream.py's --arms: a name it does not know stops the command before anything runs, and a fine-tuning
arm whose pre-training has not finished is named with the run it waits for, never passed over in silence (a sitting
of `finetune --arms domain_120` before domain_120 had finished once ended in 0 s with rc 0 and no word)."""
from __future__ import annotations


def test_a_finetuning_arm_whose_pretraining_has_not_finished_is_named(study_script, shared_data, tmp_path):
    out = tmp_path / "study"
    done = study_script("bench_downstream.py", "finetune", "--arms", "domain_120", "random_general",
                            "--shared-data", str(shared_data), "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (f"domain_120: skipped, the pre-training run it needs has not finished (no {out}/pretrain/domain_120/DONE);"
            " run the pretrain stage for domain_120 first") in done.stdout
    assert (f"random_general: skipped, the pre-training run it needs has not finished "
            f"(no {out}/pretrain/general_120/DONE); run the pretrain stage for general_120 first") in done.stdout
    assert "domain_60" not in done.stdout          # only the arms asked for
    assert not (out / "finetune").exists()


def test_an_export_without_its_done_record_is_not_fine_tuned(study_script, shared_data, tmp_path):
    out = tmp_path / "study"
    (out / "pretrain" / "domain_60" / "hf_export").mkdir(parents=True)   # a run stopped while it exported
    done = study_script("bench_downstream.py", "finetune", "--arms", "domain_60",
                            "--shared-data", str(shared_data), "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"domain_60: skipped, the pre-training run it needs has not finished (no {out}/pretrain/domain_60/DONE)" \
        in done.stdout
    assert not (out / "finetune").exists()


def test_an_unknown_arm_stops_the_command_naming_the_stages_arms(study_script, shared_data, tmp_path):
    out = tmp_path / "study"
    done = study_script("bench_downstream.py", "finetune", "--arms", "domain_12", "baseline",
                            "--shared-data", str(shared_data), "--out", str(out), timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("--arms domain_12: not an arm of finetune; its arms are random_domain, random_general, domain_120, "
            "general_120, domain_60, general_60, domain_60_other, baseline") in done.stderr
    assert not out.exists()                        # stopped before it made or locked anything

    done = study_script("bench_downstream.py", "pretrain", "--arms", "random_domain", "baseline",
                            "--shared-data", str(shared_data), "--out", str(out), timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("--arms random_domain baseline: not an arm of pretrain; its arms are domain_120, general_120, domain_60, "
            "general_60, domain_60_other") in done.stderr

    done = study_script("bench_downstream.py", "report", "--arms", "domain_60",
                            "--shared-data", str(shared_data), "--out", str(out), timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--arms: the report stage has no arms (pretrain and finetune have)" in done.stderr
    assert not out.exists()
