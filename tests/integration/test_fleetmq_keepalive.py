"""fleetmq keep alive (backoff, server_keepalive) and incoming QoS 2 limits."""

from __future__ import annotations

import time

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import uid
from tests.support import wait_until


def _silent_until_closed(c: m.RawClient, timeout: float) -> tuple[float, list[m.Packet]]:
    t0 = time.monotonic()
    closed, seen = c.wait_closed(timeout)
    assert closed, f"not closed within {timeout}s"
    return time.monotonic() - t0, seen


@pytest.mark.parametrize(
    ("backoff", "version", "lo", "hi"),
    [(0.75, 4, 2.5, 4.5), (0.75, 5, 2.5, 4.5), (1.5, 5, 5.5, 7.5)],
)
def test_keepalive_timeout_with_backoff(start_broker, raw_clients, backoff, version, lo, hi):
    b = start_broker(zone_overrides={"keepalive_backoff": backoff})
    before = b.metric("fleetmq_keepalive_timeouts_total")
    c = raw_clients(b, version=version)
    c.connect(uid("ka"), keepalive=2)
    elapsed, seen = _silent_until_closed(c, hi + 1)
    assert lo <= elapsed <= hi, f"closed after {elapsed:.2f}s, expected {lo}..{hi}"
    if version == 5:
        assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x8D], seen
    else:
        assert not seen
    wait_until(lambda: b.metric("fleetmq_keepalive_timeouts_total") - before == 1, 3, msg="keepalive metric")


def test_pingreq_keeps_connection_alive(start_broker, raw_clients):
    b = start_broker(zone_overrides={"keepalive_backoff": 0.75})
    c = raw_clients(b, version=4)
    c.connect(uid("ka"), keepalive=1)  # timeout 1.5 s
    for _ in range(5):
        time.sleep(0.7)
        c.send(m.pingreq())
        c.expect(m.PINGRESP, 1)


def test_server_keepalive_override(start_broker, raw_clients):
    b = start_broker(zone_overrides={"server_keepalive": 5, "keepalive_backoff": 0.75})
    c = raw_clients(b, version=5)
    ack = c.connect(uid("ska"), keepalive=1)  # the client asks for 1 s (1.5 s timeout)
    assert ack.props.get("server_keep_alive") == 5
    elapsed, seen = _silent_until_closed(c, 10)
    assert 7.0 <= elapsed <= 9.0, f"closed after {elapsed:.2f}s; server_keepalive 5 gives 7.5 s"
    assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x8D]


def test_keepalive_zero_disables_timeout(start_broker, raw_clients):
    b = start_broker(zone_overrides={"keepalive_backoff": 0.75})
    c = raw_clients(b, version=4)
    c.connect(uid("ka0"), keepalive=0)
    assert c.recv_all(2.0) == []
    c.send(m.pingreq())
    c.expect(m.PINGRESP)


# ------------------------------------------------------------------ incoming QoS 2
def test_max_awaiting_rel(start_broker, client_factory, raw_clients):
    b = start_broker(zone_overrides={"max_awaiting_rel": 2})
    t = uid("ar/")
    sub = client_factory(broker=b, version=4)
    sub.subscribe(t, 2)
    c = raw_clients(b, version=5)
    c.connect(uid("ar"))
    for pid in (1, 2, 3):
        c.publish(t, str(pid).encode(), qos=2, packet_id=pid)
    recs = c.recv_n(3, ptype=m.PUBREC)
    assert [(p.packet_id, p.reason) for p in recs] == [(1, 0), (2, 0), (3, 0x93)]
    c.send(m.ack(m.PUBREL, 1, version=5))
    assert c.expect(m.PUBCOMP).reason == 0
    c.publish(t, b"4", qos=2, packet_id=4)  # room again
    assert c.expect(m.PUBREC).reason == 0
    got = sorted(r.payload for r in sub.wait_for(3))
    assert got == [b"1", b"2", b"4"]  # the refused one is not delivered
    assert sub.drain(0.3) == []


def test_await_rel_timeout(start_broker, raw_clients):
    b = start_broker(zone_overrides={"await_rel_timeout": "1s"})
    c = raw_clients(b, version=5)
    c.connect(uid("art"))
    before = b.metric("fleetmq_messages_dropped_total", reason="awaiting_rel_timeout")
    c.publish(uid("art/"), b"x", qos=2, packet_id=9)
    assert c.expect(m.PUBREC).packet_id == 9
    assert b.metric("fleetmq_awaiting_rel_messages") >= 1
    wait_until(
        lambda: b.metric("fleetmq_messages_dropped_total", reason="awaiting_rel_timeout") - before == 1,
        5,
        interval=0.1,
        msg="awaiting_rel_timeout drop",
    )
    c.send(m.ack(m.PUBREL, 9, version=5))
    comp = c.expect(m.PUBCOMP)
    assert (comp.packet_id, comp.reason) == (9, 0x92)  # Packet Identifier not found
    c.send(m.pingreq())
    c.expect(m.PINGRESP)  # the connection stays up


# ------------------------------------------------------------------ zone limits
def test_zone_max_packet_size(start_broker, raw_clients):
    b = start_broker(zone_overrides={"max_packet_size": 1024})
    c = raw_clients(b, version=5)
    ack = c.connect(uid("mps"))
    assert ack.props.get("maximum_packet_size") == 1024
    c.publish(uid("mps/"), b"x" * 900, qos=1)
    assert c.expect(m.PUBACK).reason < 0x80
    c.publish(uid("mps/"), b"x" * 2000, qos=1)
    closed, seen = c.wait_closed(3)
    assert closed
    assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x95], seen
    v4 = raw_clients(b, version=4)
    v4.connect(uid("mps"))
    v4.publish(uid("mps/"), b"x" * 2000, qos=1)
    closed, seen = v4.wait_closed(3)
    assert closed and not seen


def test_zone_session_expiry_cap(start_broker, client_factory):
    b = start_broker(zone_overrides={"session_expiry_interval": "1s"})
    v5 = client_factory(uid("cap"), broker=b, version=5, clean=False, session_expiry=3600)
    # the server tells the client the interval it will actually use
    assert v5.connack["props"].get("SessionExpiryInterval") == 1
    v4 = client_factory(uid("cap"), broker=b, version=4, clean=False)
    for c in (v5, v4):
        c.subscribe(uid("cap/"), 1)
        c.disconnect()
    before = b.metric("fleetmq_session_events_total", event="expired")
    time.sleep(2.2)
    for c in (v5, v4):
        c.connect()
        assert c.session_present is False, "a session outlived the zone's session_expiry_interval"
    assert b.metric("fleetmq_session_events_total", event="expired") - before == 2


def test_session_events_metrics(start_broker, client_factory):
    b = start_broker()
    cid = uid("ev")
    c = client_factory(cid, broker=b, version=4, clean=False)
    c.disconnect()
    c.connect()
    assert b.metric("fleetmq_session_events_total", event="created") == 1
    assert b.metric("fleetmq_session_events_total", event="resumed") == 1
    c.disconnect()
    clean = client_factory(cid, broker=b, version=4, clean=True)
    assert not clean.session_present
    assert b.metric("fleetmq_session_events_total", event="discarded") == 1
