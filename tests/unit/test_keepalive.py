"""Keep alive (fleetmq.broker.keepalive): the deadline, and one shared object per interval and backoff."""

from __future__ import annotations

from fleetmq.broker import keepalive
from fleetmq.broker.keepalive import KeepAlive, effective_keepalive, shared_keepalive


def test_the_deadline_is_interval_times_backoff_times_two_after_the_last_packet():
    ka = KeepAlive(60, 0.75)
    assert ka.enabled and ka.timeout == 90.0
    assert ka.remaining(last_recv=100.0, now=150.0) == 40.0
    assert ka.remaining(last_recv=100.0, now=191.0) < 0
    assert not KeepAlive(0, 0.75).enabled


def test_clients_with_the_same_interval_and_backoff_share_one():
    a, b = shared_keepalive(60, 0.75), shared_keepalive(60, 0.75)
    assert a is b and a.timeout == 90.0
    assert shared_keepalive(60, 1.0) is not a and shared_keepalive(60, 1.0).timeout == 120.0
    assert shared_keepalive(30, 0.75).interval == 30


def test_the_shared_ones_stay_bounded():
    for interval in range(keepalive.SHARED_MAX + 10):
        assert shared_keepalive(interval, 0.5).interval == interval
    assert len(keepalive._shared) <= keepalive.SHARED_MAX


def test_the_server_keepalive_overrides_the_clients():
    assert effective_keepalive(60, None) == (60, False)
    assert effective_keepalive(60, 30) == (30, True)
    assert effective_keepalive(60, 60) == (60, False)
