"""A blocking raw-socket MQTT client for tests, on the test codec (chaos/codec.py).

The codec's names are exported here too, so a test has one module for both: `mqttraw.publish(...)` builds
the bytes, `RawClient` sends them and reads whole packets back. Deliberately independent of
fleetmq.broker.codec: the tests must not share the code they check.
"""

from __future__ import annotations

import socket
import time

from chaos.codec import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    TYPE_NAMES,
    UNSUBACK,
    UNSUBSCRIBE,
    V5,
    V31,
    V311,
    MalformedError,
    Packet,
    ack,
    connect,
    decode,
    disconnect,
    frame,
    pingreq,
    publish,
    split,
    sub_options,
    subscribe,
    unsubscribe,
    ustr,
)

__all__ = [
    "AUTH",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH",
    "PUBREC",
    "PUBREL",
    "SUBACK",
    "SUBSCRIBE",
    "TYPE_NAMES",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "V5",
    "V31",
    "V311",
    "ConnectionClosed",
    "MalformedError",
    "Packet",
    "RawClient",
    "ack",
    "connect",
    "disconnect",
    "frame",
    "pingreq",
    "publish",
    "split",
    "sub_options",
    "subscribe",
    "unsubscribe",
    "ustr",
]


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
        self.buf = bytearray()
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
        framed = split(self.buf)
        return None if framed is None else decode(*framed, self.version)

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
