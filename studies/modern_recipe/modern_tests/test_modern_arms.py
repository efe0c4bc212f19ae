"""What protocol.md fixes about the arms, checked against the code that runs them: equal parameters, the modern
recipe's settings, the order of the runs and the nested seeds."""
from __future__ import annotations

from pathlib import Path


def test_the_arms_are_at_equal_parameters_as_the_protocol_says(modern_importable):
    from modern_arms import MODERN, TINY, parameter_counts

    modern, tiny = parameter_counts(MODERN), parameter_counts(TINY)
    assert modern == {"total": 1_467_200, "embedding": 1_024_128, "non_embedding": 443_072}
    assert tiny == {"total": 1_511_360, "embedding": 1_090_048, "non_embedding": 421_312}
    assert abs(modern["total"] / tiny["total"] - 1) < 0.05


def test_the_modern_recipe_and_the_runs_are_the_protocols(modern_importable):
    from modern_arms import MODERN, MODERN_OVERRIDES, ORDER, TINY, pairing

    assert MODERN.recipe == {"model": "modernbert_tiny", "vocab": 8000, "seq": 128, "objective": "mlm", "lr": 1e-3}
    assert TINY.recipe == {"model": "tiny", "vocab": 8000, "seq": 128, "objective": "mlm", "lr": 2e-3}
    for setting in ("optimizer=stable_adamw", "scheduler=warmup_stable_decay", "scheduler.decay_shape=1-sqrt",
                    "scheduler.decay_fraction=0.2", "data.batch_warmup.tokens=0", "data.max_predictions_per_seq=38"):
        assert setting in MODERN_OVERRIDES
    assert ORDER == (("modern", 1), ("tiny", 1), ("modern", 2), ("tiny", 2), ("modern", 3))
    third = pairing(Path("/nowhere"), MODERN, 3, quick=False)
    assert third.seeds == (11, 12, 13, 14, 15) and third.random_seed(12) == 312
    assert third.cells == (("stsb", "full"), ("sst2", 1000))
