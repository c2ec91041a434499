"""The MQTT session (EMQX's emqx_session): subscriptions, Inflight Window, Message Queue, awaiting PUBREL.

A pure state machine: methods take the current time and return the deliveries to put on the wire, so the
EMQX semantics (window, drop-oldest, FIFO refill, retransmission order, QoS2 exactly once) are tested
without sockets. A session outlives its connections; the channel that owns it encodes what it returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .inflight import Inflight
from .message import Delivery
from .mqueue import MQueue
from .router import Subscription
from .zones import ZoneSettings


class AwaitingRelFull(Exception):
    """More incoming QoS2 messages await PUBREL than max_awaiting_rel allows."""


class Session:
    __slots__ = (
        "_next_pid",
        "awaiting_rel",
        "client_id",
        "created_at",
        "dirty",
        "dirty_rel",
        "epoch",
        "expiry_interval",
        "inflight",
        "mqueue",
        "on_dirty",
        "order",
        "receive_maximum",
        "subscriptions",
        "zone",
        "zone_name",
    )

    def __init__(
        self,
        client_id: str,
        zone: ZoneSettings,
        zone_name: str = "default",
        *,
        expiry_interval: float = 0.0,
        receive_maximum: int = 0,
        now: float = 0.0,
    ) -> None:
        self.client_id = client_id
        self.zone = zone
        self.zone_name = zone_name
        self.expiry_interval = expiry_interval
        self.receive_maximum = receive_maximum  # the client's (MQTT 5), 0 = not announced
        self.subscriptions: dict[str, Subscription] = {}
        self.inflight = Inflight(self._window())
        self.mqueue = MQueue(zone.max_mqueue_len)
        self.awaiting_rel: dict[int, float] = {}  # incoming QoS2 packet id -> time received
        self.created_at = now
        self.epoch = 0  # ownership generation in the store (fencing)
        # Journal of a persistent session in a durable store: deliveries (by message id) and incoming
        # QoS2 packet ids changed since the last commit; None = delete. None when not journaled.
        self.dirty: dict[int, Delivery | None] | None = None
        self.dirty_rel: dict[int, float | None] | None = None
        self.order = 0  # next delivery's position, so a store can restore queue and window order
        self.on_dirty: Callable[[Session], None] | None = None
        self._next_pid = 1

    # -- zone (live changes apply at the next delivery) -------------------------------------------
    def _window(self) -> int:
        limit = self.zone.max_inflight
        rm = self.receive_maximum
        if rm and (not limit or rm < limit):
            return rm
        return limit

    def enable_journal(self) -> None:
        """Record every change for a durable store from now on (persistent sessions)."""
        if self.dirty is None:
            self.dirty = {}
            self.dirty_rel = {}

    def take_journal(self) -> tuple[dict[int, Delivery | None], dict[int, float | None]] | None:
        """The changes since the last call (and forget them), or None when there are none."""
        dirty, rel = self.dirty, self.dirty_rel
        if not dirty and not rel:
            return None
        assert dirty is not None and rel is not None
        self.dirty, self.dirty_rel = {}, {}
        return dirty, rel

    def _mark(self, msg_id: int, d: Delivery | None) -> None:
        dirty = self.dirty
        if dirty is None:
            return
        if not dirty and not self.dirty_rel and self.on_dirty is not None:
            self.on_dirty(self)  # first change since the last commit: ask for one
        dirty[msg_id] = d

    def _mark_rel(self, packet_id: int, ts: float | None) -> None:
        rel = self.dirty_rel
        if rel is None:
            return
        if not rel and not self.dirty and self.on_dirty is not None:
            self.on_dirty(self)
        rel[packet_id] = ts

    def _forget(self, gone: list[Delivery]) -> list[Delivery]:
        if self.dirty is not None:
            for d in gone:
                self._mark(d.msg.msg_id, None)
        return gone

    def forget(self, d: Delivery) -> None:
        """A delivery the store journaled for this session left it without entering the window (sent as
        QoS 0, or dropped): the journal drops it too."""
        self._mark(d.msg.msg_id, None)

    def take_queued(self, pred: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take out of the Message Queue every delivery `pred` picks (the journal forgets them)."""
        return self._forget(self.mqueue.take(pred))

    def apply_zone(self, zone: ZoneSettings) -> list[Delivery]:
        """Adopt new zone settings; return deliveries dropped because the queue limit shrank."""
        self.zone = zone
        self.inflight.max_size = self._window()
        self.mqueue.max_len = zone.max_mqueue_len
        return self._forget(self.mqueue.trim())

    def set_receive_maximum(self, value: int) -> None:
        self.receive_maximum = value
        self.inflight.max_size = self._window()

    # -- outgoing QoS1/2 --------------------------------------------------------------------------
    def deliver(self, d: Delivery, now: float, hold: bool = False) -> tuple[Delivery | None, list[Delivery]]:
        """Put a QoS1/2 delivery in the window if there is room (returned to send), else queue it.

        Returns (delivery to send or None, deliveries dropped from the queue). `hold` queues it anyway
        (the client's socket is congested).
        """
        if d.order < 0:
            d.order = self.order
            self.order += 1
        elif d.order >= self.order:
            self.order = d.order + 1
        if hold or self.mqueue or self.inflight.full():
            # FIFO: while anything waits in the queue, a newcomer goes behind it.
            dropped = self.mqueue.push(d)
            if self.dirty is not None:
                self._mark(d.msg.msg_id, d)
                self._forget(dropped)
            return None, dropped
        self._assign(d, now)
        return d, []

    def enqueue(self, d: Delivery) -> list[Delivery]:
        """Queue a delivery for an offline session (or a QoS0 kept for one); return the dropped oldest."""
        d.order = self.order
        self.order += 1
        return self.mqueue.push(d)

    def _assign(self, d: Delivery, now: float) -> None:
        d.packet_id = self._alloc_pid()
        d.stage = 0
        d.sent_at = now
        self.inflight.insert(d)
        if self.dirty is not None:
            self._mark(d.msg.msg_id, d)

    def _alloc_pid(self) -> int:
        inflight = self.inflight
        pid = self._next_pid
        if pid not in inflight:  # the common case: ids are handed out in order and acked in order
            self._next_pid = pid + 1 if pid < 65535 else 1
            return pid
        for _ in range(65535):
            if pid not in inflight:
                break
            pid = pid + 1 if pid < 65535 else 1
        else:  # pragma: no cover - the window never exceeds 65535
            raise RuntimeError("no free packet identifier")
        self._next_pid = pid + 1 if pid < 65535 else 1
        return pid

    def refill(self, now: float) -> tuple[list[Delivery], list[Delivery]]:
        """Move queued deliveries into the window, FIFO. Returns (to send, expired and dropped)."""
        sent: list[Delivery] = []
        expired: list[Delivery] = []
        mqueue, inflight = self.mqueue, self.inflight
        wall = time.time()  # message expiry is wall-clock time (it travels between nodes)
        while mqueue and not inflight.full():
            d = mqueue.pop()
            assert d is not None
            if d.msg.expires_at is not None and d.msg.expired(wall):
                expired.append(d)
                continue
            if d.qos == 0:
                sent.append(d)  # a QoS0 kept while offline: sent, never enters the window
                self._mark(d.msg.msg_id, None)
                continue
            self._assign(d, now)
            sent.append(d)
        self._forget(expired)
        return sent, expired

    def puback(self, packet_id: int) -> Delivery | None:
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 1:
            return None
        return self.drop(packet_id)

    def drop(self, packet_id: int) -> Delivery | None:
        """Take a delivery out of the window (acknowledged, refused, or undeliverable)."""
        d = self.inflight.pop(packet_id)
        if d is not None and self.dirty is not None:
            self._mark(d.msg.msg_id, None)
        return d

    def pubrec(self, packet_id: int, now: float, failed: bool = False) -> Delivery | None:
        """A PUBREC: the entry moves to the PUBREL stage in place (or leaves the window if it failed)."""
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 2:
            return None
        if failed:
            return self.drop(packet_id)
        d.stage = 1
        d.sent_at = now
        self._mark(d.msg.msg_id, d)
        return d

    def pubcomp(self, packet_id: int) -> Delivery | None:
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 2 or d.stage != 1:
            return None
        return self.drop(packet_id)

    def retry_due(self, now: float, interval: float) -> list[Delivery]:
        """Entries unacknowledged for `interval`, in original order; their timers restart."""
        due = []
        for d in self.inflight:
            if now - d.sent_at >= interval:
                d.sent_at = now
                due.append(d)
        return due

    def next_retry(self, interval: float) -> float | None:
        """The earliest time a retransmission falls due, or None when nothing is inflight."""
        times = [d.sent_at for d in self.inflight]
        return min(times) + interval if times else None

    def pending_resend(self, now: float) -> list[Delivery]:
        """On resume: every unacknowledged PUBLISH and PUBREL, original order and packet ids."""
        out = []
        for d in self.inflight:
            d.sent_at = now
            out.append(d)
        return out

    # -- incoming QoS2 ----------------------------------------------------------------------------
    def await_rel(self, packet_id: int, now: float) -> bool:
        """Register an incoming QoS2 PUBLISH; False if it is a duplicate (already delivered once)."""
        if packet_id in self.awaiting_rel:
            return False
        limit = self.zone.max_awaiting_rel
        if limit and len(self.awaiting_rel) >= limit:
            self.expire_awaiting_rel(now)
            if len(self.awaiting_rel) >= limit:
                raise AwaitingRelFull(packet_id)
        self.awaiting_rel[packet_id] = now
        self._mark_rel(packet_id, now)
        return True

    def release(self, packet_id: int) -> bool:
        """A PUBREL: forget the packet id. False if it was unknown (v5: PUBCOMP 0x92)."""
        if self.awaiting_rel.pop(packet_id, None) is None:
            return False
        self._mark_rel(packet_id, None)
        return True

    def expire_awaiting_rel(self, now: float) -> int:
        """Discard incoming QoS2 entries older than await_rel_timeout; return how many."""
        timeout = self.zone.await_rel_timeout
        stale = [pid for pid, t in self.awaiting_rel.items() if now - t >= timeout]
        for pid in stale:
            del self.awaiting_rel[pid]
            self._mark_rel(pid, None)
        return len(stale)

    def next_awaiting_rel_expiry(self) -> float | None:
        if not self.awaiting_rel:
            return None
        return min(self.awaiting_rel.values()) + self.zone.await_rel_timeout

    def __repr__(self) -> str:
        return (
            f"Session({self.client_id!r}, subs={len(self.subscriptions)}, inflight={len(self.inflight)}, "
            f"mqueue={len(self.mqueue)}, awaiting_rel={len(self.awaiting_rel)})"
        )
