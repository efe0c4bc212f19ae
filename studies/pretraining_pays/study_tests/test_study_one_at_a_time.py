"""bench_downstream.py runs one stage of a study at a time per output folder: a second invocation stops,
naming the one that holds it, and the folder is free again once that one has ended (however it ended)."""
from __future__ import annotations

import fcntl
import os


def test_a_second_stage_on_the_same_study_is_refused_by_name(study_script, shared_data, tmp_path):
    with open(tmp_path / ".running", "w", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()} (bench_downstream.py pretrain)\n")
        held.flush()
        done = study_script("bench_downstream.py", "report", "--shared-data", str(shared_data), "--out",
                                str(tmp_path), timeout=300)
        assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
        assert (f"{tmp_path} is in use by pid {os.getpid()} (bench_downstream.py pretrain): one stage of the study "
                "at a time") in done.stderr
        assert not (tmp_path / "report").exists()
    # the holder has ended (its file closed): the next stage runs, and says who holds the folder while it does
    done = study_script("bench_downstream.py", "report", "--shared-data", str(shared_data), "--out",
                            str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "report" / "report.md").is_file()
    assert (tmp_path / ".running").read_text().startswith("pid ")
    assert (tmp_path / ".running").read_text().endswith("(bench_downstream.py report --shared-data "
                                                        f"{shared_data} --out {tmp_path})\n")
