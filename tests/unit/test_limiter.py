"""The pace of evictions (limiter.Pacer): at most `rate` a second in any one-second window, whatever the
event loop's stalls."""

from __future__ import annotations

import math

import pytest
from fleetmq.broker.limiter import Pacer, TokenBucket
from hypothesis import given
from hypothesis import strategies as st


def run(rate: float, stalls: list[float]) -> list[float]:
    """When each eviction goes, on a loop that wakes `stalls[i]` seconds late before the i-th."""
    pacer, t, went = Pacer(rate), 0.0, []
    for stall in stalls:
        t += pacer.delay(t) + stall
        pacer.went(t)
        went.append(t)
    return went


def test_after_a_stall_the_next_goes_one_interval_after_the_last_not_in_a_burst():
    """Issue 27 (e2e, under load: 49 clients reconnected within one second from an eviction at 30 a
    second). Paced from its start, a stopping node that had stalled for a second evicted the 30 it was
    behind at once; paced from the last one, it does not catch up."""
    went = run(30, [0.0, 1.0, 0.0, 0.0])
    assert went[1] - went[0] == 1.0 + 1 / 30  # (the stall)
    assert math.isclose(went[2] - went[1], 1 / 30) and math.isclose(went[3] - went[2], 1 / 30)


@given(
    rate=st.floats(min_value=1.0, max_value=500.0),
    stalls=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=1, max_size=200),
)
def test_no_second_holds_more_than_the_rate(rate: float, stalls: list[float]) -> None:
    went = run(rate, stalls)
    for i, start in enumerate(went):
        in_window = sum(1 for t in went[i:] if t < start + 1.0)
        assert in_window <= math.floor(rate) + 1


def test_a_bucket_takes_amounts_and_one_above_its_burst_leaves_it_in_debt():
    b = TokenBucket(1000.0, 0.0)  # bytes a second, a second's burst
    assert b.take(0.0, 600) == 0.0 and b.take(0.0, 300) == 0.0
    assert b.take(0.0, 300) == pytest.approx(0.2)  # 100 left: 200 more to come
    assert b.take(1.0, 5000) == 0.0  # a full bucket lets a big one through...
    assert b.take(2.0, 1) == pytest.approx(3.001)  # ...and repays it before the next
    assert b.take(5.01, 1) == 0.0
