"""Subscriptions: wildcards, $-topics, unsubscribe."""

from __future__ import annotations

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import uid

pytestmark = pytest.mark.generic

VERSIONS = [4, 5]


@pytest.mark.parametrize("version", VERSIONS)
def test_plus_wildcard(broker, clients, version):
    base = uid("w")
    sub = clients(version=version)
    sub.subscribe(f"{base}/+/temp", 1)
    pub = clients(version=version)
    for t in [f"{base}/a/temp", f"{base}/a/b/temp", f"{base}/temp", f"{base}/b/temp", f"{base}/b/hum"]:
        pub.publish(t, t.encode(), 1)
    pub.publish(f"{base}/z/temp", b"end", 1)
    got = [r.topic for r in sub.wait_for(3)]
    assert got == [f"{base}/a/temp", f"{base}/b/temp", f"{base}/z/temp"]
    assert sub.drain(0.2) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_hash_wildcard(broker, clients, version):
    base = uid("w")
    sub = clients(version=version)
    sub.subscribe(f"{base}/a/#", 1)
    pub = clients(version=version)
    topics = [f"{base}/a", f"{base}/a/b", f"{base}/a/b/c", f"{base}/ab", f"{base}/b/a"]
    for t in topics:
        pub.publish(t, b"x", 1)
    pub.publish(f"{base}/a/end", b"end", 1)
    got = [r.topic for r in sub.wait_for(4)]
    # "a/#" also matches the parent "a" [MQTT-4.7.1-2]
    assert got == [f"{base}/a", f"{base}/a/b", f"{base}/a/b/c", f"{base}/a/end"]
    assert sub.drain(0.2) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_dollar_topics_not_matched_by_root_wildcards(broker, clients, version):
    name = uid("d")
    dollar = f"$fmq{name}/x"
    hash_sub = clients(version=version)
    hash_sub.subscribe("#", 0)
    plus_sub = clients(version=version)
    plus_sub.subscribe("+/x", 0)
    explicit = clients(version=version)
    explicit.subscribe(f"$fmq{name}/#", 0)
    pub = clients(version=version)
    pub.publish(dollar, b"dollar", 1)
    (msg,) = explicit.wait_for(1)
    assert msg.topic == dollar
    # sentinel: a normal topic both wildcard subscribers see, published after the $ topic
    sentinel = f"{name}/x"
    pub.publish(sentinel, b"sentinel", 1)
    _, before = hash_sub.wait_topic(sentinel)
    assert all(not r.topic.startswith("$fmq") for r in before), before
    _, before = plus_sub.wait_topic(sentinel)
    assert all(r.topic != dollar for r in before), before


@pytest.mark.parametrize("version", VERSIONS)
def test_unsubscribe_stops_delivery(broker, clients, version):
    t = uid("u/")
    t2 = uid("u/")
    sub = clients(version=version)
    sub.subscribe([(t, 1), (t2, 1)])
    pub = clients(version=version)
    pub.publish(t, b"1", 1)
    assert sub.wait_for(1)[0].payload == b"1"
    codes = sub.unsubscribe(t)
    if version == 5:
        assert codes == [0]
    pub.publish(t, b"2", 1)
    pub.publish(t2, b"sentinel", 1)
    _, before = sub.wait_topic(t2)
    assert before == []


@pytest.mark.parametrize("version", VERSIONS)
def test_suback_granted_qos(broker, raw_clients, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("sq"))
    base = uid("sq/")
    ack = c.subscribe([(f"{base}/0", 0), (f"{base}/1", 1), (f"{base}/2", 2)])
    assert ack.codes == [0, 1, 2]


@pytest.mark.parametrize("version", VERSIONS)
def test_delivered_qos_is_min_of_pub_and_sub(broker, clients, version):
    t = uid("q/")
    sub = clients(version=version)
    sub.subscribe(t, 1)
    pub = clients(version=version)
    pub.publish(t, b"q2", 2)
    pub.publish(t, b"q0", 0)
    got = sorted((r.payload, r.qos) for r in sub.wait_for(2))
    assert got == [(b"q0", 0), (b"q2", 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_overlapping_subscriptions_deliver(broker, clients, version):
    base = uid("ov")
    sub = clients(version=version)
    sub.subscribe([(f"{base}/#", 0), (f"{base}/a", 1)])
    pub = clients(version=version)
    pub.publish(f"{base}/a", b"x", 1)
    msgs = sub.wait_for(1)
    # the server may deliver once (max QoS of the matching subscriptions) or once per subscription
    extra = sub.drain(0.3)
    assert len(msgs + extra) in (1, 2)
    assert max(r.qos for r in msgs + extra) == 1


def test_invalid_subscription_filter_rejected(broker, raw_clients):
    c = raw_clients(broker, version=5)
    c.connect(uid("bad"))
    pid = c.pid()
    c.send(m.subscribe(pid, [("a/#/b", 0)], version=5))
    # either SUBACK with a failure code (0x8F topic filter invalid) or DISCONNECT/close
    try:
        p = c.recv(3)
    except m.ConnectionClosed:
        return
    assert p is not None
    if p.type == m.SUBACK:
        assert p.codes[0] >= 0x80
    else:
        assert p.type == m.DISCONNECT
