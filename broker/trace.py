"""Packet traces (EMQX's trace), started through the management API: every packet of one client id, or
every PUBLISH on a topic filter, as each node saw it, for a while.

A trace is a TraceSpec in the store (``keys.TRACES``) that every node reads with its heartbeat; a node
records into a bounded buffer per trace and appends it to the trace's stream (``keys.trace_stream``) a
few times a second. Nothing of this runs for a client that is not traced: its channel has no tracer and
its IO is not wrapped. Passwords and authentication data are never recorded; payloads are cut to the
trace's payload_limit.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .codec import Connect, Parser, ProtocolError, Publish
from .topic import topic_matches

#: records a node holds for one trace between two flushes: more are dropped (and counted)
PENDING_MAX = 10_000
#: entries a trace's stream keeps (the oldest go first)
STREAM_MAX = 100_000
MAX_DURATION = 24 * 3600.0


class TraceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: Literal["clientid", "topic"]
    filter: str = Field(min_length=1, description="A client id, or a topic filter")
    start: float
    end: float
    payload_limit: int = Field(256, ge=0, le=65536)

    def active(self, now: float) -> bool:
        return self.start <= now < self.end


def _payload(data: bytes, limit: int) -> dict[str, Any]:
    cut = data[:limit]
    try:
        shown, encoding = cut.decode(), "plain"
    except UnicodeDecodeError:
        shown, encoding = base64.b64encode(cut).decode(), "base64"
    return {"payload": shown, "payload_encoding": encoding, "payload_size": len(data)}


def describe(packet: Any, limit: int) -> dict[str, Any]:
    """A packet as a trace shows it: its type and fields, never a password, the payload cut."""
    out: dict[str, Any] = {"type": type(packet).__name__.upper()}
    if isinstance(packet, Publish):
        out.update(topic=packet.topic, qos=packet.qos, retain=packet.retain, dup=packet.dup)
        if packet.packet_id:
            out["packet_id"] = packet.packet_id
        out.update(_payload(packet.payload, limit))
        return out
    if isinstance(packet, Connect):
        out.update(clientid=packet.client_id, username=packet.username, proto_ver=packet.proto_level,
                   clean_start=packet.clean_start, keepalive=packet.keepalive,
                   will_topic=packet.will.topic if packet.will is not None else None)  # fmt: skip
        return out
    for name in ("packet_id", "reason_code", "reason_codes", "session_present", "topics"):
        value = getattr(packet, name, None)
        if value is not None:
            out[name] = value
    subscriptions = getattr(packet, "subscriptions", None)
    if subscriptions is not None:
        out["subscriptions"] = [{"topic": f, "qos": o.qos} for f, o in subscriptions]
    return out


class Tracer:
    """One trace on one node: records as JSON lines, waiting for the next flush."""

    def __init__(self, spec: TraceSpec, node_id: str) -> None:
        self.spec = spec
        self.node_id = node_id
        self.pending: deque[str] = deque()
        self.dropped = 0

    def _add(self, record: dict[str, Any]) -> None:
        if len(self.pending) >= PENDING_MAX:
            self.dropped += 1
            return
        self.pending.append(json.dumps(record, separators=(",", ":")))

    def packets(
        self, client_id: str, direction: Literal["in", "out"], packets: list[Any], now: float
    ) -> None:
        for p in packets:
            self._add({"ts": round(now, 6), "node": self.node_id, "clientid": client_id, "dir": direction,
                       **describe(p, self.spec.payload_limit)})  # fmt: skip

    def routed(self, sender: str, topic: str, qos: int, retain: bool, payload: bytes, now: float) -> None:
        """A topic trace: a message this node routed (from a client of its own, or the API)."""
        if topic_matches(self.spec.filter, topic):
            self._add({"ts": round(now, 6), "node": self.node_id, "clientid": sender, "dir": "routed",
                       "type": "PUBLISH", "topic": topic, "qos": qos, "retain": retain,
                       **_payload(payload, self.spec.payload_limit)})  # fmt: skip

    def take(self) -> list[str]:
        out = list(self.pending)
        self.pending.clear()
        if self.dropped:
            out.append(json.dumps({"node": self.node_id, "dropped": self.dropped}))
            self.dropped = 0
        return out


class Outgoing:
    """What a traced channel writes, decoded again for its trace(s). Wraps the channel's IO while the
    trace lasts; forwards everything else."""

    def __init__(self, io: Any, record: Any, version: int) -> None:
        self.io = io
        self.record = record  # (packets) -> None
        self.version = version
        self.parser = Parser(version=version)

    def write(self, data: bytes) -> None:
        self.io.write(data)
        try:
            packets = self.parser.feed(data)
        except ProtocolError as e:  # (the broker wrote it: not expected; the trace says so)
            packets = [*e.packets]
            self.parser = Parser(version=self.version)
        self.record(packets)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.io, name)
