"""Malformed input and protocol violations close that connection only; the broker survives."""

from __future__ import annotations

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import MOSQUITTO, uid

pytestmark = pytest.mark.generic


@pytest.fixture
def bystander(broker, clients):
    """A connected client that must be unaffected by the bad connection."""
    t = uid("by/")
    c = clients(version=5)
    c.subscribe(t, 1)
    yield c, t
    assert broker.alive(), "broker process died"
    assert c.is_connected(), "a bystander client was disconnected"
    c.publish(t, b"still-alive", 1)
    (msg,) = c.wait_for(1)
    assert msg.payload == b"still-alive"


def _assert_closed(c: m.RawClient, *, v5_reasons: tuple[int, ...] = (), require_disconnect: bool = False):
    closed, seen = c.wait_closed(5)
    assert closed, f"connection left open; saw {seen}"
    discs = [p for p in seen if p.type == m.DISCONNECT]
    if v5_reasons:
        for d in discs:
            assert d.reason in v5_reasons, d
        if require_disconnect and not MOSQUITTO:
            assert discs, f"no v5 DISCONNECT before close; saw {seen}"
    else:
        assert not discs, f"DISCONNECT sent where not allowed: {seen}"


def test_garbage_bytes_before_connect(broker, raw_clients, bystander):
    c = raw_clients(broker)
    c.send(b"\xff\xfe\xfd\xfc\x00\x01garbage")
    _assert_closed(c)


def test_http_request_on_mqtt_port(broker, raw_clients, bystander):
    c = raw_clients(broker)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _assert_closed(c)


def test_bad_remaining_length_before_connect(broker, raw_clients, bystander):
    c = raw_clients(broker)
    c.send(b"\x10\xff\xff\xff\xff\x01")  # a 5-byte variable byte integer
    _assert_closed(c)


@pytest.mark.parametrize("version", [4, 5])
def test_bad_remaining_length_after_connect(broker, raw_clients, bystander, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("bad"))
    c.send(b"\x30\xff\xff\xff\xff\x01")
    _assert_closed(c, v5_reasons=(0x81, 0x82, 0x95) if version == 5 else ())


@pytest.mark.parametrize("version", [4, 5])
def test_reserved_flags_violation(broker, raw_clients, bystander, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("bad"))
    # SUBSCRIBE with fixed-header flags 0000 instead of 0010 [MQTT-3.8.1-1]
    c.send(m.subscribe(1, [(uid("f/"), 0)], version=version, flags=0))
    _assert_closed(c, v5_reasons=(0x81,) if version == 5 else (), require_disconnect=True)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_qos3_is_malformed(broker, raw_clients, bystander, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("bad"))
    data = bytearray(m.publish(uid("q3/"), b"x", qos=2, packet_id=1, version=version))
    data[0] |= 0x06  # QoS bits 11
    c.send(bytes(data))
    _assert_closed(c, v5_reasons=(0x81,) if version == 5 else (), require_disconnect=True)


@pytest.mark.parametrize("version", [4, 5])
def test_second_connect(broker, raw_clients, bystander, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("bad"))
    c.send(m.connect(uid("bad"), version=version))
    _assert_closed(c, v5_reasons=(0x82,) if version == 5 else (), require_disconnect=True)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_before_connect(broker, clients, raw_clients, bystander, version):
    t = uid("pbc/")
    watcher = clients(version=4)
    watcher.subscribe(t, 0)
    c = raw_clients(broker, version=version)
    c.send(m.publish(t, b"sneaky", qos=0, version=version))
    closed, seen = c.wait_closed(5)
    assert closed
    assert not [p for p in seen if p.type == m.CONNACK]
    watcher.publish(t, b"sentinel", 0)
    got, before = watcher.wait_topic(t)
    assert got.payload == b"sentinel" and before == [], "a PUBLISH before CONNECT was routed"


@pytest.mark.parametrize("version", [4, 5])
def test_wildcard_in_publish_topic(broker, raw_clients, bystander, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("bad"))
    c.publish(uid("w/") + "/+/x", b"x", qos=1)
    _assert_closed(c, v5_reasons=(0x82, 0x90) if version == 5 else ())


def test_invalid_utf8_topic(broker, raw_clients, bystander):
    c = raw_clients(broker, version=4)
    c.connect(uid("bad"))
    body = m.ustr(b"bad/\xff\xfe") + b"x"
    c.send(m.frame(m.PUBLISH, 0, body))
    _assert_closed(c)


def test_truncated_packet_then_close(broker, raw_clients, bystander):
    c = raw_clients(broker, version=4)
    c.connect(uid("bad"))
    c.send(b"\x30\x40abc")  # claims 64 bytes, sends 3
    c.close()


def test_connect_with_bad_protocol_name(broker, raw_clients, bystander):
    c = raw_clients(broker, version=4)
    data = bytearray(m.connect(uid("bad"), version=4))
    data[4:8] = b"MQTX"
    c.send(bytes(data))
    _assert_closed(c)


def test_many_bad_connections_in_a_row(broker, raw_clients, bystander):
    for i in range(30):
        c = raw_clients(broker, version=4)
        c.send(bytes([i * 8 % 256]) + b"\xff" * 7)
        c.close()
    good = raw_clients(broker, version=5)
    good.connect(uid("good"))
    good.send(m.pingreq())
    good.expect(m.PINGRESP)
