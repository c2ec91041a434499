"""The MQTT session (EMQX's emqx_session): subscriptions, Inflight Window, Message Queue, awaiting PUBREL.

A pure state machine: methods take the current time and return the deliveries to put on the wire, so the
EMQX semantics (window, drop-oldest, FIFO refill, retransmission order, QoS2 exactly once) are tested
without sockets. A session outlives its connections; the channel that owns it encodes what it returns.
A persistent session in a durable store records every change in its journal (journal.py) as it makes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from . import inflight as window
from .inflight import Inflight
from .journal import Journal, JournalSink
from .message import Delivery
from .mqueue import UNMADE, MQueue, for_zone
from .router import Subscription
from .zones import ZoneSettings

#: the awaiting-PUBREL dict of every session without one of its own: read, never written (`_awaiting`)
NO_AWAITING_REL: Final[dict[int, float]] = {}


class AwaitingRelFull(Exception):
    """More incoming QoS2 messages await PUBREL than max_awaiting_rel allows."""


class Session:
    __slots__ = (
        "_epoch",
        "_next_pid",
        "awaiting_rel",
        "client_id",
        "created_at",
        "expiry_interval",
        "held_from",
        "incarnation",
        "inflight",
        "journal",
        "mqueue",
        "receipts",
        "receive_maximum",
        "received",
        "seen",
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
        self.inflight: Inflight = window.UNMADE  # (its own made by the first delivery: `_own_window`)
        self.mqueue: MQueue = UNMADE  # (made by the first delivery that waits: `_queue`)
        # incoming QoS2 packet id -> time received; one shared empty dict until the first (`_awaiting`)
        self.awaiting_rel: dict[int, float] = NO_AWAITING_REL
        # Receipts (Message.receipt), on a store without cross-slot transactions: this session's
        # incarnation in the store, the receipts it gave, those of its ids awaiting PUBREL, and the
        # highest receipt of each publisher incarnation it accepted.
        self.incarnation = ""
        self.received = 0
        # (both made by their first entry: most sessions never have one, and an empty dict is 64 bytes)
        self.receipts: dict[int, int] | None = None
        self.seen: dict[str, int] | None = None
        self.created_at = now
        self.journal: Journal | None = None  # a persistent session's, in a durable store
        self._epoch = 0
        #: while catching up after opening on a node: deliveries from this position on wait in the queue
        self.held_from: int | None = None
        self._next_pid = 1

    @property
    def epoch(self) -> int:
        """Ownership generation in the store (fencing); the journal's writes carry it."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value
        if self.journal is not None:
            self.journal.epoch = value

    @property
    def next_pid(self) -> int:
        """The packet id the next delivery gets, unless it is taken (what a store keeps)."""
        return self._next_pid

    @property
    def order(self) -> int:
        """The next delivery's position in session order (kept by the journal; 0 when there is none)."""
        return self.journal.order if self.journal is not None else 0

    # -- zone (live changes apply at the next delivery) -------------------------------------------
    def _window(self) -> int:
        limit = self.zone.max_inflight
        rm = self.receive_maximum
        if rm and (not limit or rm < limit):
            return rm
        return limit

    def enable_journal(self, sink: JournalSink) -> Journal:
        """Record every change for a durable store from now on (persistent sessions)."""
        if self.journal is None:
            self.journal = Journal(self.client_id, self.epoch, sink, next_pid=self._next_pid)
        return self.journal

    def restore(
        self,
        *,
        epoch: int,
        expiry_interval: float,
        next_pid: int,
        order: int,
        subscriptions: Iterable[tuple[str, Subscription]],
        deliveries: Iterable[Delivery],
        awaiting_rel: Iterable[tuple[int, float, int]],
        sink: JournalSink,
        incarnation: str = "",
        received: int = 0,
        seen: dict[str, int] | None = None,
        twins: dict[tuple[str, int], int] | None = None,
    ) -> list[Delivery]:
        """Take back what a store kept of this session: deliveries with a packet id were sent and go back
        into the window (to be resent first), the others into the queue, in session order. Returns the
        ones the queue had no room for (a lowered limit), already forgotten by the journal."""
        self.epoch = epoch
        self.expiry_interval = expiry_interval
        self._next_pid = next_pid
        self.subscriptions.update(subscriptions)
        journal = self.enable_journal(sink)
        journal.order = order
        self.incarnation = incarnation
        self.received = journal.received = received
        for inc, number in (seen or {}).items():
            self._saw(inc, number)
        dropped: list[Delivery] = []
        repeats: list[Delivery] = []
        # Two copies under one receipt: the store queued one while the session took the message straight
        # from its publisher's node (Channel.deliver_stored), and removing it did not reach the store.
        # The one the client was sent (a packet id) stays, so its resend is recognised; else the first.
        # A copy the store marked (`twins`): the session took that message straight from its publisher's
        # node after another copy had been queued for it through the store; an unsent other copy is a
        # repeat even when the marked one is no longer here (delivered and acknowledged).
        kept: dict[tuple[str, int], Delivery] = {}
        deliveries = sorted(deliveries, key=lambda d: d.order)
        for d in sorted(deliveries, key=lambda d: d.packet_id == 0):
            if (mr := d.msg.receipt) is not None:
                own = twins.get(mr) if twins else None
                if mr in kept or (own is not None and own != d.msg.msg_id and not d.packet_id):
                    repeats.append(d)
                else:
                    kept[mr] = d
        # A delivery the session holds is one it took, even if taking it was not yet recorded (one taken
        # while catching up is recorded by caught_up, which may not have come): a resend under its receipt
        # is a repeat. (Anything older of its publisher was queued before it, so it is here too.)
        # The store must know it too: else a resend under that receipt, routed through the store, is
        # queued as new, and once this copy is delivered and gone the next owner delivers it again.
        for inc, number in kept:
            if number > self.seen_of(inc):
                self._saw(inc, number)
                journal.seen(inc, number)
        gone = {id(d) for d in repeats}
        for d in deliveries:
            if id(d) in gone:
                continue
            if d.packet_id:
                self._own_window().insert(d)
            else:
                dropped += self._queue().push(d)
        for pid, ts, receipt in awaiting_rel:
            self._awaiting()[pid] = ts
            if receipt:
                self._give_receipt(pid, receipt)
        self._forget(repeats)
        return self._forget(dropped)

    def forget(self, d: Delivery) -> None:
        """A delivery the store journaled for this session left it without entering the window (sent as
        QoS 0, or dropped): the journal drops it too."""
        if self.journal is not None:
            self.journal.gone(d)

    def _forget(self, gone: list[Delivery]) -> list[Delivery]:
        j = self.journal
        if j is not None:
            for d in gone:
                j.gone(d)
        return gone

    def take_queued(self, pred: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take out of the Message Queue every delivery `pred` picks (the journal forgets them)."""
        return self._forget(self.mqueue.take(pred))

    def apply_zone(self, zone: ZoneSettings) -> list[Delivery]:
        """Adopt new zone settings; return deliveries dropped because the queue limit shrank."""
        self.zone = zone
        if self.inflight is not window.UNMADE:
            self.inflight.max_size = self._window()
        if self.mqueue is UNMADE:
            return []
        self.mqueue = for_zone(
            zone.max_mqueue_len, zone.mqueue_overflow == "dropNew", zone.max_mqueue_bytes, self.mqueue
        )
        return self._forget(self.mqueue.trim())

    @property
    def window_size(self) -> int:
        """How many deliveries the Inflight Window takes (0: no limit), made or not."""
        return self._window()

    def _own_window(self) -> Inflight:
        """The Inflight Window, to add to: made now if the session had none yet (the shared UNMADE)."""
        w = self.inflight
        if w is window.UNMADE:
            w = self.inflight = Inflight(self._window())
        return w

    def _queue(self) -> MQueue:
        """The Message Queue, to add to: made now if the session had none yet (the shared UNMADE)."""
        q = self.mqueue
        if q is UNMADE:
            zone = self.zone
            q = self.mqueue = for_zone(
                zone.max_mqueue_len, zone.mqueue_overflow == "dropNew", zone.max_mqueue_bytes
            )
        return q

    def set_receive_maximum(self, value: int) -> None:
        self.receive_maximum = value
        if self.inflight is not window.UNMADE:
            self.inflight.max_size = self._window()

    # -- catching up after opening on a node ------------------------------------------------------
    def hold_back(self, reserve: int) -> int:
        """The store may still hold deliveries that this node routed to the session through it just before
        the session opened here (later ones come straight here): reserve `reserve` positions for them,
        ahead of every later delivery, and keep later deliveries in the queue, unsent, until `caught_up`.
        Returns the first reserved position (journaled sessions only)."""
        journal = self.journal
        assert journal is not None
        first = journal.reserve(reserve)
        journal.hold(first)
        self.held_from = journal.order
        return first

    def insert(self, d: Delivery) -> list[Delivery]:
        """A delivery from the store with a position reserved by `hold_back`: into the queue at its place,
        before what was held back. Returns the oldest dropped if the queue is full (forgotten)."""
        mqueue = self._queue()
        at = len(mqueue)
        while at and mqueue[at - 1].order > d.order:
            at -= 1
        mqueue.insert(at, d)
        if self.journal is not None:
            self.journal.put(d)
        return self._forget(mqueue.trim())

    def caught_up(self) -> list[Delivery]:
        """What the store held is in. The receipts of what waited behind it (`admit`) are checked now, in
        queue order; returns the repeats taken out (forgotten)."""
        held, self.held_from = self.held_from, None
        if held is None:
            return []
        if self.journal is not None:
            self.journal.hold(-1)
        repeats = [
            d for d in self.mqueue
            if d.order >= held and d.msg.receipt is not None and not self.accept(d.msg.receipt)
        ]  # fmt: skip
        if repeats:
            gone = {id(d) for d in repeats}
            self.mqueue.take(lambda d: id(d) in gone)
        return self._forget(repeats)

    # -- outgoing QoS1/2 --------------------------------------------------------------------------
    def deliver(self, d: Delivery, now: float, hold: bool = False) -> tuple[Delivery | None, list[Delivery]]:
        """Put a QoS1/2 delivery in the window if there is room (returned to send), else queue it.

        Returns (delivery to send or None, deliveries dropped from the queue). `hold` queues it anyway
        (the client's socket is congested).
        """
        j = self.journal
        if j is not None:
            j.place(d)
        inflight = self.inflight
        # FIFO: while anything waits in the queue, a newcomer goes behind it (the window's full() inline)
        if hold or self.mqueue or 0 < inflight.max_size <= len(inflight) or self.held_from is not None:
            dropped = self._queue().push(d)
            if j is not None:
                j.put(d)
                self._forget(dropped)
            return None, dropped
        self._assign(d, now)
        return d, []

    def enqueue(self, d: Delivery) -> list[Delivery]:
        """Queue a delivery for an offline session (or a QoS0 kept for one); return the dropped oldest."""
        if self.journal is not None:
            self.journal.place(d)
        return self._queue().push(d)

    def _assign(self, d: Delivery, now: float) -> None:
        d.packet_id = self._alloc_pid()
        d.stage = 0
        d.sent_at = now
        self._own_window()[d.packet_id] = d
        if self.journal is not None:
            self.journal.put(d)

    def _alloc_pid(self) -> int:
        inflight = self.inflight
        pid = self._next_pid
        if pid not in inflight:  # the common case: ids are handed out in order and acked in order
            self._next_pid = pid + 1 if pid < 65535 else 1
            if self.journal is not None:
                self.journal.next_pid = self._next_pid
            return pid
        for _ in range(65535):
            if pid not in inflight:
                break
            pid = pid + 1 if pid < 65535 else 1
        else:  # pragma: no cover - the window never exceeds 65535
            raise RuntimeError("no free packet identifier")
        self._next_pid = pid + 1 if pid < 65535 else 1
        if self.journal is not None:
            self.journal.next_pid = self._next_pid
        return pid

    def refill(self, now: float, wall: float | None = None) -> tuple[list[Delivery], list[Delivery]]:
        """Move queued deliveries into the window, FIFO. Returns (to send, expired and dropped).

        Message expiry is wall-clock time (it travels between nodes): `wall`, or the clock's now.
        """
        sent: list[Delivery] = []
        expired: list[Delivery] = []
        mqueue = self.mqueue
        inflight = self._own_window() if mqueue else self.inflight
        if wall is None:
            wall = time.time()
        held_from = self.held_from
        while mqueue and not inflight.full():
            if held_from is not None and mqueue[0].order >= held_from:
                break  # held back until the deliveries reserved ahead of it are in (hold_back)
            d = mqueue.popleft()
            if d.msg.expires_at is not None and d.msg.expired(wall):
                expired.append(d)
                continue
            if d.qos == 0:
                sent.append(d)  # a QoS0 kept while offline: sent, never enters the window
                self.forget(d)
                continue
            self._assign(d, now)
            sent.append(d)
        self._forget(expired)
        return sent, expired

    def puback(self, packet_id: int) -> Delivery | None:
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 1:
            return None
        del self.inflight[packet_id]
        if self.journal is not None:
            self.journal.gone(d)
        return d

    def drop(self, packet_id: int) -> Delivery | None:
        """Take a delivery out of the window (acknowledged, refused, or undeliverable)."""
        d = self.inflight.pop(packet_id)
        if d is not None and self.journal is not None:
            self.journal.gone(d)
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
        if self.journal is not None:
            self.journal.put(d)
        return d

    def pubcomp(self, packet_id: int) -> Delivery | None:
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 2 or d.stage != 1:
            return None
        return self.drop(packet_id)

    def retry_due(self, now: float, interval: float) -> list[Delivery]:
        """Entries unacknowledged for `interval`, in original order; their timers restart."""
        due = []
        for d in self.inflight.values():
            if now - d.sent_at >= interval:
                d.sent_at = now
                due.append(d)
        return due

    def next_retry(self, interval: float) -> float | None:
        """The earliest time a retransmission falls due, or None when nothing is inflight."""
        times = [d.sent_at for d in self.inflight.values()]
        return min(times) + interval if times else None

    def pending_resend(self, now: float) -> list[Delivery]:
        """On resume: every unacknowledged PUBLISH and PUBREL, original order and packet ids."""
        out = []
        for d in self.inflight.values():
            d.sent_at = now
            out.append(d)
        return out

    # -- incoming QoS2 ----------------------------------------------------------------------------
    def _awaiting(self) -> dict[int, float]:
        """This session's own awaiting-PUBREL dict, made at its first entry (most sessions never have
        one: an empty dict is 64 bytes, and NO_AWAITING_REL is every such session's)."""
        awaiting = self.awaiting_rel
        if awaiting is NO_AWAITING_REL:
            awaiting = self.awaiting_rel = {}
        return awaiting

    def await_rel(self, packet_id: int, now: float, receipt: bool = False) -> bool:
        """Register an incoming QoS2 PUBLISH, with a receipt if asked (receipt_of); False if it is a
        duplicate (already delivered once)."""
        if packet_id in self.awaiting_rel:
            return False
        limit = self.zone.max_awaiting_rel
        if limit and len(self.awaiting_rel) >= limit:
            self.expire_awaiting_rel(now)
            if len(self.awaiting_rel) >= limit:
                raise AwaitingRelFull(packet_id)
        self._awaiting()[packet_id] = now
        number = 0
        if receipt:
            number = self.received = self.received + 1
            self._give_receipt(packet_id, number)
        if self.journal is not None:
            self.journal.received = self.received
            self.journal.awaiting(packet_id, now, number)
        return True

    def receipt_of(self, packet_id: int) -> tuple[str, int] | None:
        """The receipt of a message awaiting PUBREL, if it got one."""
        receipts = self.receipts
        number = receipts.get(packet_id) if receipts is not None else None
        return (self.incarnation, number) if number else None

    def seen_of(self, incarnation: str) -> int:
        """The highest receipt number of a publisher incarnation this session accepted (0: none)."""
        seen = self.seen
        return seen.get(incarnation, 0) if seen is not None else 0

    def _saw(self, incarnation: str, number: int) -> None:
        seen = self.seen
        if seen is None:
            seen = self.seen = {}
        seen[incarnation] = number

    def _give_receipt(self, packet_id: int, number: int) -> None:
        receipts = self.receipts
        if receipts is None:
            receipts = self.receipts = {}
        receipts[packet_id] = number

    def _drop_receipt(self, packet_id: int) -> None:
        if self.receipts is not None:
            self.receipts.pop(packet_id, None)

    def accept(self, receipt: tuple[str, int], stored: bool = False) -> bool:
        """Whether a message with this receipt is new to this session (and remember that it is not
        any more); False for a repeat, which a publisher's resend routes again. `stored`: the store
        accepted it already (a pull), so the journal has nothing to add."""
        incarnation, number = receipt
        if number <= self.seen_of(incarnation):
            return False
        self._saw(incarnation, number)
        if self.journal is not None and not stored:
            self.journal.seen(incarnation, number)
        return True

    def admit(self, receipt: tuple[str, int], order: int | None = None, stored: bool = False) -> bool:
        """Whether to take a message with this receipt routed here now (`order` None) or pulled from the
        store (at `order`); a repeat is not taken. While catching up (hold_back), one that waits behind
        the held-back point is taken for now and checked by `caught_up`, in queue order: an older message
        of its publisher may still be on its way from the store, and accepting the newer number first
        would make the older one look like a repeat. (The store does not keep one whose receipt it has
        accepted already: Journal.hold.)"""
        held = self.held_from
        if held is not None and (order is None or order >= held):
            return True
        return self.accept(receipt, stored)

    def release(self, packet_id: int) -> bool:
        """A PUBREL: forget the packet id. False if it was unknown (v5: PUBCOMP 0x92)."""
        if self.awaiting_rel.pop(packet_id, None) is None:
            return False
        self._drop_receipt(packet_id)
        if self.journal is not None:
            self.journal.released(packet_id)
        return True

    def expire_awaiting_rel(self, now: float) -> int:
        """Discard incoming QoS2 entries older than await_rel_timeout; return how many."""
        timeout = self.zone.await_rel_timeout
        stale = [pid for pid, t in self.awaiting_rel.items() if now - t >= timeout]
        for pid in stale:
            del self.awaiting_rel[pid]
            self._drop_receipt(pid)
            if self.journal is not None:
                self.journal.released(pid)
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
