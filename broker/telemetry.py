"""Observable facts of one zone: each is one call that bumps its counter and emits its event.

A channel (or the channel manager) says what happened, once: a message received, delivered, resent,
acknowledged or dropped, a window full, a connection opened or closed. The per-message events are logged
for the sample of message ids the event log keeps (decided inline: a multiply, an AND and a comparison),
the other events always; counters always count.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from typing import Protocol

from .eventschema import (
    ACK,
    AWAITING_REL_TIMEOUT,
    BRIDGE_RECONNECT,
    CONNECT,
    DELIVER,
    DISCONNECT,
    DROP,
    INFLIGHT_FULL,
    KEEPALIVE_TIMEOUT,
    PUBLISH_IN,
    RETRANSMIT,
    SAMPLE_MASK,
    SAMPLE_MIX,
    TAKEOVER,
    DropReason,
)
from .message import Delivery, Message
from .metrics import ZoneMetrics


class EventSink(Protocol):
    """The event log as telemetry sees it (events.EventLog)."""

    #: per-message events are kept for message ids with ``(msg_id * SAMPLE_MIX) & SAMPLE_MASK < keep``
    keep: int

    def emit(
        self,
        event: str,
        zone: str,
        client_id: str,
        msg_id: int = -1,
        topic: str = "",
        qos: int = -1,
        packet_id: int = -1,
        nbytes: int = -1,
        reason: str = "",
        inflight_len: int = -1,
        mqueue_len: int = -1,
    ) -> None: ...


class Backlog(Protocol):
    """What an event tells of a session: its window and queue at that moment."""

    @property
    def inflight(self) -> Sized: ...

    @property
    def mqueue(self) -> Sized: ...


class Telemetry:
    __slots__ = ("counters", "log", "zone")

    def __init__(self, zone: str, counters: ZoneMetrics, log: EventSink | None = None) -> None:
        self.zone = zone
        self.counters = counters
        self.log = log

    def _emit(
        self,
        log: EventSink,
        event: str,
        client_id: str,
        msg: Message,
        qos: int,
        packet_id: int,
        reason: str,
        s: Backlog | None,
    ) -> None:
        log.emit(
            event,
            self.zone,
            client_id,
            msg.msg_id,
            msg.topic,
            qos,
            packet_id,
            len(msg.payload),
            reason,
            len(s.inflight) if s is not None else -1,
            len(s.mqueue) if s is not None else -1,
        )

    # -- messages ------------------------------------------------------------------------------------
    def received(self, client_id: str, msg: Message, packet_id: int, s: Backlog | None) -> None:
        self.counters.received[msg.qos] += 1
        log = self.log
        # (the event log keeps a message's events when its id falls in the sample: inline, it is hot)
        if log is not None and (msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < log.keep:
            self._emit(log, PUBLISH_IN, client_id, msg, msg.qos, packet_id or -1, "", s)

    def delivered(
        self, client_id: str, msg: Message, qos: int, packet_id: int, s: Backlog | None, dup: bool = False
    ) -> None:
        """A PUBLISH written to a subscriber; `dup` when it is a resend (counted as a retransmission too)."""
        counters = self.counters
        counters.delivered[qos] += 1
        if dup:
            counters.retransmitted += 1
        log = self.log
        if log is not None and (msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < log.keep:
            self._emit(log, RETRANSMIT if dup else DELIVER, client_id, msg, qos, packet_id or -1, "", s)

    def pubrel_resent(self, client_id: str, d: Delivery, s: Backlog | None) -> None:
        self.counters.retransmitted += 1
        log = self.log
        if log is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < log.keep:
            self._emit(log, RETRANSMIT, client_id, d.msg, d.qos, d.packet_id, "pubrel", s)

    def acked(self, client_id: str, d: Delivery, s: Backlog | None) -> None:
        """A QoS 1/2 delivery completed (PUBACK, PUBCOMP): its latency from publish counts too."""
        counters = self.counters
        counters.acked[d.qos] += 1
        counters.latency.observe(time.time() - d.msg.ts)
        log = self.log
        if log is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < log.keep:
            self._emit(log, ACK, client_id, d.msg, d.qos, d.packet_id, "", s)

    def dropped(
        self,
        reason: DropReason,
        client_id: str,
        msg: Message | None = None,
        qos: int = -1,
        s: Backlog | None = None,
    ) -> None:
        """One message dropped (every drop is logged, not sampled: drops are what the pipeline sizes for)."""
        self.counters.dropped[reason] += 1
        log = self.log
        if log is None:
            return
        if msg is None:
            log.emit(DROP, self.zone, client_id, reason=reason)
        else:
            self._emit(log, DROP, client_id, msg, msg.qos if qos < 0 else qos, -1, reason, s)

    def dropped_all(
        self, reason: DropReason, client_id: str, dropped: list[Delivery], s: Backlog | None
    ) -> None:
        """Deliveries dropped together (a full queue, a shrunk limit, expired, no longer readable)."""
        self.counters.dropped[reason] += len(dropped)
        log = self.log
        if log is not None:
            for d in dropped:
                self._emit(log, DROP, client_id, d.msg, d.qos, -1, reason, s)

    def dropped_unseen(self, reason: DropReason, client_id: str, n: int, mqueue_len: int = -1) -> None:
        """Messages the store dropped for a session (their ids unknown here)."""
        self.counters.dropped[reason] += n
        log = self.log
        if log is not None:
            for _ in range(n):
                log.emit(DROP, self.zone, client_id, reason=reason, mqueue_len=mqueue_len)

    def bridge_dropped(self, client_id: str, reason: str, n: int) -> None:
        """Messages a bridge's link dropped (counted by the bridge itself: fleetmq_bridge_*)."""
        log = self.log
        if log is not None:
            for _ in range(n):
                log.emit(DROP, self.zone, client_id, reason=reason)

    def bridge_reconnect(self, client_id: str, reason: str) -> None:
        log = self.log
        if log is not None:
            log.emit(BRIDGE_RECONNECT, self.zone, client_id, reason=reason)

    def inflight_full(self, client_id: str, msg: Message, qos: int, s: Backlog | None) -> None:
        self.counters.inflight_full += 1
        log = self.log
        if log is not None:
            self._emit(log, INFLIGHT_FULL, client_id, msg, qos, -1, "", s)

    def awaiting_rel_timeout(self, client_id: str, n: int) -> None:
        """Incoming QoS 2 messages discarded after await_rel_timeout (one event for the lot)."""
        self.counters.dropped[DropReason.AWAITING_REL_TIMEOUT] += n
        if self.log is not None:
            self.log.emit(AWAITING_REL_TIMEOUT, self.zone, client_id, reason=str(n))

    # -- connections and sessions ----------------------------------------------------------------------
    def connected(self, client_id: str, present: bool, s: Backlog) -> None:
        """CONNACK sent; a resumed session brings the backlog that queued while its client was away."""
        if self.log is not None:
            self.log.emit(
                CONNECT,
                self.zone,
                client_id,
                reason="resumed" if present else "new",
                inflight_len=len(s.inflight),
                mqueue_len=len(s.mqueue),
            )

    def disconnected(self, client_id: str, why: str, logged: bool) -> None:
        """A connection closed; `logged` when it had been accepted (its CONNECT event was written)."""
        self.counters.disconnects[why] += 1
        if logged and self.log is not None:
            self.log.emit(DISCONNECT, self.zone, client_id, reason=why)

    def keepalive_timeout(self, client_id: str) -> None:
        self.counters.keepalive_timeouts += 1
        if self.log is not None:
            self.log.emit(KEEPALIVE_TIMEOUT, self.zone, client_id)

    def session(self, event: str, client_id: str) -> None:
        """created / resumed / discarded / expired (metrics.SESSION_EVENTS)."""
        self.counters.session_events[event] += 1

    def taken_over(self, client_id: str, how: str, counted: bool = True) -> None:
        """A session moved to another connection: local (on this node), remote (this node took it from
        another) or handover (this node gave it away). Logged on both sides of a handover, counted once:
        by the node that handed it over (`counted` False on the other side)."""
        if counted:
            self.counters.session_events["takenover"] += 1
        if self.log is not None:
            self.log.emit(TAKEOVER, self.zone, client_id, reason=how)
