"""The MQTT 3.1.1 / 5.0 packets the harness's client needs, encoded and decoded from the specifications.

Sans-I/O and deliberately small: CONNECT, CONNACK, PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP, SUBSCRIBE,
SUBACK, PINGREQ/PINGRESP and DISCONNECT. Version 4 is MQTT 3.1.1, version 5 is MQTT 5.0. Anything the
broker sends that the harness does not expect is still framed and parsed, so it can be reported.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP",
    8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP",
    14: "DISCONNECT", 15: "AUTH",
}  # fmt: skip

# MQTT 5 property identifiers the client sets or reads, and the wire type of every property (to skip the rest)
SESSION_EXPIRY_INTERVAL = 0x11
SERVER_KEEP_ALIVE = 0x13
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)
_PROP_TYPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STR, 0x08: _STR, 0x09: _BIN, 0x0B: _VARINT, 0x11: _U32, 0x12: _STR,
    0x13: _U16, 0x15: _STR, 0x16: _BIN, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE, 0x1A: _STR, 0x1C: _STR,
    0x1F: _STR, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip


class ProtocolError(Exception):
    """The broker sent bytes that are not a well-formed MQTT packet."""


@dataclass
class Packet:
    """One decoded packet. Fields not used by a packet type keep their defaults."""

    type: int
    flags: int = 0
    packet_id: int = 0
    reason: int = 0  # CONNACK return/reason code, ack reason code, DISCONNECT reason
    session_present: bool = False
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    dup: bool = False
    retain: bool = False
    codes: list[int] = field(default_factory=list)  # SUBACK
    props: dict[int, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, str(self.type))


# ------------------------------------------------------------------ primitives
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def _props(props: dict[int, int] | None) -> bytes:
    body = bytearray()
    for pid, value in (props or {}).items():
        kind = _PROP_TYPES[pid]
        body.append(pid)
        if kind == _U16:
            body += struct.pack("!H", value)
        elif kind == _U32:
            body += struct.pack("!I", value)
        elif kind == _BYTE:
            body.append(value)
        else:
            raise ValueError(f"property 0x{pid:02x}: only integer properties are sent by the harness")
    return varint(len(body)) + bytes(body)


def frame(type_: int, flags: int, body: bytes) -> bytes:
    return bytes([type_ << 4 | flags]) + varint(len(body)) + body


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.i = data, 0

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.data):
            raise ProtocolError("packet shorter than its fields")
        b = self.data[self.i : self.i + n]
        self.i += n
        return b

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("!H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("!I", self.take(4))[0])

    def varint(self) -> int:
        n, mult = 0, 1
        for _ in range(4):
            b = self.u8()
            n += (b & 0x7F) * mult
            if not b & 0x80:
                return n
            mult *= 128
        raise ProtocolError("variable byte integer longer than 4 bytes")

    def string(self) -> str:
        try:
            return self.take(self.u16()).decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"bad UTF-8 string: {e}") from None

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.i)

    def left(self) -> int:
        return len(self.data) - self.i

    def props(self) -> dict[int, Any]:
        end = self.varint() + self.i
        out: dict[int, Any] = {}
        while self.i < end:
            pid = self.u8()
            kind = _PROP_TYPES.get(pid)
            if kind is None:
                raise ProtocolError(f"unknown property 0x{pid:02x}")
            value: Any
            if kind == _BYTE:
                value = self.u8()
            elif kind == _U16:
                value = self.u16()
            elif kind == _U32:
                value = self.u32()
            elif kind == _VARINT:
                value = self.varint()
            elif kind == _STR:
                value = self.string()
            elif kind == _BIN:
                value = self.take(self.u16())
            else:
                value = (self.string(), self.string())
            out[pid] = value
        if self.i != end:
            raise ProtocolError("properties overrun their length")
        return out


# ------------------------------------------------------------------ encoders (client -> broker)
def connect(
    client_id: str,
    version: int,
    *,
    clean: bool,
    keepalive: int,
    session_expiry: int = 0,
    receive_maximum: int | None = None,
) -> bytes:
    flags = 0x02 if clean else 0x00
    body = _str("MQTT") + bytes([version, flags]) + struct.pack("!H", keepalive)
    if version == 5:
        props: dict[int, int] = {}
        if session_expiry:
            props[SESSION_EXPIRY_INTERVAL] = session_expiry
        if receive_maximum:
            props[RECEIVE_MAXIMUM] = receive_maximum
        body += _props(props)
    return frame(CONNECT, 0, body + _str(client_id))


def publish(
    version: int, topic: str, payload: bytes, qos: int, packet_id: int = 0, *, dup: bool = False
) -> bytes:
    flags = (0x08 if dup else 0) | qos << 1
    body = _str(topic) + (struct.pack("!H", packet_id) if qos else b"")
    if version == 5:
        body += b"\x00"
    return frame(PUBLISH, flags, body + payload)


def ack(type_: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP with reason Success (the short form both versions accept)."""
    return frame(type_, 0x02 if type_ == PUBREL else 0, struct.pack("!H", packet_id))


def subscribe(version: int, packet_id: int, filters: list[tuple[str, int]]) -> bytes:
    body = struct.pack("!H", packet_id) + (b"\x00" if version == 5 else b"")
    for f, qos in filters:
        body += _str(f) + bytes([qos])
    return frame(SUBSCRIBE, 0x02, body)


def pingreq() -> bytes:
    return frame(PINGREQ, 0, b"")


def disconnect(version: int) -> bytes:
    return frame(DISCONNECT, 0, b"\x00\x00" if version == 5 else b"")


# ------------------------------------------------------------------ decoder (broker -> client)
def split(buf: bytearray) -> tuple[int, int, bytes] | None:
    """Take one whole packet off the front of `buf`: (type, flags, body), or None if it is not all there."""
    if len(buf) < 2:
        return None
    length, mult, i = 0, 1, 1
    while True:
        if i >= len(buf):
            return None
        b = buf[i]
        length += (b & 0x7F) * mult
        i += 1
        if not b & 0x80:
            break
        mult *= 128
        if i > 4:
            raise ProtocolError("remaining length longer than 4 bytes")
    if len(buf) < i + length:
        return None
    first = buf[0]
    body = bytes(buf[i : i + length])
    del buf[: i + length]
    return first >> 4, first & 0x0F, body


def decode(type_: int, flags: int, body: bytes, version: int) -> Packet:
    c = _Cursor(body)
    p = Packet(type_, flags)
    if type_ == CONNACK:
        p.session_present = bool(c.u8() & 0x01)
        p.reason = c.u8()
        if version == 5 and c.left():
            p.props = c.props()
    elif type_ == PUBLISH:
        p.qos, p.dup, p.retain = (flags >> 1) & 0x03, bool(flags & 0x08), bool(flags & 0x01)
        if p.qos == 3:
            raise ProtocolError("PUBLISH with QoS 3")
        p.topic = c.string()
        if p.qos:
            p.packet_id = c.u16()
        if version == 5:
            p.props = c.props()
        p.payload = c.rest()
    elif type_ in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        p.packet_id = c.u16()
        if version == 5 and c.left():
            p.reason = c.u8()
            if c.left():
                p.props = c.props()
    elif type_ == SUBACK:
        p.packet_id = c.u16()
        if version == 5:
            p.props = c.props()
        p.codes = list(c.rest())
    elif type_ == DISCONNECT:
        if version == 5 and c.left():
            p.reason = c.u8()
            if c.left():
                p.props = c.props()
    elif type_ in (PINGRESP, UNSUBACK, AUTH):
        c.rest()
    else:
        raise ProtocolError(f"a client does not expect {NAMES.get(type_, type_)} from a broker")
    return p
