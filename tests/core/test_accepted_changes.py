"""resume.accept_changes entries (pipeline/core/run/accepted_changes.py): a key accepts one change, a key:value that
value only; `code` brings the keys the new code added. The resumes themselves:
tests/pretraining/test_resume_identity.py."""
from __future__ import annotations

import pytest

from pipeline.core.run.accepted_changes import ABSENT, decide, entries_of, suggestion


def accept(*entries: str) -> dict:
    return {"resume": {"accept_changes": list(entries)}}


def test_a_value_is_read_as_the_config_holds_it():
    lr, steps, name, flag = entries_of(accept("optimizer.lr:5e-5", "trainer.max_steps:2000000", "model.name:mini",
                                              "data.unpad:true"))
    assert (lr.key, lr.value, steps.value, name.value, flag.value) == ("optimizer.lr", 5e-5, 2000000, "mini", True)
    assert lr.covers("optimizer.lr", 0.00005) and not lr.covers("optimizer.lr", 0.0001)
    assert steps.covers("trainer.max_steps", 2000000.0) and not steps.covers("trainer.max_steps", 3000000)


@pytest.mark.parametrize("bad", [["optimizer.lr:"], [":1"], "", [3]])
def test_an_entry_that_is_not_a_key_or_key_value_is_refused(bad):
    if bad == "":
        assert entries_of({"resume": {"accept_changes": bad}}) == []
        return
    with pytest.raises(ValueError, match="resume.accept_changes"):
        entries_of({"resume": {"accept_changes": bad}})


def test_a_bare_key_accepts_one_change_and_a_valued_one_its_value_at_every_start():
    changes = {"optimizer.lr": (0.05, 0.1), "trainer.max_steps": (6, 8)}
    first = decide(changes, entries_of(accept("optimizer", "trainer.max_steps:8")), spent=())
    assert first.accepted_by == {"optimizer.lr": "optimizer", "trainer.max_steps": "trainer.max_steps:8"}
    again = decide(changes, entries_of(accept("optimizer", "trainer.max_steps:8")), spent={"optimizer"})
    assert again.refused == ["optimizer.lr"] and again.spent == {"optimizer.lr": "optimizer"}
    assert again.accepted_by == {"trainer.max_steps": "trainer.max_steps:8"}
    other_value = decide({"trainer.max_steps": (8, 9)}, entries_of(accept("trainer.max_steps:8")), spent=())
    assert other_value.refused == ["trainer.max_steps"] and other_value.spent == {}


def test_the_keys_new_code_adds_come_with_the_code():
    changes = {"code": ("a", "b"), "new_knob": (ABSENT, 1), "optimizer.lr": (0.1, 0.2)}
    decision = decide(changes, entries_of(accept("code")), spent=())
    assert decision.accepted_by == {"code": "code", "new_knob": "code"} and decision.refused == ["optimizer.lr"]
    assert decide(changes, [], spent=()).refused == ["code", "new_knob", "optimizer.lr"]


def test_the_suggestion_names_each_scalar_at_its_value():
    changes = {"optimizer.lr": (0.1, 0.2), "optimizer.betas": ([0.9, 0.99], [0.5, 0.6]), "new_knob": (1, ABSENT)}
    assert suggestion(sorted(changes), changes) == \
        "resume.accept_changes=[new_knob,optimizer.betas,optimizer.lr:0.2]"
