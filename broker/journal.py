"""The journal of a persistent session: what of it the store does not have yet.

A persistent session in a durable store writes ahead: a delivery's place in the window or queue (with its
packet id and QoS 2 stage) and each incoming QoS 2 packet id awaiting PUBREL are recorded here, and the
committer stores them before anything that depends on them is acknowledged or sent. The journal also
numbers deliveries in session order (so a store can restore queue and window in order) and reserves
numbers for deliveries a pull brings from the store, ahead of later ones.

The first change since the last commit asks the committer for one (``JournalSink.journal_changed``);
the committer then takes the changes (``take``) in the batch it builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .message import Delivery


class JournalSink(Protocol):
    """Where a journal's changes go (the group committer)."""

    def journal_changed(self, journal: Journal) -> None: ...


@dataclass(slots=True)
class JournalChanges:
    """What changed in an owned persistent session since the last commit (fenced by its epoch):
    deliveries by message id (None = gone) and incoming QoS 2 packet ids (None = released)."""

    client_id: str
    epoch: int
    next_pid: int
    order: int
    deliveries: dict[int, Delivery | None]
    #: awaiting-PUBREL packet ids: the time received (the event loop's clock) and the receipt its
    #: message got (0: none)
    rel: dict[int, tuple[float, int] | None]
    #: message ids of deliveries routed into the session here since the last commit (the store has no
    #: copy of them yet): if the session turns out to be fenced, they are queued for its new owner
    fresh: list[int]
    #: the receipts counter (Session.received), and the highest receipt accepted per publisher
    #: incarnation that changed (Message.receipt)
    received: int = 0
    seen: dict[str, int] | None = None
    #: the positions reserved for what a pull brings (Journal.hold): from this one on, or -1 once none
    #: is (caught up); None: unchanged
    hold: int | None = None
    #: while catching up, fresh deliveries from this position on were taken without checking their
    #: receipt (Session.admit): the store does not keep one whose receipt it accepted already
    unchecked_from: int | None = None


class Journal:
    __slots__ = (
        "_deliveries",
        "_fresh",
        "_hold",
        "_rel",
        "_seen",
        "_sink",
        "_unchecked_from",
        "client_id",
        "epoch",
        "next_pid",
        "order",
        "received",
    )

    def __init__(
        self, client_id: str, epoch: int, sink: JournalSink, order: int = 0, next_pid: int = 1
    ) -> None:
        self.client_id = client_id
        self.epoch = epoch
        self._sink = sink
        self._deliveries: dict[int, Delivery | None] = {}
        self._rel: dict[int, tuple[float, int] | None] = {}
        self._fresh: list[int] = []
        self._seen: dict[str, int] = {}
        self._hold: int | None = None
        self._unchecked_from: int | None = None
        #: the session's receipts counter (kept current by the session), stored with every commit
        self.received = 0
        #: the next delivery's position in session order; only grows
        self.order = order
        #: the session's next packet id (kept current by the session), stored with every commit
        self.next_pid = next_pid

    def _changed(self) -> None:
        if not self.pending:
            self._sink.journal_changed(self)  # the first change since the last commit: ask for one

    def place(self, d: Delivery) -> None:
        """Give a delivery its position in session order (one the store gave it is kept: it came from
        the store; one without is new, routed here)."""
        if d.order < 0:
            d.order = self.order
            self.order += 1
            self._fresh.append(d.msg.msg_id)
        elif d.order >= self.order:
            self.order = d.order + 1

    def reserve(self, n: int) -> int:
        """Reserve `n` positions, ahead of later deliveries, for what a pull brings; returns the first."""
        first = self.order
        self.order += n
        return first

    def hold(self, first: int) -> None:
        """Deliveries are held back behind positions reserved from `first` for what the store queued
        (Session.hold_back), or no longer (-1). The store keeps it with the session: if the pull that
        would fill them never runs, whoever opens the session next puts what was queued then into those
        positions, not after the deliveries held back behind them (Redis move_queue).

        Held back, a delivery routed here is taken before its receipt is checked (Session.admit); if the
        session moves on before it is, the store must not keep a copy it knows to be a repeat."""
        self._changed()
        self._hold = first
        self._unchecked_from = self.order if first >= 0 else None

    def put(self, d: Delivery) -> None:
        """A delivery entered the window or the queue, or changed (packet id, stage)."""
        self._changed()
        self._deliveries[d.msg.msg_id] = d

    def gone(self, d: Delivery) -> None:
        """A delivery left the session (acknowledged, sent as QoS 0, dropped)."""
        self._changed()
        self._deliveries[d.msg.msg_id] = None

    def awaiting(self, packet_id: int, ts: float, receipt: int = 0) -> None:
        """An incoming QoS 2 packet id awaits PUBREL (with the receipt its message got, if any)."""
        self._changed()
        self._rel[packet_id] = (ts, receipt)

    def seen(self, incarnation: str, receipt: int) -> None:
        """The session accepted a message with this receipt of that publisher incarnation."""
        self._changed()
        self._seen[incarnation] = receipt

    def released(self, packet_id: int) -> None:
        self._changed()
        self._rel[packet_id] = None

    @property
    def pending(self) -> bool:
        return bool(self._deliveries or self._rel or self._seen or self._hold is not None)

    def take(self) -> JournalChanges | None:
        """The changes since the last call (and forget them), or None when there are none."""
        if not self.pending:
            return None
        changes = JournalChanges(
            self.client_id,
            self.epoch,
            self.next_pid,
            self.order,
            self._deliveries,
            self._rel,
            self._fresh,
            self.received,
            self._seen or None,
            self._hold,
            self._unchecked_from,
        )
        self._deliveries, self._rel, self._fresh, self._seen, self._hold = {}, {}, [], {}, None
        return changes
