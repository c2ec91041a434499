"""fleetmq zone semantics (EMQX seeds): Inflight Window, Message Queue, retransmission timers."""

from __future__ import annotations

import time

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import uid


def _raw_sub(raw_clients, b, topic, *, version=4, qos=1, clean=True, cid=None, props=None):
    c = raw_clients(b, version=version)
    c.connect(cid or uid("sub"), clean=clean, props=props)
    c.subscribe([(topic, qos)])
    return c


def test_emqx_seed_window_of_two(start_broker, client_factory, raw_clients):
    """max_inflight=2, a v3.1.1 subscriber that stops acking, 4 QoS1 messages: 1,2,3,2,3 then 4."""
    b = start_broker(zone_overrides={"max_inflight": 2, "retry_interval": "1s"})
    t = uid("seed/")
    sub = _raw_sub(raw_clients, b, t)
    pub = client_factory(broker=b, version=4)
    for i in range(1, 5):
        pub.publish(t, str(i).encode(), 1)
    first = sub.recv_n(2, timeout=0.8)  # well before retry_interval
    first += sub.recv_all(0.15)
    assert [(p.payload, p.dup) for p in first] == [(b"1", False), (b"2", False)], first
    p1, p2 = first
    sub.ack(p1)
    p3 = sub.expect(m.PUBLISH, 0.5)
    assert (p3.payload, p3.dup) == (b"3", False)
    # no acks for 2 and 3: after retry_interval both are resent, DUP=1, original ids, original order
    resent = sub.recv_n(2, timeout=3, ptype=m.PUBLISH)
    assert [(p.payload, p.dup, p.packet_id) for p in resent] == [
        (b"2", True, p2.packet_id),
        (b"3", True, p3.packet_id),
    ], resent
    for p in resent:
        sub.ack(p)
    p4 = sub.expect(m.PUBLISH, 1)
    assert (p4.payload, p4.dup) == (b"4", False)
    sub.ack(p4)
    seen = [p.payload for p in [*first, p3, *resent, p4]]
    assert seen == [b"1", b"2", b"3", b"2", b"3", b"4"]
    assert sub.recv_all(1.3) == [], "resent after everything was acked"
    assert b.metric("fleetmq_messages_retransmitted_total") >= 2
    assert b.metric("fleetmq_inflight_full_total") >= 1


def test_qos0_never_waits_for_the_window(start_broker, client_factory, raw_clients):
    b = start_broker(zone_overrides={"max_inflight": 2})
    t = uid("q0/")
    sub = _raw_sub(raw_clients, b, t)
    pub = client_factory(broker=b, version=4)
    for i in range(1, 4):
        pub.publish(t, str(i).encode(), 1)
    pub.publish(t, b"zero", 0)
    got = sub.recv_n(3)
    got += sub.recv_all(0.3)
    assert [(p.payload, p.qos) for p in got] == [(b"1", 1), (b"2", 1), (b"zero", 0)], got
    sub.ack(got[0])
    p3 = sub.expect(m.PUBLISH)
    assert p3.payload == b"3"


def test_v5_window_is_min_of_max_inflight_and_receive_maximum(start_broker, client_factory, raw_clients):
    b = start_broker(zone_overrides={"max_inflight": 2})
    t = uid("rm/")
    sub = _raw_sub(raw_clients, b, t, version=5, props={"receive_maximum": 10})
    pub = client_factory(broker=b, version=5)
    for i in range(5):
        pub.publish(t, str(i).encode(), 1)
    got = sub.recv_n(2)
    got += sub.recv_all(0.4)
    assert [p.payload for p in got] == [b"0", b"1"]


def test_max_inflight_one_strict_ordering_across_topics(start_broker, client_factory, raw_clients):
    b = start_broker(zone_overrides={"max_inflight": 1})
    base = uid("strict")
    sub = _raw_sub(raw_clients, b, f"{base}/#", qos=2)
    pub = client_factory(broker=b, version=4)
    expected = []
    for i in range(8):
        topic, qos = (f"{base}/a", 1) if i % 2 == 0 else (f"{base}/b", 2)
        pub.publish(topic, str(i).encode(), qos)
        expected.append((topic, str(i).encode(), qos))
    got = []
    for _ in range(8):
        p = sub.expect(m.PUBLISH, 3)
        got.append((p.topic, p.payload, p.qos))
        assert sub.recv_all(0.15) == [], "a second delivery while one is in flight"
        sub.ack(p)
        if p.qos == 2:
            rel = sub.expect(m.PUBREL)
            assert sub.recv_all(0.1) == [], "a delivery while a PUBREL is in flight"
            sub.ack(rel)
    assert got == expected


def test_drop_oldest_when_queue_full(start_broker, client_factory):
    b = start_broker(zone_overrides={"max_mqueue_len": 3})
    cid, t = uid("dq"), uid("dq/")
    sub = client_factory(cid, broker=b, version=4, clean=False)
    sub.subscribe(t, 1)
    sub.disconnect()
    before = b.metric("fleetmq_messages_dropped_total", reason="queue_full")
    pub = client_factory(broker=b, version=4)
    for i in range(1, 6):
        pub.publish(t, str(i).encode(), 1)
    after = b.metric("fleetmq_messages_dropped_total", reason="queue_full")
    assert after - before == 2
    sub.connect()
    assert sub.session_present
    assert [r.payload for r in sub.wait_for(3)] == [b"3", b"4", b"5"]
    assert sub.drain(0.3) == []


def test_drop_oldest_online_behind_full_window(start_broker, client_factory, raw_clients):
    """An online client with a full window and a full queue also loses the oldest queued message."""
    b = start_broker(zone_overrides={"max_inflight": 1, "max_mqueue_len": 2})
    t = uid("dq/")
    sub = _raw_sub(raw_clients, b, t)
    pub = client_factory(broker=b, version=4)
    for i in range(1, 6):  # 1 in flight, 2..5 queued into a queue of 2 -> 2 and 3 dropped
        pub.publish(t, str(i).encode(), 1)
    got = []
    for _ in range(3):
        p = sub.expect(m.PUBLISH, 3)
        got.append(p.payload)
        sub.ack(p)
    assert got == [b"1", b"4", b"5"]
    assert sub.recv_all(0.3) == []
    assert b.metric("fleetmq_messages_dropped_total", reason="queue_full") == 2


@pytest.mark.parametrize("store_qos0", [True, False])
def test_mqueue_store_qos0(start_broker, client_factory, store_qos0):
    b = start_broker(zone_overrides={"mqueue_store_qos0": store_qos0})
    cid, t = uid("q0"), uid("q0/")
    sub = client_factory(cid, broker=b, version=4, clean=False)
    sub.subscribe(t, 1)
    sub.disconnect()
    before = b.metric("fleetmq_messages_dropped_total", reason="qos0_offline")
    pub = client_factory(broker=b, version=4)
    pub.publish(t, b"zero", 0)
    pub.publish(t, b"one", 1)
    sub.connect()
    got = []
    while not got or got[-1] != b"one":
        got.append(sub.wait_for(1)[0].payload)
    if store_qos0:
        assert got == [b"zero", b"one"]
    else:
        assert got == [b"one"]
        assert b.metric("fleetmq_messages_dropped_total", reason="qos0_offline") - before == 1


@pytest.mark.parametrize("version", [4, 5])
def test_timer_resend_only_for_v311(start_broker, client_factory, raw_clients, version):
    """retry_interval resends for v3.1.1 sessions; MQTT 5 forbids resends other than on reconnect."""
    b = start_broker(zone_overrides={"retry_interval": "1s"})
    t = uid("rt/")
    sub = _raw_sub(raw_clients, b, t, version=version, qos=2)
    pub = client_factory(broker=b, version=4)
    pub.publish(t, b"q1", 1)
    pub.publish(t, b"q2", 2)
    p1, p2 = sub.recv_n(2)
    sub.ack(p2)  # PUBREC: the broker answers PUBREL, which we leave unanswered
    rel = sub.expect(m.PUBREL)
    later = sub.recv_all(2.5)
    if version == 5:
        assert later == [], f"v5 session got timer-based resends: {later}"
    else:
        summary = [(p.name, p.packet_id, p.dup) for p in later]
        assert ("PUBLISH", p1.packet_id, True) in summary, summary
        assert ("PUBREL", rel.packet_id, False) in summary, summary
        assert summary.index(("PUBLISH", p1.packet_id, True)) < summary.index(
            ("PUBREL", rel.packet_id, False)
        )


@pytest.mark.parametrize("version", [4, 5])
def test_resume_resends_before_queued(start_broker, client_factory, raw_clients, version):
    """Resume with a window of 2: the 2 unacked are resent (DUP, same ids) before the queued ones."""
    b = start_broker(zone_overrides={"max_inflight": 2})
    cid, t = uid("rs"), uid("rs/")
    props = {"session_expiry_interval": 60} if version == 5 else None
    sub = _raw_sub(raw_clients, b, t, version=version, clean=False, cid=cid, props=props)
    pub = client_factory(broker=b, version=4)
    for i in range(1, 5):
        pub.publish(t, str(i).encode(), 1)
    first = sub.recv_n(2)
    first += sub.recv_all(0.3)
    assert [p.payload for p in first] == [b"1", b"2"]
    sub.close()
    time.sleep(0.2)
    c2 = raw_clients(b, version=version)
    assert c2.connect(cid, clean=False, props=props).session_present
    resent = c2.recv_n(2)
    resent += c2.recv_all(0.3)
    assert [(p.payload, p.dup, p.packet_id) for p in resent] == [
        (b"1", True, first[0].packet_id),
        (b"2", True, first[1].packet_id),
    ], resent
    got = []
    for p in resent:
        c2.ack(p)
    while len(got) < 2:
        p = c2.expect(m.PUBLISH)
        got.append((p.payload, p.dup))
        c2.ack(p)
    assert got == [(b"3", False), (b"4", False)]
