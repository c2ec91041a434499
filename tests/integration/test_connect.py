"""CONNECT / CONNACK, session present, protocol versions, PINGREQ, client identifiers."""

from __future__ import annotations

import pytest

from tests.integration import mqttraw as m
from tests.integration.harness import uid

pytestmark = pytest.mark.generic


@pytest.mark.parametrize("version", [3, 4, 5])
def test_connect_connack(broker, clients, version):
    c = clients(version=version)
    assert c.connack["reason_code"] == 0
    assert c.session_present is False
    t = uid("conn/")
    c.subscribe(t, 1)
    c.publish(t, b"hello", 1)
    (msg,) = c.wait_for(1)
    assert (msg.topic, msg.payload, msg.qos) == (t, b"hello", 1)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_raw_connack_bytes(broker, raw_clients, version):
    c = raw_clients(broker, version=version)
    ack = c.connect(uid("raw"), clean=True)
    assert ack.type == m.CONNACK and ack.reason == 0 and not ack.session_present
    if version == 5:
        # a v5 CONNACK carries a properties section (possibly empty); decoding it must work
        assert isinstance(ack.props, dict)
    else:
        assert len(ack.raw) == 2


@pytest.mark.parametrize("version", [4, 5])
def test_session_present_flag(broker, clients, version):
    cid = uid("sp")
    kw = {"session_expiry": 60} if version == 5 else {}
    c = clients(cid, version=version, clean=False, **kw)
    assert c.session_present is False  # no session existed
    c.subscribe(uid("sp/"), 1)
    c.disconnect()
    c.connect()
    assert c.session_present is True
    c.disconnect()
    if version == 5:
        c.connect(clean=True)  # Clean Start discards the session
        assert c.session_present is False


def test_clean_session_v311_discards_session(broker, clients):
    cid = uid("cs")
    c = clients(cid, version=4, clean=False)
    c.subscribe(uid("cs/"), 1)
    c.disconnect()
    c2 = clients(cid, version=4, clean=True)
    assert c2.session_present is False
    c2.disconnect()
    c3 = clients(cid, version=4, clean=False)
    assert c3.session_present is False  # the clean session discarded the old one


@pytest.mark.parametrize("version", [3, 4, 5])
def test_pingreq_pingresp(broker, raw_clients, version):
    c = raw_clients(broker, version=version)
    c.connect(uid("ping"), keepalive=30)
    for _ in range(3):
        c.send(m.pingreq())
        p = c.expect(m.PINGRESP, 3)
        assert p.raw == b""


def test_v311_empty_client_id_clean_session_accepted(broker, raw_clients):
    c = raw_clients(broker, version=4)
    ack = c.connect("", clean=True)
    assert ack.reason == 0
    c.send(m.pingreq())
    c.expect(m.PINGRESP)


def test_v311_empty_client_id_persistent_rejected(broker, raw_clients):
    c = raw_clients(broker, version=4)
    ack = c.connect("", clean=False, check=False)
    assert ack.reason == 0x02  # identifier rejected [MQTT-3.1.3-8]
    closed, _ = c.wait_closed(3)
    assert closed


def test_v5_assigned_client_identifier(broker, raw_clients):
    c = raw_clients(broker, version=5)
    ack = c.connect("", clean=True)
    assigned = ack.props.get("assigned_client_identifier")
    assert assigned, f"no Assigned Client Identifier in {ack!r}"
    # the assigned id is usable: a second client with an empty id gets a different one
    c2 = raw_clients(broker, version=5)
    ack2 = c2.connect("", clean=True)
    assert ack2.props.get("assigned_client_identifier") not in (None, assigned)


def test_v5_connack_properties_are_sane(broker, raw_clients):
    c = raw_clients(broker, version=5)
    ack = c.connect(uid("props"))
    props = ack.props
    if "receive_maximum" in props:
        assert props["receive_maximum"] > 0
    if "maximum_qos" in props:
        assert props["maximum_qos"] in (0, 1)
    if "reason_string" in props:  # optional
        assert isinstance(props["reason_string"], str)


def test_unsupported_protocol_level(broker, raw_clients):
    c = raw_clients(broker, version=4)
    data = m.connect(uid("lvl"), version=4)
    # protocol level byte is after the 2+4 byte protocol name, at offset 2 (header) + 6
    bad = bytearray(data)
    bad[8] = 9
    c.send(bytes(bad))
    closed, seen = c.wait_closed(3)
    assert closed
    if seen:  # v3.1.1: CONNACK 0x01 unacceptable protocol version (or v5-style 0x84)
        assert seen[0].type == m.CONNACK and seen[0].reason in (0x01, 0x84)
