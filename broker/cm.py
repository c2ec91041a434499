"""The channel manager (EMQX's emqx_cm): which client is connected where, and what happens to sessions.

It opens sessions (new, resumed, taken over from another connection), parks them in the store when their
client leaves, expires them, and publishes wills after their delay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .codec import RC
from .eventschema import TAKEOVER
from .message import Will
from .session import Session
from .store import Discard, Save

if TYPE_CHECKING:
    from .channel import Channel
    from .node import Node

log = logging.getLogger("fleetmq.cm")

NEVER_EXPIRE = 0xFFFFFFFF


@dataclass(slots=True)
class Offline:
    """What the node keeps about a session parked in the store (routing needs its zone and filters)."""

    zone: str
    filters: list[str]
    expiry: asyncio.TimerHandle | None = None
    will: Will | None = None
    will_timer: asyncio.TimerHandle | None = field(default=None)
    will_at: float = 0.0  # wall-clock time the will is due


class _ClientLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class ChannelManager:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.channels: dict[str, Channel] = {}  # online, CONNACK sent or about to be
        self.offline: dict[str, Offline] = {}
        self._locks: dict[str, _ClientLock] = {}

    async def open_session(self, ch: Channel, expiry: float, receive_max: int) -> tuple[Session, bool]:
        """Find or create the session of a connecting client; returns (session, session present)."""
        cid = ch.client_id
        entry = self._locks.get(cid)
        if entry is None:
            entry = self._locks[cid] = _ClientLock()
        entry.users += 1
        try:
            async with entry.lock:  # two CONNECTs with one client id are handled one after the other
                return await self._open(ch, expiry, receive_max)
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[cid]

    async def _open(self, ch: Channel, expiry: float, receive_max: int) -> tuple[Session, bool]:
        node = self.node
        cid = ch.client_id
        zm = node.metrics.zone(ch.zone_name)
        session: Session | None = None
        old = self.channels.pop(cid, None)
        if old is not None:
            # Takeover: the old connection is closed (v5: 0x8E) and its session continues here.
            session = old.session
            old.session = None
            old.kick(RC.SESSION_TAKEN_OVER, "takenover")
            zm.session_events["takenover"] += 1
            if node.events is not None:
                node.events.emit(TAKEOVER, ch.zone_name, cid, reason="local")
            # The old connection ended without DISCONNECT, so its will applies; a delayed will is
            # cancelled by this very reconnect unless Clean Start ends the session [MQTT-3.1.3-9].
            if old.will is not None and (ch.clean_start or old.will_delay <= 0):
                node.publish_will(Will(old.will, old.zone_name, old.username))
            if session is not None and ch.clean_start:
                self._discard(session)
                zm.session_events["discarded"] += 1
                session = None
            elif session is not None:
                session.expiry_interval = expiry
                await node.store.set_will(session, ch.will, ch.will_delay)  # the new connection's
        epoch = session.epoch if session is not None else 0
        if session is None:
            if node.cluster is not None:  # connected on another node? it hands the session over first
                handed_over = await node.cluster.take_over(cid, ch.clean_start)
                if handed_over is not None and node.events is not None:  # counted here, not at the old node
                    node.events.emit(TAKEOVER, ch.zone_name, cid, reason="remote")
            if node.committer.pending:
                # A Save of this session (and messages queued for it) may still be on the way to the
                # store; it stays parked meanwhile, so messages published now are queued, not lost.
                await node.committer.barrier()
            claimed = await node.store.claim(
                cid, ch.zone, ch.zone_name, ch.clean_start, ch.will, ch.will_delay, expiry, ch.username
            )
            epoch, session = claimed.epoch, claimed.session
            if claimed.previous and claimed.previous != node.node_id and node.cluster is not None:
                zm.session_events["takenover"] += 1
                if node.events is not None:
                    node.events.emit(TAKEOVER, ch.zone_name, cid, reason="remote")
                node.spawn(node.cluster.kick_stale(cid, claimed.previous, epoch))
            parked = self.offline.pop(cid, None)
            if parked is not None:
                if parked.expiry is not None:
                    parked.expiry.cancel()
                if parked.will_timer is not None:
                    parked.will_timer.cancel()
                    if ch.clean_start and parked.will is not None:
                        node.publish_will(parked.will)  # the old session ends: its will goes now
            if claimed.ended_will is not None:
                node.publish_will(claimed.ended_will)
            if claimed.discarded is not None:
                for topic_filter in claimed.discarded:
                    node.router.remove(cid, topic_filter)
                zm.session_events["discarded"] += 1
        present = session is not None
        if session is None:
            session = Session(cid, ch.zone, ch.zone_name, expiry_interval=expiry, receive_maximum=receive_max)
            session.epoch = epoch
            zm.session_events["created"] += 1
        else:
            session.expiry_interval = expiry
            session.zone_name = ch.zone_name
            session.apply_zone(ch.zone)
            session.set_receive_maximum(receive_max)
            zm.session_events["resumed"] += 1
        if node.store.durable and session.expiry_interval > 0:
            session.enable_journal()  # every change reaches the store before what depends on it is acked
            session.on_dirty = node.journal_dirty
        self.channels[cid] = ch
        if node.cluster is not None:
            node.cluster.wake(cid)  # deliveries queued in Redis while we claimed (their wake found no one)
        return session, present

    def channel_closed(self, ch: Channel) -> None:
        """A connection ended: publish its will (maybe later), park or discard its session."""
        cid = ch.client_id
        session = ch.session
        if self.channels.get(cid) is not ch or session is None:
            return  # taken over: the new connection owns the session now
        del self.channels[cid]
        ch.session = None
        expiry = session.expiry_interval
        if ch.will is not None:
            self._will(cid, Will(ch.will, ch.zone_name, ch.username), ch.will_delay, expiry)
        if expiry <= 0:
            self._discard(session)
            self.node.committer.add(Discard(cid, session.epoch))
            return
        parked = self.offline.get(cid) or Offline(ch.zone_name, list(session.subscriptions))
        parked.zone = ch.zone_name
        parked.filters = list(session.subscriptions)
        self.offline[cid] = parked
        pending_will = parked.will.msg if parked.will is not None and parked.will_timer is not None else None
        self.node.committer.add(Save(session, expiry, pending_will, parked.will_at))
        if expiry < NEVER_EXPIRE:
            parked.expiry = asyncio.get_running_loop().call_later(expiry, self._expire, cid)

    async def hand_over(self, cid: str, clean_start: bool) -> None:
        """Another node got a CONNECT for a client connected here: close ours (0x8E), store the session."""
        ch = self.channels.get(cid)
        if ch is None or ch.session is None:
            return
        session = ch.session
        del self.channels[cid]
        ch.session = None
        ch.kick(RC.SESSION_TAKEN_OVER, "takenover")
        self.node.metrics.zone(ch.zone_name).session_events["takenover"] += 1
        if self.node.events is not None:
            self.node.events.emit(TAKEOVER, ch.zone_name, cid, reason="handover")
        # A will without delay goes now; a delayed one is cancelled by the reconnect unless the new
        # connection's Clean Start ends the session [MQTT-3.1.3-9].
        if ch.will is not None and (clean_start or ch.will_delay <= 0):
            self.node.publish_will(Will(ch.will, ch.zone_name, ch.username))
        # Its routes stay: the session lives on (on the new node), and what is published here for it
        # is queued in Redis for it from now on.
        if session.expiry_interval > 0:
            self.node.committer.add(Save(session, session.expiry_interval))
        else:
            self._discard(session)
            self.node.committer.add(Discard(cid, session.epoch))
        await self.node.committer.barrier()

    def resync(self, ch: Channel) -> None:
        """This node's copy of a session may differ from the store's (a write's outcome is unknown): close
        the connection (v5: 0x88); the reconnect resumes from the store."""
        self._let_go(ch, RC.SERVER_UNAVAILABLE, "store_error")
        log.warning("session %r is resynchronising from the store; closed its connection", ch.client_id)

    def fenced(self, ch: Channel) -> None:
        """This node's copy of a session is stale (another node owns it): close the connection (0x8E)."""
        self._let_go(ch, RC.SESSION_TAKEN_OVER, "takenover")
        log.info("session %r is owned by another node now; closed the connection here", ch.client_id)

    def _let_go(self, ch: Channel, reason: int, why: str) -> None:
        """Drop this node's copy of a session without storing anything, and close its connection."""
        if self.channels.get(ch.client_id) is ch:
            del self.channels[ch.client_id]
        ch.session = None
        ch.kick(reason, why)

    def _will(self, cid: str, will: Will, delay: float, expiry: float) -> None:
        """Publish a will now, or after its delay unless the session ends first (then at its end)."""
        delay = min(delay, expiry)
        if delay <= 0:
            self.node.publish_will(will)
            return
        parked = self.offline.get(cid)
        if parked is None:
            parked = self.offline[cid] = Offline(will.zone, [])
        parked.will = will
        parked.will_at = time.time() + delay
        parked.will_timer = asyncio.get_running_loop().call_later(delay, self._delayed_will, cid)

    def _delayed_will(self, cid: str) -> None:
        parked = self.offline.get(cid)
        if parked is None or parked.will is None:
            return
        will, parked.will, parked.will_timer = parked.will, None, None
        if not self.node.store.durable:
            self.node.publish_will(will)
            return

        async def take_and_publish(will_at: float) -> None:
            # the will is also in Redis (so it survives this node): exactly one node publishes it
            if await self.node.store.take_will(cid, will_at) is not None:
                self.node.publish_will(will)

        self.node.spawn(take_and_publish(parked.will_at))

    def _expire(self, cid: str) -> None:
        parked = self.offline.pop(cid, None)
        if parked is None:
            return
        if parked.will_timer is not None:
            parked.will_timer.cancel()
            if parked.will is not None:
                self.node.publish_will(parked.will)  # session end: the will goes now [MQTT-3.1.3-9]
        for topic_filter in parked.filters:
            self.node.router.remove(cid, topic_filter)
        if not self.node.store.durable:  # a durable store expires sessions itself (fleet-wide TTL)
            self.node.committer.add(Discard(cid))
        self.node.metrics.zone(parked.zone).session_events["expired"] += 1
        log.debug("session %r expired", cid)

    def _discard(self, session: Session) -> None:
        for topic_filter in session.subscriptions:
            self.node.router.remove(session.client_id, topic_filter)
        session.subscriptions.clear()

    def shutdown(self) -> None:
        for parked in self.offline.values():
            for t in (parked.expiry, parked.will_timer):
                if t is not None:
                    t.cancel()
