"""The commit rule on its own: only a run of processed offsets from the head is committed."""

from hypothesis import given
from hypothesis import strategies as st

from streams.offsets import committable_offset


def test_a_run_from_the_head_is_committed():
    assert committable_offset([5, 6, 7], head=5) == (8, [5, 6, 7])


def test_a_record_in_flight_at_the_head_holds_the_commit():
    # faust-streaming #606: committed 2585, 2585 still in flight, 2586.. acknowledged
    assert committable_offset([2586, 2587, 2588, 2589], head=2585) == (None, [])


def test_the_run_stops_at_the_first_hole():
    assert committable_offset([0, 1, 3, 4], head=0) == (2, [0, 1])


def test_an_empty_span_is_passed():
    assert committable_offset([3, 4], head=0, empty_spans=[(0, 3)]) == (5, [3, 4])


def test_offsets_acknowledged_again_below_the_head_are_covered_but_do_not_move_it():
    assert committable_offset([1, 2], head=5) == (None, [1, 2])


def test_head_zero_is_a_real_head():
    # Faust reads a committed offset of 0 as "none" and then checks nothing
    assert committable_offset([1, 2], head=0) == (None, [])


@given(
    st.sets(st.integers(0, 60)),
    st.integers(0, 40),
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=4),
)
def test_never_commits_past_an_offset_neither_acknowledged_nor_empty(acked, head, raw_spans):
    spans = [(b, b + n) for b, n in raw_spans]
    new, covered = committable_offset(acked, head, spans)
    if new is None:
        assert head not in acked and not any(b <= head < e for b, e in spans)
        return
    assert new > head
    for offset in range(head, new):
        assert offset in acked or any(b <= offset < e for b, e in spans)
    assert new not in acked and not any(b <= new < e for b, e in spans)
    assert set(covered) == {o for o in acked if o < new}
