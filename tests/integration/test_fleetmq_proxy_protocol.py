"""The PROXY protocol on a broker's tcp and tls listeners: the client's address (as an auth service is told it,
%a) is the one the header carries; a bad or missing header closes that connection alone."""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from . import mqttraw
from .harness import MOSQUITTO, uid
from .mqttraw import CONNACK, PUBACK, RawClient

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


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


class TlsAfterHeader:
    """A client behind a balancer that sends the PROXY header and the client's TLS ClientHello in one
    segment (so a broker reading the header off the socket must leave the handshake's bytes there)."""

    def __init__(self, port: int, header: bytes, ca: str) -> None:
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        ctx = ssl.create_default_context(cafile=ca)
        self.tls = ctx.wrap_bio(self._in, self._out, server_hostname="127.0.0.1")
        first = True
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                out = self._out.read()
                self.raw.sendall(header + out if first else out)
                first = False
                data = self.raw.recv(65536)
                if not data:
                    raise ConnectionError("closed during the TLS handshake") from None
                self._in.write(data)
        self.raw.sendall(self._out.read())

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self.raw.sendall(self._out.read())

    def recv(self) -> bytes:
        while True:
            try:
                return self.tls.read(65536)
            except ssl.SSLWantReadError:
                data = self.raw.recv(65536)
                if not data:
                    return b""
                self._in.write(data)

    def close(self) -> None:
        self.raw.close()


def test_a_tls_listener_reads_the_header_before_its_handshake(start_broker, service, pki):
    cert, key = pki["server"]
    bp = start_broker({
        "listeners": [{"name": "lb", "bind": "127.0.0.1:0", "zone": "default", "protocol": "tls",
                       "certfile": cert, "keyfile": key, "proxy_protocol": True, "proxy_protocol_timeout": "1s"}],
        "zones": {"default": {"authentication": [{"mechanism": "http", "url": service.url}]}},
    })  # fmt: skip
    port = bp.ports["lb"]
    for source, header in (
        ("203.0.113.9", b"PROXY TCP4 203.0.113.9 10.0.0.1 51234 8883\r\n"),
        ("198.51.100.4", b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + bytes([198, 51, 100, 4, 10, 0, 0, 1])
         + b"\xc8\x22\x22\xb3"),
    ):  # fmt: skip
        c = TlsAfterHeader(port, header, pki["ca"])
        c.send(mqttraw.connect(uid("tls"), version=5, username="alice", password=b"x"))
        ack = c.recv()
        c.close()
        assert ack[:1] == b"\x20" and ack[3] == 0, f"CONNACK refused or missing: {ack!r}"
        assert service.requests[-1]["peerhost"] == source
    # a TLS client that sends no header: refused after the timeout, the listener goes on
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        ctx = ssl.create_default_context(cafile=pki["ca"])
        with pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    c = TlsAfterHeader(port, b"PROXY TCP4 203.0.113.10 10.0.0.1 1 8883\r\n", pki["ca"])
    c.send(mqttraw.connect(uid("tls"), version=5, username="alice", password=b"x"))
    assert c.recv()[:1] == b"\x20"
    c.close()
    assert bp.metric("fleetmq_proxy_protocol_refused_total", listener="lb") == 1
