"""Orders to move some of a node's clients to other nodes: a rebalance (after a scale-up, say).

A client stays on the pod it connected to, so pods added to a fleet get only new connections. The
operator finds the pods with more than their share and writes each an order in Redis (keys.rebalance,
with a TTL); a node reads its order with its heartbeat, tells that many of its clients to use another
server at the order's rate (as a stopping node does: MQTT 5 DISCONNECT 0x9C, MQTT 3 a close), and
reports how far it got in its nodeinfo. The clients' sessions move with them through Redis. An order is
carried out once: a new one has a new id.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Order:
    id: str
    count: int  # connections to move
    rate: float  # a second
    until: float  # wall-clock seconds: an order is not started after, and stops at, this time

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Order:
        """The order in `raw`; ValueError says what is wrong with it."""
        try:
            d = json.loads(raw)
            order = cls(str(d["id"]), int(d["count"]), float(d["rate"]), float(d["until"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a rebalance order: {raw[:200]!r}") from e
        if order.count < 0 or order.rate <= 0:
            raise ValueError(f"a rebalance order needs count >= 0 and rate > 0: {raw[:200]!r}")
        return order

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.until


@dataclass
class Progress:
    """How far a node got with an order (reported in its nodeinfo, field ``rebalance``)."""

    id: str
    count: int  # asked for
    evicted: int = 0
    done: bool = False

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, raw: str | bytes) -> Progress | None:
        try:
            d = json.loads(raw)
            return cls(str(d["id"]), int(d["count"]), int(d["evicted"]), bool(d["done"]))
        except (ValueError, KeyError, TypeError):
            return None
