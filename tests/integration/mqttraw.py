"""A tiny, independent MQTT 3.1/3.1.1/5.0 encoder/decoder and a raw-socket client for tests.

Deliberately independent of fleetmq.broker.codec: the tests must not share the code they check.
Only what the tests need is implemented; decoding is lenient where a test does not care.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

# packet types
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = (
    8,
    9,
    10,
    11,
    12,
    13,
    14,
    15,
)
TYPE_NAMES = {
    1: "CONNECT",
    2: "CONNACK",
    3: "PUBLISH",
    4: "PUBACK",
    5: "PUBREC",
    6: "PUBREL",
    7: "PUBCOMP",
    8: "SUBSCRIBE",
    9: "SUBACK",
    10: "UNSUBSCRIBE",
    11: "UNSUBACK",
    12: "PINGREQ",
    13: "PINGRESP",
    14: "DISCONNECT",
    15: "AUTH",
}

V31, V311, V5 = 3, 4, 5

# property id -> (name, kind)
_PROPS: dict[int, tuple[str, str]] = {
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
_MULTI = {"user_property", "subscription_identifier"}


class MalformedError(Exception):
    pass


# ---------------------------------------------------------------- primitives
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def ustr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def encode_props(props: dict[str, Any] | None) -> bytes:
    out = bytearray()
    for name, value in (props or {}).items():
        pid, kind = _PROP_IDS[name]
        values = value if name in _MULTI and isinstance(value, list) else [value]
        for v in values:
            out.append(pid)
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
            elif kind == "pair":
                out += ustr(v[0]) + ustr(v[1])
    return varint(len(out)) + bytes(out)


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + varint(len(body)) + body


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MalformedError("short packet")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def byte(self) -> int:
        return self.take(1)[0]

    def int2(self) -> int:
        return struct.unpack("!H", self.take(2))[0]

    def int4(self) -> int:
        return struct.unpack("!I", self.take(4))[0]

    def varint(self) -> int:
        mult, value = 1, 0
        for _ in range(4):
            b = self.byte()
            value += (b & 0x7F) * mult
            if not b & 0x80:
                return value
            mult *= 128
        raise MalformedError("varint too long")

    def bin(self) -> bytes:
        return self.take(self.int2())

    def str(self) -> str:
        return self.bin().decode()

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.pos)

    def more(self) -> bool:
        return self.pos < len(self.data)

    def props(self) -> dict[str, Any]:
        n = self.varint()
        end = self.pos + n
        props: dict[str, Any] = {}
        while self.pos < end:
            pid = self.varint()
            if pid not in _PROPS:
                raise MalformedError(f"unknown property {pid:#x}")
            name, kind = _PROPS[pid]
            if kind == "byte":
                v: Any = self.byte()
            elif kind == "int2":
                v = self.int2()
            elif kind == "int4":
                v = self.int4()
            elif kind == "varint":
                v = self.varint()
            elif kind == "str":
                v = self.str()
            elif kind == "bin":
                v = self.bin()
            else:
                v = (self.str(), self.str())
            if name in _MULTI:
                props.setdefault(name, []).append(v)
            else:
                props[name] = v
        return props


# ---------------------------------------------------------------- packets
@dataclass
class Packet:
    type: int
    flags: int
    raw: bytes = b""
    # common decoded fields
    packet_id: int | None = None
    reason: int = 0
    props: dict[str, Any] = field(default_factory=dict)
    # CONNACK
    session_present: bool = False
    # PUBLISH
    topic: str = ""
    payload: bytes = b""
    # SUBACK / UNSUBACK
    codes: list[int] = field(default_factory=list)

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


def decode(first: int, body: bytes, version: int) -> Packet:
    ptype, flags = first >> 4, first & 0x0F
    p = Packet(ptype, flags, raw=body)
    r = _Reader(body)
    v5 = version == V5
    if ptype == CONNACK:
        p.session_present = bool(r.byte() & 1)
        p.reason = r.byte()
        if v5 and r.more():
            p.props = r.props()
    elif ptype == PUBLISH:
        p.topic = r.str()
        if p.qos:
            p.packet_id = r.int2()
        if v5:
            p.props = r.props()
        p.payload = r.rest()
    elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        p.packet_id = r.int2()
        if v5 and r.more():
            p.reason = r.byte()
            if r.more():
                p.props = r.props()
    elif ptype in (SUBACK, UNSUBACK):
        p.packet_id = r.int2()
        if v5:
            p.props = r.props()
        p.codes = list(r.rest())
    elif ptype in (DISCONNECT, AUTH) and r.more():
        p.reason = r.byte()
        if r.more():
            p.props = r.props()
    return p


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
    return packet(CONNECT, 0, body)


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
    return packet(PUBLISH, flags, body + payload)


def ack(ptype: int, packet_id: int, *, version: int = V311, reason: int | None = None) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5 and reason is not None:
        body += bytes([reason])
    return packet(ptype, 2 if ptype == PUBREL else 0, body)


def subscribe(
    packet_id: int,
    filters: list[tuple[str, int]] | list[tuple[str, int, int]],
    *,
    version: int = V311,
    props: dict[str, Any] | None = None,
    flags: int = 2,
) -> bytes:
    """filters: (filter, qos) or (filter, options_byte) for v5 (options include qos bits)."""
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_props(props)
    for f in filters:
        body += ustr(f[0]) + bytes([f[1]])
    return packet(SUBSCRIBE, flags, body)


def sub_options(qos: int, *, no_local=False, retain_as_published=False, retain_handling=0) -> int:
    return qos | (4 if no_local else 0) | (8 if retain_as_published else 0) | (retain_handling << 4)


def unsubscribe(packet_id: int, filters: list[str], *, version: int = V311) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_props(None)
    for f in filters:
        body += ustr(f)
    return packet(UNSUBSCRIBE, 2, body)


def pingreq() -> bytes:
    return b"\xc0\x00"


def disconnect(*, version: int = V311, reason: int = 0, props: dict[str, Any] | None = None) -> bytes:
    if version == V5 and (reason or props):
        return packet(DISCONNECT, 0, bytes([reason]) + encode_props(props))
    return b"\xe0\x00"


# ---------------------------------------------------------------- raw client
class ConnectionClosed(Exception):
    pass


class RawClient:
    """A blocking socket client speaking bytes; reads whole packets.

    Nothing is sent automatically (no PUBACK, no PINGREQ): the test decides everything.
    """

    def __init__(self, host: str, port: int, *, version: int = V311, timeout: float = 5.0):
        self.host, self.port, self.version = host, port, version
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False
        self.next_pid = 1

    # ---- context manager
    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def pid(self) -> int:
        p = self.next_pid
        self.next_pid = self.next_pid % 65535 + 1
        return p

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    # ---- reading
    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False on timeout; raises ConnectionClosed on EOF/reset."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
            self.closed = True
            raise ConnectionClosed(str(e)) from e
        if not data:
            self.closed = True
            raise ConnectionClosed("EOF")
        self.buf += data
        return True

    def _try_parse(self) -> Packet | None:
        buf = self.buf
        if len(buf) < 2:
            return None
        mult, length, i = 1, 0, 1
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
                raise MalformedError("bad remaining length from server")
        if len(buf) < i + length:
            return None
        first, body = buf[0], buf[i : i + length]
        self.buf = buf[i + length :]
        return decode(first, body, self.version)

    def recv(self, timeout: float = 5.0) -> Packet | None:
        """The next packet, or None on timeout. Raises ConnectionClosed if the peer closed."""
        deadline = time.monotonic() + timeout
        while True:
            p = self._try_parse()
            if p is not None:
                return p
            if not self._fill(deadline):
                return None

    def expect(self, ptype: int, timeout: float = 5.0) -> Packet:
        p = self.recv(timeout)
        assert p is not None, f"timed out waiting for {TYPE_NAMES[ptype]}"
        assert p.type == ptype, f"expected {TYPE_NAMES[ptype]}, got {p!r}"
        return p

    def recv_all(self, duration: float) -> list[Packet]:
        """Every packet that arrives within `duration` seconds (stops early if closed)."""
        out: list[Packet] = []
        deadline = time.monotonic() + duration
        while True:
            try:
                p = self.recv(max(0.0, deadline - time.monotonic()))
            except ConnectionClosed:
                return out
            if p is None:
                return out
            out.append(p)

    def recv_n(self, n: int, timeout: float = 5.0, ptype: int | None = None) -> list[Packet]:
        """Exactly n packets (of ptype if given, others are ignored); fails on timeout."""
        out: list[Packet] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            p = self.recv(max(0.0, deadline - time.monotonic()))
            assert p is not None, f"got {len(out)} of {n} packets: {out}"
            if ptype is None or p.type == ptype:
                out.append(p)
        return out

    def wait_closed(self, timeout: float = 5.0) -> tuple[bool, list[Packet]]:
        """Read until the server closes the connection. Returns (closed, packets seen before)."""
        seen: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                p = self.recv(max(0.0, deadline - time.monotonic()))
            except ConnectionClosed:
                return True, seen
            except MalformedError:
                return True, seen
            if p is None:
                return False, seen
            seen.append(p)

    # ---- conveniences
    def connect(self, client_id: str = "", *, check: bool = True, timeout: float = 5.0, **kw) -> Packet:
        kw.setdefault("version", self.version)
        self.send(connect(client_id, **kw))
        ack_ = self.expect(CONNACK, timeout)
        if check:
            assert ack_.reason == 0, f"CONNACK refused: {ack_!r}"
        return ack_

    def subscribe(self, filters, *, props=None, timeout: float = 5.0) -> Packet:
        pid = self.pid()
        self.send(subscribe(pid, filters, version=self.version, props=props))
        while True:
            p = self.expect_any(timeout)
            if p.type == SUBACK:
                assert p.packet_id == pid
                return p

    def expect_any(self, timeout: float = 5.0) -> Packet:
        p = self.recv(timeout)
        assert p is not None, "timed out waiting for a packet"
        return p

    def publish(self, topic, payload=b"", *, qos=0, retain=False, props=None, packet_id=None, dup=False):
        pid = packet_id if packet_id is not None else (self.pid() if qos else None)
        self.send(
            publish(
                topic,
                payload,
                qos=qos,
                packet_id=pid,
                retain=retain,
                dup=dup,
                version=self.version,
                props=props,
            )
        )
        return pid

    def ack(self, p: Packet) -> None:
        """Acknowledge a received PUBLISH (QoS1 PUBACK, QoS2 PUBREC) or PUBREL (PUBCOMP)."""
        if p.type == PUBLISH and p.qos == 1:
            self.send(ack(PUBACK, p.packet_id, version=self.version))
        elif p.type == PUBLISH and p.qos == 2:
            self.send(ack(PUBREC, p.packet_id, version=self.version))
        elif p.type == PUBREL:
            self.send(ack(PUBCOMP, p.packet_id, version=self.version))

    def disconnect(self, **kw) -> None:
        try:
            self.send(disconnect(version=self.version, **kw))
        except OSError:
            pass
        self.close()
