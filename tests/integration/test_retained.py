"""Retained messages, v5 retain handling and retain-as-published."""

from __future__ import annotations

import pytest

from tests.integration.harness import uid

pytestmark = pytest.mark.generic


@pytest.mark.parametrize("version", [4, 5])
def test_retained_set_delivered_cleared(broker, clients, version):
    t = uid("r/")
    pub = clients(version=version)
    pub.publish(t, b"state-1", 1, retain=True)
    pub.publish(t, b"state-2", 1, retain=True)  # replaces

    s1 = clients(version=version)
    s1.subscribe(t, 1)
    (msg,) = s1.wait_for(1)
    assert (msg.payload, msg.retain) == (b"state-2", True)

    # a live publish of a retained message to an existing subscriber has retain=0 (v3.1.1 rule,
    # and v5 with retain-as-published off)
    pub.publish(t, b"state-3", 1, retain=True)
    (live,) = s1.wait_for(1)
    assert (live.payload, live.retain) == (b"state-3", False)

    # an empty retained payload clears it (and is not itself retained)
    pub.publish(t, b"", 1, retain=True)
    s1.wait_for(1)
    s2 = clients(version=version)
    s2.subscribe(t, 1)
    pub.publish(t, b"sentinel", 1)
    _, before = s2.wait_topic(t)
    assert before == []


@pytest.mark.parametrize("version", [4, 5])
def test_retained_with_wildcard_subscription(broker, clients, version):
    base = uid("rw")
    pub = clients(version=version)
    for leaf in ("a", "b", "c/d"):
        pub.publish(f"{base}/{leaf}", leaf.encode(), 1, retain=True)
    sub = clients(version=version)
    sub.subscribe(f"{base}/+", 1)
    got = sorted(r.payload for r in sub.wait_for(2))
    assert got == [b"a", b"b"]
    assert all(r.retain for r in sub.received)
    assert sub.drain(0.2) == []
    for leaf in ("a", "b", "c/d"):
        pub.publish(f"{base}/{leaf}", b"", 1, retain=True)


@pytest.mark.parametrize("version", [4, 5])
def test_retained_qos_downgraded(broker, clients, version):
    t = uid("rq/")
    pub = clients(version=version)
    pub.publish(t, b"q2", 2, retain=True)
    sub = clients(version=version)
    sub.subscribe(t, 1)
    (msg,) = sub.wait_for(1)
    assert msg.qos == 1 and msg.retain
    pub.publish(t, b"", 1, retain=True)


def test_v5_retain_handling(broker, clients):
    t = uid("rh/")
    pub = clients(version=5)
    pub.publish(t, b"kept", 1, retain=True)

    # 0: send retained at every subscribe
    s0 = clients(version=5)
    s0.subscribe(t, 1, retainHandling=0)
    assert s0.wait_for(1)[0].payload == b"kept"
    s0.subscribe(t, 1, retainHandling=0)
    assert s0.wait_for(1)[0].payload == b"kept"

    # 1: only if the subscription did not exist
    s1 = clients(version=5)
    s1.subscribe(t, 1, retainHandling=1)
    assert s1.wait_for(1)[0].payload == b"kept"
    s1.subscribe(t, 1, retainHandling=1)
    # 2: never
    s2 = clients(version=5)
    s2.subscribe(t, 1, retainHandling=2)

    pub.publish(t, b"sentinel", 1)
    for s in (s1, s2):
        m, before = s.wait_topic(t)
        assert m.payload == b"sentinel" and before == [], (m, before)
    pub.publish(t, b"", 1, retain=True)


def test_v5_retain_as_published(broker, clients):
    t = uid("rap/")
    rap = clients(version=5)
    rap.subscribe(t, 1, retainAsPublished=True)
    plain = clients(version=5)
    plain.subscribe(t, 1, retainAsPublished=False)
    pub = clients(version=5)
    pub.publish(t, b"r", 1, retain=True)
    pub.publish(t, b"n", 1, retain=False)
    assert [(r.payload, r.retain) for r in rap.wait_for(2)] == [(b"r", True), (b"n", False)]
    assert [(r.payload, r.retain) for r in plain.wait_for(2)] == [(b"r", False), (b"n", False)]
    pub.publish(t, b"", 1, retain=True)
