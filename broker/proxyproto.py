"""The PROXY protocol (HAProxy's, versions 1 and 2): the header a load balancer sends before the client's
bytes, saying whose connection it carries. Sans-I/O: `parse` takes what arrived so far.

A listener with proxy_protocol expects it first; one without takes a PROXY header for a malformed MQTT
packet, as anything else that is not a CONNECT.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

V1_PREFIX = b"PROXY "
V1_MAX = 107  # the longest v1 line, CRLF included (the spec's limit)
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_MAX_PAYLOAD = 2048  # addresses and TLVs; a longer header is refused rather than buffered
#: the longest header of either version (v2: signature, version/command, family, length, payload)
HEADER_MAX = len(V2_SIGNATURE) + 4 + V2_MAX_PAYLOAD
_V2_FIXED = 16


class ProxyError(ValueError):
    """A header that is not the PROXY protocol, or not a valid one; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """Who the connection is from and to; None for a LOCAL command or an UNKNOWN / unspecified family
    (a health check of the balancer itself: the connection's own addresses apply)."""

    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    version: int


def parse(data: bytes) -> tuple[ProxyHeader, int] | None:
    """(the header, how many bytes it took) once `data` holds it whole; None while it may still come;
    ProxyError when `data` cannot start a PROXY header or its header is invalid."""
    if data.startswith(V2_SIGNATURE):
        return _v2(data)
    if data.startswith(V1_PREFIX):
        return _v1(data)
    if V2_SIGNATURE.startswith(data[: len(V2_SIGNATURE)]) or V1_PREFIX.startswith(data[: len(V1_PREFIX)]):
        return None
    raise ProxyError(f"expected a PROXY protocol header, got {data[:16]!r}")


def _v1(data: bytes) -> tuple[ProxyHeader, int] | None:
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyError(f"PROXY v1 line longer than {V1_MAX} bytes")
        return None
    try:
        fields = data[:end].decode("ascii").split(" ")
    except UnicodeDecodeError as e:
        raise ProxyError("PROXY v1 line is not ASCII") from e
    if fields[1:2] == ["UNKNOWN"]:
        return ProxyHeader(None, None, 1), end + 2
    if len(fields) != 6 or fields[1] not in ("TCP4", "TCP6"):
        raise ProxyError(f"PROXY v1 line is not 'PROXY TCP4|TCP6 src dst sport dport': {data[:end]!r}")
    version = 4 if fields[1] == "TCP4" else 6
    src, dst = _address(fields[2], version), _address(fields[3], version)
    return ProxyHeader((src, _port(fields[4])), (dst, _port(fields[5])), 1), end + 2


def _address(text: str, version: int) -> str:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError as e:
        raise ProxyError(f"PROXY header address {text!r} is not an IP address") from e
    if ip.version != version:
        raise ProxyError(f"PROXY header address {text!r} is not IPv{version}")
    return str(ip)


def _port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or int(text) > 65535 or (text != "0" and text.startswith("0")):
        raise ProxyError(f"PROXY header port {text!r} is not a port")
    return int(text)


def _v2(data: bytes) -> tuple[ProxyHeader, int] | None:
    if len(data) < _V2_FIXED:
        return None
    ver_cmd, family, length = struct.unpack_from("!BBH", data, 12)
    if ver_cmd >> 4 != 2:
        raise ProxyError(f"PROXY v2 header with version {ver_cmd >> 4}")
    command = ver_cmd & 0x0F
    if command > 1:
        raise ProxyError(f"PROXY v2 header with command {command}")
    if length > V2_MAX_PAYLOAD:
        raise ProxyError(f"PROXY v2 header of {length} bytes (at most {V2_MAX_PAYLOAD})")
    if len(data) < _V2_FIXED + length:
        return None
    total = _V2_FIXED + length
    if command == 0 or family >> 4 == 0:  # LOCAL, or UNSPEC: the balancer's own connection
        return ProxyHeader(None, None, 2), total
    if family & 0x0F != 1:
        raise ProxyError("PROXY v2 header for a transport other than TCP")
    sizes = {1: 4, 2: 16}
    size = sizes.get(family >> 4)
    if size is None:
        raise ProxyError("PROXY v2 header of an address family other than IPv4 and IPv6 (a unix socket)")
    if length < 2 * size + 4:
        raise ProxyError(f"PROXY v2 header too short for its addresses ({length} bytes)")
    at = _V2_FIXED
    src = ipaddress.ip_address(data[at : at + size])
    dst = ipaddress.ip_address(data[at + size : at + 2 * size])
    sport, dport = struct.unpack_from("!HH", data, at + 2 * size)
    return ProxyHeader((str(src), sport), (str(dst), dport), 2), total
