"""Batch-size warm-up (pipeline/pretraining/data/batch_warmup.py, step_stream.py): the ramp's arithmetic against its
definition, step by step; the rows of a step a function of the step alone (one rank or two, any loader workers); a
resume anywhere continues exactly; the settings refused before a run starts; and the setting at its default left out
of a run's identity and record (pipeline/core/run/shaping.py)."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.run.shaping import without_later_defaults
from pipeline.pretraining.data.batch_warmup import BatchWarmup

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def by_definition(warmup: BatchWarmup, steps: int) -> list[int]:
    """B(s) = start + increment x min(K, floor(K x T(s) / tokens)), T(s) the nominal tokens before step s."""
    sizes, rows = [], 0
    k_max = warmup.increments
    for _ in range(steps):
        tokens_before = rows * warmup.tokens_per_row
        k = min(k_max, k_max * tokens_before // warmup.tokens) if k_max else 0
        sizes.append(warmup.start_batch_size + k * warmup.increment)
        rows += sizes[-1]
    return sizes


@given(unit=st.integers(1, 8), start=st.integers(1, 6), extra=st.integers(0, 12), tokens=st.integers(1, 40_000),
       per_row=st.sampled_from([1, 7, 128]))
def test_the_batch_and_the_offset_of_every_step_follow_the_definition(unit, start, extra, tokens, per_row):
    warmup = BatchWarmup(tokens=tokens, start_batch_size=start * unit, increment=unit,
                         full_batch_size=(start + extra) * unit, tokens_per_row=per_row)
    steps = warmup.ramp_steps + 5
    expected = by_definition(warmup, steps)
    assert [warmup.batch_size(s) for s in range(steps)] == expected
    assert [warmup.offset(s) for s in range(steps)] == list(itertools.accumulate([0, *expected[:-1]]))
    assert warmup.batch_size(warmup.ramp_steps) == warmup.full_batch_size
    assert warmup.ramp_steps == 0 or warmup.batch_size(warmup.ramp_steps - 1) < warmup.full_batch_size


def test_modernberts_ramp_is_six_stages_over_its_tokens():
    # 768 -> 4,608 in steps of 768 over 50B tokens of 1,024-token rows
    warmup = BatchWarmup(tokens=50_000_000_000, start_batch_size=768, increment=768, full_batch_size=4608,
                         tokens_per_row=1024)
    assert [stage.batch_size for stage in warmup.stages] == [768, 1536, 2304, 3072, 3840, 4608]
    assert warmup.offset(warmup.ramp_steps) * 1024 >= 50_000_000_000 > warmup.offset(warmup.ramp_steps - 1) * 1024
    assert warmup.pass_sizes(8 * 4) == [24, 48, 72, 96, 120, 144]


@pytest.mark.parametrize("step", [0, 3, 4, 5, 9, 40])
def test_the_micro_batches_of_a_step_cut_its_rows_the_same_way_on_any_number_of_ranks(step):
    warmup = BatchWarmup(tokens=5 * 8 * 16, start_batch_size=8, increment=8, full_batch_size=16, tokens_per_row=16)
    cuts = {}
    for world, accumulation in [(1, 8), (2, 4), (4, 2), (8, 1)]:
        cuts[world] = [warmup.micro_batch_span(step, rank, world, accumulation, j)
                       for rank in range(world) for j in range(accumulation)]
    assert len({tuple(cut) for cut in cuts.values()}) == 1          # micro-batch q = rank x A + j, on every layout
    spans = cuts[1]
    assert spans[0][0] == warmup.offset(step) and spans[-1][1] == warmup.offset(step) + warmup.batch_size(step)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))       # contiguous, disjoint, equal
    assert len({stop - start for start, stop in spans}) == 1


def test_settings_that_cannot_cut_every_batch_are_refused():
    with pytest.raises(ValueError, match="must be positive and divide"):
        BatchWarmup(tokens=100, start_batch_size=6, increment=4, full_batch_size=16, tokens_per_row=8)
    with pytest.raises(ValueError, match=r"start_batch_size=32 must be in \[1"):
        BatchWarmup(tokens=100, start_batch_size=32, increment=4, full_batch_size=16, tokens_per_row=8)
    warmup = BatchWarmup(tokens=100, start_batch_size=4, increment=4, full_batch_size=16, tokens_per_row=8)
    warmup.check_divides(4)
    with pytest.raises(ValueError, match="not a multiple of the 8 passes"):
        warmup.check_divides(8)


def test_the_config_is_off_by_default_and_a_start_is_required():
    data = {"global_batch_size": 16, "max_seq_length": 128}
    assert BatchWarmup.from_config({**data, "batch_warmup": {"tokens": 0, "start_batch_size": None}}) is None
    assert BatchWarmup.from_config(data) is None
    with pytest.raises(ValueError, match="give data.batch_warmup.start_batch_size"):
        BatchWarmup.from_config({**data, "batch_warmup": {"tokens": 10}})
    warmup = BatchWarmup.from_config({**data, "batch_warmup": {"tokens": 10, "start_batch_size": 4}})
    assert warmup.increment == 4 and warmup.full_batch_size == 16 and warmup.tokens_per_row == 128


def test_at_its_default_the_setting_is_left_out_of_what_shapes_the_run():
    base = {"seed": 1, "data": {"global_batch_size": 8}}
    default = {"tokens": 0, "start_batch_size": None, "batch_size_increment": None}
    assert without_later_defaults("train", {"seed": 1, "data": {"global_batch_size": 8, "batch_warmup": default}}) \
        == base
    on = {"seed": 1, "data": {"global_batch_size": 8, "batch_warmup": {**default, "tokens": 5}}}
    assert without_later_defaults("train", on) == on
    assert without_later_defaults("finetune", on) == on


# -- the stream, on a real shard set (27 row groups of 64 rows) -------------------------------------------------------

def step_rows(shard_set, warmup, steps, world, micro, workers, skip=0):
    """[(step, sorted row indices of every rank's micro-batches of the step)] as the loaders deliver them."""
    from pipeline.pretraining.data.loader import PretrainingDataLoader
    from pipeline.pretraining.data.step_stream import StepStreamDataset

    accumulation = warmup.full_batch_size // (world * micro)
    per_rank = []
    for rank in range(world):
        data = StepStreamDataset(shard_set, warmup, accumulation, rank=rank, world_size=world, num_workers=workers,
                                 seed=7, return_row_index=True, batches_to_skip=skip * accumulation)
        per_rank.append([b["row_index"].tolist() for b in itertools.islice(PretrainingDataLoader(data),
                                                                           (steps - skip) * accumulation)])
    return [[row for rank in per_rank for batch in rank[s * accumulation:(s + 1) * accumulation] for row in batch]
            for s in range(steps - skip)]


def test_each_step_takes_the_same_rows_on_one_rank_or_two_with_any_workers_and_after_a_resume(regrouped_set):
    # rows per epoch: 1,728ish; batches 16 -> 64 over ~2 epochs' tokens: the stream crosses epochs inside the ramp
    rows = regrouped_set.total_rows
    warmup = BatchWarmup(tokens=2 * rows * 128, start_batch_size=16, increment=16, full_batch_size=64,
                         tokens_per_row=128)
    steps = warmup.ramp_steps + 3
    one = step_rows(regrouped_set, warmup, steps, world=1, micro=16, workers=0)
    assert [len(r) for r in one] == [warmup.batch_size(s) for s in range(steps)]
    assert step_rows(regrouped_set, warmup, steps, world=2, micro=8, workers=2) == one
    # every row once per epoch, a new order each epoch
    stream = [row for r in one for row in r]
    assert sorted(stream[:rows]) == list(range(rows)) and sorted(stream[rows:2 * rows]) == list(range(rows))
    assert stream[:rows] != stream[rows:2 * rows]
    for skip in (1, warmup.stages[1].first_step + 1, warmup.ramp_steps):   # inside the ramp and at its end
        assert step_rows(regrouped_set, warmup, steps, world=2, micro=8, workers=2, skip=skip) == one[skip:]


def warmup_config(*extra):
    from pipeline.core.app import compose

    return compose("train", ["data.global_batch_size=32", "data.micro_batch_size=4", "data.batch_warmup.tokens=1000",
                             "data.batch_warmup.start_batch_size=8", *extra])


def test_the_run_checks_refuse_what_the_ramp_cannot_run_with():
    from pipeline.pretraining.checks import preflight

    preflight(warmup_config(), world_size=2)                 # 2 ranks x 4 passes of 4: batches of 8, 16, 24, 32 cut
    with pytest.raises(ValueError, match="not a multiple of the 16 passes"):
        preflight(warmup_config("data.micro_batch_size=2"), world_size=2)
    preflight(warmup_config(), world_size=8)                 # 8 ranks x 1 pass of 4: the ramp's 8 cuts into 8 x 1
    with pytest.raises(ValueError, match="not a multiple of the 16 passes"):
        preflight(warmup_config(), world_size=16)            # 16 ranks x 1 pass of 2: a batch of 8 does not cut
    with pytest.raises(ValueError, match="with DeepSpeed"):
        preflight(warmup_config("strategy=deepspeed_stage_2"), world_size=2)
    with pytest.raises(ValueError, match="model.cuda_graphs"):
        preflight(warmup_config("model.compile=true", "model.cuda_graphs=true"), world_size=2)
    with pytest.raises(ValueError, match="recompile limit"):
        preflight(warmup_config("data.global_batch_size=128", "data.micro_batch_size=16",
                                "data.batch_warmup.tokens=10000000", "model.compile=true"), world_size=1)
    with pytest.raises(ValueError, match="overfit_batches"):
        preflight(warmup_config("overfit_batches=2"), world_size=2)


def test_a_run_recorded_before_the_setting_existed_resumes_and_turning_it_on_is_a_change(tmp_path):
    from pipeline.core.run.run_record import InEffect, ResumeRefused, check_start

    before = {"seed": 1, "data": {"global_batch_size": 8}}
    check_start(tmp_path, "train", InEffect(before, inputs={}), resuming_from=None).write(step=0)
    default = {"tokens": 0, "start_batch_size": None, "batch_size_increment": None}
    now = {"seed": 1, "data": {"global_batch_size": 8, "batch_warmup": default}}
    assert check_start(tmp_path, "train", InEffect(now, inputs={}), resuming_from="step2.ckpt").accepted == {}
    on = {"seed": 1, "data": {"global_batch_size": 8, "batch_warmup": {**default, "tokens": 100}}}
    with pytest.raises(ResumeRefused, match="data.batch_warmup.tokens"):
        check_start(tmp_path, "train", InEffect(on, inputs={}), resuming_from="step2.ckpt")


def test_a_checkpoint_counted_in_the_other_plan_is_refused():
    from pipeline.pretraining.data.datamodule import PretrainingDataModule

    warmup = BatchWarmup(tokens=100, start_batch_size=4, increment=4, full_batch_size=8, tokens_per_row=8)
    plain_state = {"epoch": 0, "batches_consumed": 3, "batches_per_epoch": 10, "world_size": 1}
    with pytest.raises(ValueError, match="counted without batch warm-up.*under batch warm-up"):
        PretrainingDataModule("unused", 8, 100, 4, batch_warmup=warmup).load_state_dict(plain_state)
    warmup_state = {"micro_batches_consumed": 4, "batch_warmup": warmup.describe(), "accumulation": 2}
    with pytest.raises(ValueError, match="counted under batch warm-up.*without batch warm-up"):
        PretrainingDataModule("unused", 8, 100, 4).load_state_dict(warmup_state)
