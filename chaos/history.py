"""What happened during a run, as the clients and the nemesis saw it: the checker's only input.

Times are seconds since the run started (monotonic clock). A message is named by (publisher, topic,
sequence number), which its payload carries, so every delivery can be matched to its publish.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

MsgKey = tuple[str, str, int]  # (publisher id, topic, sequence number)


def payload_of(pub: str, topic: str, seq: int, pad: int = 0) -> bytes:
    """`pub|topic|seq|` then `pad` filler bytes; the checker needs nothing else to reason."""
    return f"{pub}|{topic}|{seq}|".encode() + b"x" * pad


def parse_payload(payload: bytes) -> MsgKey | None:
    try:
        pub, topic, seq, _ = payload.split(b"|", 3)
        return pub.decode(), topic.decode(), int(seq)
    except ValueError:
        return None


@dataclass
class Msg:
    """One message of one publisher: when it was first written to a broker and first acknowledged."""

    pub: str
    topic: str
    seq: int
    qos: int
    sent: float
    node_sent: str
    acked: float | None = None  # PUBACK, or PUBREC for QoS 2, with a success reason code
    node_acked: str = ""
    refused: int = 0  # v5 acks with a failure reason code (the message is then sent again)
    sends: int = 1  # PUBLISH writes (resends after reconnects included)
    # ordered only among the messages its publisher had acknowledged by the same node (a publisher without
    # a session, over HTTP: two requests answered by two nodes take two paths to a subscriber)
    per_node: bool = False


@dataclass
class Delivery:
    """A PUBLISH handed to the subscribing application (after the receiver's own QoS 2 dedup)."""

    t: float
    sub: str
    pub: str
    topic: str
    seq: int
    qos: int
    dup: bool
    packet_id: int
    node: str
    conn: int


@dataclass
class Conn:
    """One connection of a client that got a CONNACK, accepted or not."""

    client: str
    idx: int
    node: str
    t_connect: float
    t_connack: float
    reason: int
    session_present: bool
    t_closed: float | None = None
    cause: str = ""  # why the client left it: eof, keepalive, takeover, stop, error...


@dataclass
class Fault:
    """One fault the nemesis injected; `end` is when it was healed (None while active)."""

    id: int
    kind: str
    target: str
    start: float
    end: float | None = None
    detail: str = ""


@dataclass
class SubInfo:
    version: int
    qos: int
    filter: str
    suback: float | None = None  # the first successful SUBACK
    subacks: int = 0


@dataclass
class History:
    t0: float = field(default_factory=time.monotonic)
    t0_wall: float = field(default_factory=time.time)  # to find t in the nodes' logs
    msgs: dict[MsgKey, Msg] = field(default_factory=dict)
    subs: dict[str, SubInfo] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    qos2_deduped: dict[str, int] = field(default_factory=dict)  # QoS 2 resends the receiver dropped
    conns: list[Conn] = field(default_factory=list)
    refusals: list[tuple[str, str, int, float]] = field(default_factory=list)  # CONNACK failures
    session_lost: list[tuple[str, float, str]] = field(default_factory=list)  # (client, t, node)
    corrupt: list[tuple[str, float, str]] = field(default_factory=list)  # (client, t, what)
    faults: list[Fault] = field(default_factory=list)
    node_exits: list[tuple[str, float, int | None, bool]] = field(default_factory=list)  # expected?
    lingering: list[tuple[str, str, float, float | None, int | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    end: float | None = None  # when the checks were run

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- publishers
    def sent(self, pub: str, topic: str, seq: int, qos: int, node: str, per_node: bool = False) -> None:
        key = (pub, topic, seq)
        m = self.msgs.get(key)
        if m is None:
            self.msgs[key] = Msg(pub, topic, seq, qos, self.now(), node, per_node=per_node)
        else:
            m.sends += 1

    def acked(self, key: MsgKey, node: str) -> None:
        m = self.msgs[key]
        if m.acked is None:
            m.acked, m.node_acked = self.now(), node

    def refused(self, key: MsgKey) -> None:
        self.msgs[key].refused += 1

    # -- subscribers
    def subscribed(self, sub: str, ok: bool) -> None:
        info = self.subs[sub]
        if ok:
            info.subacks += 1
            if info.suback is None:
                info.suback = self.now()

    def delivered(self, d: Delivery) -> None:
        self.deliveries.append(d)

    def deduped(self, sub: str) -> None:
        self.qos2_deduped[sub] = self.qos2_deduped.get(sub, 0) + 1

    # -- faults
    def fault(self, kind: str, target: str, detail: str = "") -> Fault:
        f = Fault(len(self.faults) + 1, kind, target, self.now(), None, detail)
        self.faults.append(f)
        return f

    def healed(self, f: Fault, detail: str = "") -> None:
        f.end = self.now()
        self.more(f, detail)

    def more(self, f: Fault, detail: str) -> None:
        """Add to what the timeline says a fault did (while it is still under way)."""
        if detail:
            f.detail = f"{f.detail}; {detail}" if f.detail else detail

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["msgs"] = [asdict(m) for m in self.msgs.values()]
        return d
