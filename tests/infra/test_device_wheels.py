"""The device's wheel folder follows the set: a folder made for an earlier set (the one that carried Beam) loses the
wheels its own lock lists and WHEELS no longer names; a wheel no lock lists is not removed (build refuses it)."""
from __future__ import annotations

import json

from infra.gpu.device_wheels import LOCK_NAME, WHEELS, drop_outside_the_set


def test_a_folder_of_an_earlier_set_drops_what_the_set_no_longer_names(tmp_path):
    name, version, how = WHEELS[0]
    kept = tmp_path / f"{name}-{version}-py3-none-any.whl"
    dropped = tmp_path / "apache_beam-2.77.0-cp312-cp312-manylinux2014_x86_64.whl"
    foreign = tmp_path / "someone_elses-1.0-py3-none-any.whl"
    for wheel in (kept, dropped, foreign):
        wheel.write_bytes(b"wheel")
    listed = [{"name": name, "version": version, "how": how, "file": kept.name},
              {"name": "apache-beam", "version": "2.77.0", "how": "binary", "file": dropped.name}]
    (tmp_path / LOCK_NAME).write_text(json.dumps({"python_version": "3.12", "wheels": listed}))

    drop_outside_the_set(tmp_path)

    assert kept.is_file() and foreign.is_file() and not dropped.exists()


def test_a_folder_without_a_lock_is_left_as_it_is(tmp_path):
    stray = tmp_path / "apache_beam-2.77.0-cp312-cp312-manylinux2014_x86_64.whl"
    stray.write_bytes(b"wheel")
    drop_outside_the_set(tmp_path)
    assert stray.is_file()
