"""The shuffle plan: how a consumer's share of an epoch is cut into shuffle buffers (epoch_plan.buffers), and that
the stream resumes exactly under each plan."""
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline.pretraining.data import epoch_plan
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.loader import PretrainingDataLoader

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@given(pieces=st.integers(0, 5000), per_buffer=st.integers(1, 64))
@example(pieces=9, per_buffer=8)     # the README's sample: 9 row groups, one consumer
@example(pieces=17, per_buffer=8)
def test_plan_2_cuts_a_share_into_near_equal_buffers_of_at_most_the_buffer_size(pieces, per_buffer):
    share = list(range(pieces))
    buffers = epoch_plan.buffers(share, per_buffer, plan=2)
    sizes = [len(b) for b in buffers]
    assert [piece for b in buffers for piece in b] == share             # every piece once, in order
    assert len(buffers) == -(-pieces // per_buffer)                       # as many buffers as plan 1
    if pieces:
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= per_buffer  # no more memory than plan 1
        assert min(sizes) >= pieces // len(buffers)


@given(pieces=st.integers(0, 5000), per_buffer=st.integers(1, 64))
def test_plan_1_is_the_fixed_size_cut_older_checkpoints_were_counted_in(pieces, per_buffer):
    share = list(range(pieces))
    assert epoch_plan.buffers(share, per_buffer, plan=1) == [share[i:i + per_buffer]
                                                             for i in range(0, pieces, per_buffer)]


def test_the_sample_sets_tail_of_one_row_group_is_gone():
    share = list(range(9))
    assert [len(b) for b in epoch_plan.buffers(share, 8, plan=1)] == [8, 1]
    assert [len(b) for b in epoch_plan.buffers(share, 8)] == [5, 4]      # plan 2 is the default


def test_an_unknown_plan_is_refused(regrouped_set):
    with pytest.raises(ValueError, match="unknown shuffle plan 3"):
        epoch_plan.buffers([1, 2], 8, plan=3)
    with pytest.raises(ValueError, match="unknown shuffle plan 0"):
        PretrainingDataset(regrouped_set, 16, shuffle_plan=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_each_plan_resumes_exactly_and_the_plans_are_different_streams(regrouped_set, workers):
    # 27 row groups of 64 rows, batch 16: one worker reads 27 pieces, in buffers [8, 8, 8, 3] (plan 1) or
    # [7, 7, 7, 6] (plan 2); two read 14 each, in [8, 6] or [7, 7].
    streams = {}
    for plan in (1, 2):
        data = PretrainingDataset(regrouped_set, 16, num_workers=workers, return_row_index=True, shuffle_plan=plan)
        data.set_epoch(1)
        straight = [batch["row_index"].tolist() for batch in PretrainingDataLoader(data)]
        streams[plan] = straight
        for k in (1, 17, len(straight) - 9, len(straight) - 1):
            data.set_epoch(1, batches_to_skip=k)
            assert [batch["row_index"].tolist() for batch in PretrainingDataLoader(data)] == straight[k:], (plan, k)
    assert sorted(sum(streams[1], [])) == sorted(sum(streams[2], []))    # the same rows of the epoch
    assert streams[1] != streams[2]                                       # in another order
