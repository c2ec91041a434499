"""The PROXY protocol parser (broker/proxyproto.py), fed as bytes arrive."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from fleetmq.broker.proxyproto import V2_SIGNATURE, ProxyError, ProxyHeader, parse

CONNECT = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"


def v2(src: str, dst: str, sport: int, dport: int, *, command: int = 1, tlvs: bytes = b"") -> bytes:
    a, b = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    family = 0x11 if a.version == 4 else 0x21
    body = a.packed + b.packed + struct.pack("!HH", sport, dport) + tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


@pytest.mark.parametrize(
    ("header", "source", "destination"),
    [
        (b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 1883\r\n", ("203.0.113.7", 51234), ("10.0.0.1", 1883)),
        (b"PROXY TCP6 2001:db8::7 2001:db8::1 51234 1883\r\n", ("2001:db8::7", 51234), ("2001:db8::1", 1883)),
        (b"PROXY UNKNOWN\r\n", None, None),
        (v2("203.0.113.7", "10.0.0.1", 51234, 1883), ("203.0.113.7", 51234), ("10.0.0.1", 1883)),
        (
            v2("2001:db8::7", "2001:db8::1", 1, 2, tlvs=b"\x04\x00\x01x"),
            ("2001:db8::7", 1),
            ("2001:db8::1", 2),
        ),
        (v2("203.0.113.7", "10.0.0.1", 1, 2, command=0), None, None),  # LOCAL: the balancer's health check
    ],
)
def test_a_header_gives_the_clients_address_and_what_follows_is_the_clients(header, source, destination):
    version = 2 if header.startswith(V2_SIGNATURE) else 1
    assert parse(header + CONNECT) == (ProxyHeader(source, destination, version), len(header))
    for cut in range(len(header)):  # (bytes arrive in any pieces: nothing is decided early)
        assert parse(header[:cut]) is None, cut


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (CONNECT, "expected a PROXY protocol header"),
        (b"GET / HTTP/1.1\r\n", "expected a PROXY protocol header"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "is not 'PROXY TCP4"),
        (b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n", "is not an IP address"),
        (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "is not IPv4"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "is not a port"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", "is not a port"),
        (b"PROXY " + b"x" * 120, "longer than 107 bytes"),
        (V2_SIGNATURE + b"\x31\x11\x00\x0c" + bytes(12), "with version 3"),
        (V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12), "with command 2"),
        (V2_SIGNATURE + b"\x21\x11\xff\xff", "of 65535 bytes"),
        (V2_SIGNATURE + b"\x21\x31\x00\xd8" + bytes(216), "a unix socket"),
        (V2_SIGNATURE + b"\x21\x12\x00\x0c" + bytes(12), "other than TCP"),
        (V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4), "too short for its addresses"),
    ],
)
def test_what_is_not_a_valid_header_is_refused_saying_why(data, says):
    with pytest.raises(ProxyError, match=says):
        parse(data)
