"""The broker's lock-free histogram (metrics.Histogram): a value counts in the first bucket whose upper
bound it does not exceed, as Prometheus' `le` means, and the buckets it exports are cumulative."""

from __future__ import annotations

import bisect
import random

from fleetmq.broker.metrics import LATENCY_BUCKETS, Histogram


def test_a_value_counts_in_the_first_bucket_it_does_not_exceed():
    h = Histogram((0.1, 1.0, 10.0))
    for v in (0.0, 0.1, 0.10001, 1.0, 5.0, 10.0, 10.5, 1e9):
        h.observe(v)
    assert h.counts == [2, 2, 2, 2]
    assert h.buckets() == [("0.1", 2), ("1.0", 4), ("10.0", 6), ("+Inf", 8)]
    assert h.sum == sum((0.0, 0.1, 0.10001, 1.0, 5.0, 10.0, 10.5, 1e9))


def test_buckets_agree_with_bisect_on_the_latency_bounds():
    rnd = random.Random(30)
    h = Histogram(LATENCY_BUCKETS)
    want = [0] * (len(LATENCY_BUCKETS) + 1)
    values = [*LATENCY_BUCKETS, *(rnd.uniform(0, 2 * LATENCY_BUCKETS[-1]) for _ in range(2000))]
    for v in values:
        h.observe(v)
        want[bisect.bisect_left(LATENCY_BUCKETS, v)] += 1
    assert h.counts == want
