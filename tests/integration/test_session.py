"""Persistent sessions, offline queues, session expiry, retransmission on resume, takeover."""

from __future__ import annotations

import time

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import uid

pytestmark = pytest.mark.generic


def _persistent(version: int) -> dict:
    return {"session_expiry": 60} if version == 5 else {}


@pytest.mark.parametrize("version", [4, 5])
def test_offline_messages_delivered_on_reconnect(broker, clients, version):
    cid, t = uid("ps"), uid("ps/")
    sub = clients(cid, version=version, clean=False, **_persistent(version))
    sub.subscribe(t, 1)
    sub.disconnect()
    pub = clients(version=version)
    for i in range(5):
        pub.publish(t, f"m{i}".encode(), 1)
    sub.connect()
    assert sub.session_present is True
    got = [r.payload for r in sub.wait_for(5)]
    assert got == [f"m{i}".encode() for i in range(5)]
    assert sub.drain(0.2) == []


@pytest.mark.parametrize("version", [4, 5])
def test_offline_qos2_delivered_once(broker, clients, version):
    cid, t = uid("ps"), uid("ps/")
    sub = clients(cid, version=version, clean=False, **_persistent(version))
    sub.subscribe(t, 2)
    sub.disconnect()
    pub = clients(version=version)
    for i in range(3):
        pub.publish(t, f"m{i}".encode(), 2)
    sub.connect()
    got = sub.wait_for(3)
    assert [(r.payload, r.qos) for r in got] == [(f"m{i}".encode(), 2) for i in range(3)]
    assert sub.drain(0.3) == []


def test_v5_session_expiry_zero_ends_session_at_disconnect(broker, clients):
    cid, t = uid("se"), uid("se/")
    sub = clients(cid, version=5, clean=False, session_expiry=0)
    sub.subscribe(t, 1)
    sub.disconnect()
    pub = clients(version=5)
    pub.publish(t, b"lost", 1)
    sub.connect()
    assert sub.session_present is False
    pub.publish(t, b"after", 1)  # the subscription is gone too
    assert sub.drain(0.5) == []


def test_v5_session_expires_after_interval(broker, clients):
    cid, t = uid("se"), uid("se/")
    sub = clients(cid, version=5, clean=False, session_expiry=1)
    sub.subscribe(t, 1)
    sub.disconnect()
    time.sleep(2.2)
    sub.connect()
    assert sub.session_present is False


def test_v5_session_expiry_changed_at_disconnect(broker, clients):
    """DISCONNECT may set a new (non-zero) Session Expiry Interval; 0 at CONNECT cannot be raised,
    but a non-zero one can be lowered to 0 which ends the session."""
    cid, t = uid("se"), uid("se/")
    sub = clients(cid, version=5, clean=False, session_expiry=60)
    sub.subscribe(t, 1)
    sub.disconnect(props={"SessionExpiryInterval": 0})
    sub.connect()
    assert sub.session_present is False


@pytest.mark.parametrize("version", [4, 5])
def test_resume_resends_unacked_in_order_before_new(broker, clients, raw_clients, version):
    """On resume every unacked PUBLISH (DUP=1) and PUBREL is resent in original order with the original
    packet ids, before any message queued while offline [MQTT-4.4.0-1]."""
    cid, t = uid("rs"), uid("rs/")
    props = {"session_expiry_interval": 60} if version == 5 else None
    c = raw_clients(broker, version=version)
    c.connect(cid, clean=False, props=props)
    c.subscribe([(t, 2)])
    pub = clients(version=4)
    pub.publish(t, b"m1", 1)
    p1 = c.expect(m.PUBLISH)
    pub.publish(t, b"m2", 2)
    p2 = c.expect(m.PUBLISH)
    c.send(m.ack(m.PUBREC, p2.packet_id, version=version))
    rel = c.expect(m.PUBREL)
    assert rel.packet_id == p2.packet_id
    pub.publish(t, b"m3", 2)
    p3 = c.expect(m.PUBLISH)
    assert [(p.payload, p.qos, p.dup) for p in (p1, p2, p3)] == [
        (b"m1", 1, False),
        (b"m2", 2, False),
        (b"m3", 2, False),
    ]
    c.close()  # no acks for m1, no PUBCOMP for m2, no PUBREC for m3
    time.sleep(0.2)
    pub.publish(t, b"m4", 1)  # queued while offline

    c2 = raw_clients(broker, version=version)
    ack = c2.connect(cid, clean=False, props=props)
    assert ack.session_present
    got = c2.recv_n(4, timeout=5)
    summary = [(p.name, p.packet_id, p.payload, p.dup) for p in got]
    assert summary[:3] == [
        ("PUBLISH", p1.packet_id, b"m1", True),
        ("PUBREL", p2.packet_id, b"", False),
        ("PUBLISH", p3.packet_id, b"m3", True),
    ], summary
    assert got[3].type == m.PUBLISH and got[3].payload == b"m4" and not got[3].dup
    for p in got:
        c2.ack(p)
    # m3 continues: PUBREC -> PUBREL -> PUBCOMP
    rel3 = c2.expect(m.PUBREL)
    assert rel3.packet_id == p3.packet_id
    c2.ack(rel3)
    assert c2.recv_all(0.3) == []
    c2.disconnect()


def _taken_over(broker, raw_clients, version: int, *, clean: bool):
    """A persistent session subscribed to a topic at QoS 1, then a second connection with its client id:
    (topic, first connection, second connection, the second's CONNACK)."""
    cid, t = uid("to"), uid("to/")
    props = {"session_expiry_interval": 60} if version == 5 else None
    first = raw_clients(broker, version=version)
    first.connect(cid, clean=False, props=props)
    first.subscribe([(t, 1)])
    second = raw_clients(broker, version=version)
    return t, first, second, second.connect(cid, clean=clean, props=props)


@pytest.mark.parametrize("version", [4, 5])
def test_takeover_closes_first_connection(broker, clients, raw_clients, version):
    t, first, second, ack = _taken_over(broker, raw_clients, version, clean=False)
    assert ack.session_present is True
    closed, seen = first.wait_closed(5)
    assert closed, "first connection still open after takeover"
    if version == 5:
        discs = [p for p in seen if p.type == m.DISCONNECT]
        if discs:  # optional for mosquitto; required for fleetmq (test_fleetmq_takeover)
            assert discs[0].reason == 0x8E
    # the session (and its subscription) continues on the second connection
    pub = clients(version=4)
    pub.publish(t, b"after", 1)
    p = second.expect(m.PUBLISH)
    assert p.payload == b"after"
    second.ack(p)


@pytest.mark.parametrize("version", [4, 5])
def test_takeover_with_clean_start_drops_session(broker, clients, raw_clients, version):
    t, first, second, ack = _taken_over(broker, raw_clients, version, clean=True)
    assert ack.session_present is False
    closed, _ = first.wait_closed(5)
    assert closed
    pub = clients(version=4)
    pub.publish(t, b"after", 1)
    assert second.recv_all(0.5) == []


def test_paho_takeover_v5_reason(broker, clients):
    cid = uid("to")
    a = clients(cid, version=5, clean=False, session_expiry=60)
    b = clients(cid, version=5, clean=False, session_expiry=60)
    assert b.session_present
    assert a.wait_disconnected(5)
    assert b.is_connected()
