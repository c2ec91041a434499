"""The PROXY protocol on a broker's tcp listener: the client's address (as an auth service is told it,
%a) is the one the header carries; a bad or missing header closes that connection alone."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from .authservice import AuthService
from .harness import MOSQUITTO, uid
from .mqttraw import CONNACK, PUBACK, RawClient

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


@pytest.fixture
def service() -> Iterator[AuthService]:
    s = AuthService()
    yield s
    s.stop()


@pytest.fixture
def proxied(start_broker, service):
    return start_broker({
        "listeners": [
            {"name": "lb", "bind": "127.0.0.1:0", "zone": "default", "proxy_protocol": True,
             "proxy_protocol_timeout": "1s"},
            {"name": "direct", "bind": "127.0.0.1:0", "zone": "default"},
        ],
        "zones": {"default": {"authentication": [{"mechanism": "http", "url": service.url}]}},
    })  # fmt: skip


def through_balancer(bp, header: bytes) -> RawClient:
    c = RawClient(bp.host, bp.ports["lb"], version=5)
    c.send(header)
    return c


@pytest.mark.parametrize(
    "header",
    [
        b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 1883\r\n",
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c"
        + bytes([203, 0, 113, 7, 10, 0, 0, 1])
        + b"\xc8\x22\x07\x5b",
    ],
    ids=["v1", "v2"],
)
def test_the_clients_address_is_the_one_the_header_carries(proxied, service, header):
    with through_balancer(proxied, header) as c:
        c.connect(uid("lb"), username="alice", password=b"x")
    assert service.requests[-1]["peerhost"] == "203.0.113.7"
    with RawClient(proxied.host, proxied.ports["direct"], version=5) as c:  # a listener without it
        c.connect(uid("d"), username="alice", password=b"x")
    assert service.requests[-1]["peerhost"] == "127.0.0.1"


def test_a_bad_or_missing_header_closes_that_connection_alone(proxied, service):
    with RawClient(proxied.host, proxied.ports["lb"], version=5) as ok:
        ok.send(b"PROXY TCP4 198.51.100.1 10.0.0.1 4000 1883\r\n")
        ok.connect(uid("ok"), username="alice", password=b"x")
        for bad in (
            b"PROXY TCP4 999.1.1.1 10.0.0.1 1 2\r\n",
            b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
        ):
            with through_balancer(proxied, bad) as c:
                closed, seen = c.wait_closed(timeout=3)
                assert closed and not [p for p in seen if p.type == CONNACK], bad
        with socket.create_connection((proxied.host, proxied.ports["lb"])) as silent:  # no header at all
            t0 = time.monotonic()
            silent.settimeout(5)
            assert silent.recv(1) == b"" and time.monotonic() - t0 < 3  # closed after the 1 s timeout
        ok.publish("t", b"still here", qos=1, packet_id=1)
        ok.expect(PUBACK)  # the good connection never noticed
    assert proxied.metric("fleetmq_proxy_protocol_refused_total", listener="lb") == 3
    # (a PROXY header where none is expected is a malformed packet, as anything but a CONNECT)
    with RawClient(proxied.host, proxied.ports["direct"], version=5) as c:
        c.send(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 1883\r\n")
        assert c.wait_closed(timeout=3)[0]


def test_acl_rules_name_the_address_the_header_carries(start_broker):
    bp = start_broker({
        "listeners": [{"name": "lb", "bind": "127.0.0.1:0", "zone": "default", "proxy_protocol": True}],
        "zones": {"default": {"acl_default": "deny",
                              "acl": [{"permission": "allow", "action": "publish", "filter": "sites/%a/#"}]}},
    })  # fmt: skip
    with through_balancer(bp, b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 1883\r\n") as c:
        c.connect(uid("lb"))
        c.publish("sites/203.0.113.7/state", b"x", qos=1, packet_id=1)
        c.publish("sites/127.0.0.1/state", b"x", qos=1, packet_id=2)
        acks = c.recv_n(2, ptype=PUBACK)
    assert acks[0].reason < 0x80 and acks[1].reason == 0x87, acks
