"""The MQTT test codec: MQTT 3.1 / 3.1.1 / 5.0 packets encoded and decoded from the specifications.

The one codec of the chaos harness's client (chaos/client.py, chaos/relay.py) and of the tests' raw client
(tests/integration/mqttraw.py). Deliberately independent of fleetmq.broker.codec: the tests must not share
the code they check. Sans-I/O, and only what a client needs: every packet a client sends is encoded, and
every packet a broker sends is decoded, strictly (a malformed one raises MalformedError, so it can be
reported); a packet only a client sends (CONNECT, SUBSCRIBE, ...) is not expected back.
Properties go by name (`session_expiry_interval`), as lists for the two that may repeat.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Literal

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
TYPE_NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP",
    8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP",
    14: "DISCONNECT", 15: "AUTH",
}  # fmt: skip

V31, V311, V5 = 3, 4, 5  # the protocol level byte of CONNECT

_Kind = Literal["byte", "int2", "int4", "varint", "str", "bin", "pair"]
# MQTT 5 property identifier -> (name, wire type)
_PROPS: dict[int, tuple[str, _Kind]] = {
    0x01: ("payload_format_indicator", "byte"),
    0x02: ("message_expiry_interval", "int4"),
    0x03: ("content_type", "str"),
    0x08: ("response_topic", "str"),
    0x09: ("correlation_data", "bin"),
    0x0B: ("subscription_identifier", "varint"),
    0x11: ("session_expiry_interval", "int4"),
    0x12: ("assigned_client_identifier", "str"),
    0x13: ("server_keep_alive", "int2"),
    0x15: ("authentication_method", "str"),
    0x16: ("authentication_data", "bin"),
    0x17: ("request_problem_information", "byte"),
    0x18: ("will_delay_interval", "int4"),
    0x19: ("request_response_information", "byte"),
    0x1A: ("response_information", "str"),
    0x1C: ("server_reference", "str"),
    0x1F: ("reason_string", "str"),
    0x21: ("receive_maximum", "int2"),
    0x22: ("topic_alias_maximum", "int2"),
    0x23: ("topic_alias", "int2"),
    0x24: ("maximum_qos", "byte"),
    0x25: ("retain_available", "byte"),
    0x26: ("user_property", "pair"),
    0x27: ("maximum_packet_size", "int4"),
    0x28: ("wildcard_subscription_available", "byte"),
    0x29: ("subscription_identifier_available", "byte"),
    0x2A: ("shared_subscription_available", "byte"),
}
_PROP_IDS = {name: (pid, kind) for pid, (name, kind) in _PROPS.items()}
_MULTI = {"user_property", "subscription_identifier"}  # the properties that may repeat: lists of values


class MalformedError(Exception):
    """The broker sent bytes that are not a well-formed MQTT packet."""


# ------------------------------------------------------------------ primitives
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ustr(s: str | bytes) -> bytes:
    """A UTF-8 string or binary data: two length bytes, then the bytes."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def encode_props(props: dict[str, Any] | None) -> bytes:
    out = bytearray()
    for name, value in (props or {}).items():
        pid, kind = _PROP_IDS[name]
        values = value if name in _MULTI and isinstance(value, list) else [value]
        for v in values:
            out += varint(pid)
            if kind == "byte":
                out.append(v)
            elif kind == "int2":
                out += struct.pack("!H", v)
            elif kind == "int4":
                out += struct.pack("!I", v)
            elif kind == "varint":
                out += varint(v)
            elif kind in ("str", "bin"):
                out += ustr(v)
            else:
                out += ustr(v[0]) + ustr(v[1])
    return varint(len(out)) + bytes(out)


def frame(type_: int, flags: int, body: bytes) -> bytes:
    """A whole packet: the fixed header, then `body`."""
    return bytes([type_ << 4 | flags]) + varint(len(body)) + body


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MalformedError("packet shorter than its fields")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def byte(self) -> int:
        return self.take(1)[0]

    def int2(self) -> int:
        return int(struct.unpack("!H", self.take(2))[0])

    def int4(self) -> int:
        return int(struct.unpack("!I", self.take(4))[0])

    def varint(self) -> int:
        value, mult = 0, 1
        for _ in range(4):
            b = self.byte()
            value += (b & 0x7F) * mult
            if not b & 0x80:
                return value
            mult *= 128
        raise MalformedError("variable byte integer longer than 4 bytes")

    def bin(self) -> bytes:
        return self.take(self.int2())

    def string(self) -> str:
        try:
            return self.bin().decode()
        except UnicodeDecodeError as e:
            raise MalformedError(f"bad UTF-8 string: {e}") from None

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.pos)

    def more(self) -> bool:
        return self.pos < len(self.data)

    def props(self) -> dict[str, Any]:
        end = self.varint() + self.pos
        props: dict[str, Any] = {}
        while self.pos < end:
            pid = self.varint()
            if pid not in _PROPS:
                raise MalformedError(f"unknown property {pid:#x}")
            name, kind = _PROPS[pid]
            v: Any
            if kind == "byte":
                v = self.byte()
            elif kind == "int2":
                v = self.int2()
            elif kind == "int4":
                v = self.int4()
            elif kind == "varint":
                v = self.varint()
            elif kind == "str":
                v = self.string()
            elif kind == "bin":
                v = self.bin()
            else:
                v = (self.string(), self.string())
            if name in _MULTI:
                props.setdefault(name, []).append(v)
            else:
                props[name] = v
        if self.pos != end:
            raise MalformedError("properties overrun their length")
        return props


# ------------------------------------------------------------------ packets
@dataclass
class Packet:
    """One decoded packet. Fields a packet type does not use keep their defaults."""

    type: int
    flags: int = 0
    packet_id: int = 0
    reason: int = 0  # CONNACK return/reason code, ack reason code, DISCONNECT/AUTH reason
    props: dict[str, Any] = field(default_factory=dict)
    session_present: bool = False  # CONNACK
    topic: str = ""  # PUBLISH
    payload: bytes = b""  # PUBLISH
    codes: list[int] = field(default_factory=list)  # SUBACK, UNSUBACK
    raw: bytes = b""  # the body as received

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def dup(self) -> bool:
        return bool(self.flags & 8)

    @property
    def retain(self) -> bool:
        return bool(self.flags & 1)

    def __repr__(self) -> str:
        if self.type == PUBLISH:
            return (
                f"PUBLISH(topic={self.topic!r}, payload={self.payload[:40]!r}, qos={self.qos}, "
                f"dup={self.dup}, retain={self.retain}, pid={self.packet_id}, props={self.props})"
            )
        return f"{self.name}(pid={self.packet_id}, reason={self.reason:#x}, props={self.props}, codes={self.codes})"


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
            raise MalformedError("remaining length longer than 4 bytes")
    if len(buf) < i + length:
        return None
    first = buf[0]
    body = bytes(buf[i : i + length])
    del buf[: i + length]
    return first >> 4, first & 0x0F, body


def decode(type_: int, flags: int, body: bytes, version: int) -> Packet:
    """The packet a broker sent, as split() framed it."""
    p = Packet(type_, flags, raw=body)
    r = _Reader(body)
    v5 = version == V5
    if type_ == CONNACK:
        p.session_present = bool(r.byte() & 1)
        p.reason = r.byte()
        if v5 and r.more():
            p.props = r.props()
    elif type_ == PUBLISH:
        if p.qos == 3:
            raise MalformedError("PUBLISH with QoS 3")
        p.topic = r.string()
        if p.qos:
            p.packet_id = r.int2()
        if v5:
            p.props = r.props()
        p.payload = r.rest()
    elif type_ in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        p.packet_id = r.int2()
        if v5 and r.more():
            p.reason = r.byte()
            if r.more():
                p.props = r.props()
    elif type_ in (SUBACK, UNSUBACK):
        p.packet_id = r.int2()
        if v5:
            p.props = r.props()
        p.codes = list(r.rest())
    elif type_ in (DISCONNECT, AUTH):
        if v5 and r.more():
            p.reason = r.byte()
            if r.more():
                p.props = r.props()
    elif type_ != PINGRESP:
        raise MalformedError(f"a client does not expect {TYPE_NAMES.get(type_, type_)} from a broker")
    return p


# ------------------------------------------------------------------ encoders (client -> broker)
def connect(
    client_id: str = "",
    *,
    version: int = V311,
    clean: bool = True,
    keepalive: int = 60,
    props: dict[str, Any] | None = None,
    will: dict[str, Any] | None = None,
    username: str | None = None,
    password: bytes | None = None,
) -> bytes:
    """will: {topic, payload, qos=0, retain=False, props={}}"""
    name = b"MQIsdp" if version == V31 else b"MQTT"
    flags = 0x02 if clean else 0
    if will:
        flags |= 0x04 | (will.get("qos", 0) << 3) | (0x20 if will.get("retain") else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = ustr(name) + bytes([version, flags]) + struct.pack("!H", keepalive)
    if version == V5:
        body += encode_props(props)
    body += ustr(client_id)
    if will:
        if version == V5:
            body += encode_props(will.get("props"))
        body += ustr(will["topic"]) + ustr(will["payload"])
    if username is not None:
        body += ustr(username)
    if password is not None:
        body += ustr(password)
    return frame(CONNECT, 0, body)


def publish(
    topic: str,
    payload: bytes | str = b"",
    *,
    qos: int = 0,
    packet_id: int | None = None,
    retain: bool = False,
    dup: bool = False,
    version: int = V311,
    props: dict[str, Any] | None = None,
) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    flags = (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    body = ustr(topic)
    if qos:
        body += struct.pack("!H", packet_id if packet_id is not None else 1)
    if version == V5:
        body += encode_props(props)
    return frame(PUBLISH, flags, body + payload)


def ack(type_: int, packet_id: int, *, version: int = V311, reason: int | None = None) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; without a reason, the short form (Success) both versions accept."""
    body = struct.pack("!H", packet_id)
    if version == V5 and reason is not None:
        body += bytes([reason])
    return frame(type_, 2 if type_ == PUBREL else 0, body)


def subscribe(
    packet_id: int,
    filters: list[tuple[str, int]] | list[tuple[str, int, int]],
    *,
    version: int = V311,
    props: dict[str, Any] | None = None,
    flags: int = 2,
) -> bytes:
    """filters: (filter, qos), or for v5 (filter, options byte) with the QoS in its low bits (sub_options)."""
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_props(props)
    for f in filters:
        body += ustr(f[0]) + bytes([f[1]])
    return frame(SUBSCRIBE, flags, body)


def sub_options(
    qos: int, *, no_local: bool = False, retain_as_published: bool = False, retain_handling: int = 0
) -> int:
    return qos | (4 if no_local else 0) | (8 if retain_as_published else 0) | (retain_handling << 4)


def unsubscribe(packet_id: int, filters: list[str], *, version: int = V311) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_props(None)
    for f in filters:
        body += ustr(f)
    return frame(UNSUBSCRIBE, 2, body)


def pingreq() -> bytes:
    return frame(PINGREQ, 0, b"")


def disconnect(*, version: int = V311, reason: int = 0, props: dict[str, Any] | None = None) -> bytes:
    """Without a reason or properties, the short form (Normal disconnection) both versions accept."""
    if version == V5 and (reason or props):
        return frame(DISCONNECT, 0, bytes([reason]) + encode_props(props))
    return frame(DISCONNECT, 0, b"")
