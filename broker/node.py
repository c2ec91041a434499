"""The broker node's core (EMQX's emqx_broker): routes each published message to its subscribers.

Owns the router, retained messages, channel manager, session store and group committer; knows nothing of
sockets (server.py runs it on asyncio listeners).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Coroutine
from typing import Any

from .auth import Acl, Authenticator, read_users
from .cluster import Cluster
from .cm import ChannelManager
from .config import BrokerConfig
from .events import EventLog
from .eventschema import DROP
from .limiter import TokenBucket
from .message import Delivery, Message, Will
from .metrics import Metrics
from .redisstore import RedisStore
from .retained import Retained
from .router import Router, Subscription
from .session import Session
from .store import CommitResult, Enqueue, GroupCommitter, Journal, MemoryStore, Op, Retain, SessionStore
from .zones import ZoneSettings

log = logging.getLogger("fleetmq.node")


class ZoneLimits:
    """One zone's connections on this node and its connect-rate bucket."""

    __slots__ = ("_bucket", "connections", "rate")

    def __init__(self, rate: float) -> None:
        self.connections = 0
        self.rate = rate
        self._bucket: TokenBucket | None = None

    def connect_allowed(self, now: float) -> bool:
        if not self.rate:
            return True
        if self._bucket is None:
            self._bucket = TokenBucket(self.rate, now)  # on the channels' clock
        return not self._bucket.take(now)


class Node:
    def __init__(
        self, config: BrokerConfig, store: SessionStore | None = None, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.zones: dict[str, ZoneSettings] = dict(config.zones)
        self.metrics = metrics or Metrics()
        self.store = store or MemoryStore()
        self.router = Router()
        self.retained = Retained()
        self.cm = ChannelManager(self)
        self.committer = GroupCommitter(
            self.store, self.metrics, self._on_commit, self._collect_journals, self._on_commit_failure
        )
        self._journals: list[Session] = []  # sessions with changes to journal in the next batch
        self.cluster: Cluster | None = None
        if isinstance(self.store, RedisStore):
            self.cluster = Cluster(self, self.store)
        self._client_ids = itertools.count(1)
        self._id_prefix = f"fleetmq-{self.node_id}-{os.getpid():x}-"
        self._tasks: set[asyncio.Task[Any]] = set()
        self._limits: dict[str, ZoneLimits] = {}
        self.auth, self.acl = self._access(self.zones)
        self.metrics.gauges = self.gauges
        self.metrics.store_round_trips = lambda: getattr(self.store, "round_trips", 0)
        self.config_hash = config.config_hash()
        self.metrics.config_info = {name: self.config_hash for name in self.zones}
        self.events: EventLog | None = None
        if (url := config.event_log_url()) is not None:
            log_cfg = config.event_log
            self.events = EventLog.from_config(
                log_cfg, redis_url=url, fleet=log_cfg.fleet, node=self.node_id, offered=self._message_events
            )
            assert self.events is not None
            self.events.set_zones(self.zones)
            events = self.events
            self.metrics.event_log = lambda: (events.written, events.dropped, events.errors)

    def _message_events(self) -> int:
        """Per-message events so far (publishes in, deliveries, acks, resends): the event log's offered load."""
        return sum(
            sum(z.received) + sum(z.delivered) + sum(z.acked) + z.retransmitted
            for z in self.metrics.zones.values()
        )

    @staticmethod
    def _access(
        zones: dict[str, ZoneSettings],
    ) -> tuple[dict[str, Authenticator | None], dict[str, Acl | None]]:
        """Per zone: who may connect and what they may do (None = no checks configured)."""
        auth = {
            name: Authenticator(read_users(z.users_file)) if z.users_file else None
            for name, z in zones.items()
        }
        acl = {
            name: Acl(z.acl, z.acl_default) if z.acl or z.acl_default == "deny" else None
            for name, z in zones.items()
        }
        return auth, acl

    def apply_config(self, config: BrokerConfig) -> None:
        """Adopt a changed config's zones: new sessions get them at once, live ones at their next
        delivery (Channel.apply_zone). Raises (changing nothing) if a users file cannot be read."""
        zones = dict(config.zones)
        auth, acl = self._access(zones)
        self.config = config
        self.zones, self.auth, self.acl = zones, auth, acl
        for name, lim in self._limits.items():
            z = zones.get(name)
            lim.rate = z.max_conn_rate if z is not None else 0.0
            lim._bucket = None
        self.config_hash = config.config_hash()
        self.metrics.config_info = {name: self.config_hash for name in zones}
        if self.events is not None:
            self.events.set_zones(zones)

    def limits(self, zone: str) -> ZoneLimits:
        """This node's connection count and connect-rate bucket of a zone."""
        lim = self._limits.get(zone)
        if lim is None:
            lim = self._limits[zone] = ZoneLimits(self.zones[zone].max_conn_rate)
        return lim

    def assign_client_id(self) -> str:
        return f"{self._id_prefix}{next(self._client_ids)}"

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task, keeping a reference so it is not garbage collected mid-flight."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the store and load the fleet's routes and retained messages from it."""
        await self.store.open()
        if self.cluster is not None:
            await self.cluster.start()  # events first, so no route change falls between load and listen
        for cid, topic_filter, sub in await self.store.load_routes():
            self.router.add(cid, topic_filter, sub)
        for msg in await self.store.load_retained():
            self.retained.put(msg)
        if self.events is not None:
            await self.events.start()

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.stop()
        if self.events is not None:
            await self.events.stop()
        await self.store.close()

    def publish(self, msg: Message, zone: str = "default") -> tuple[int, bool]:
        """Route a message; returns (sessions matched, whether the publisher's ack must await a commit).

        `zone` is the publisher's, for the no-subscribers drop counter.
        """
        durable = self.store.durable
        if msg.retain:
            self.retained.put(msg)
            if durable:
                self.committer.add(Retain(msg))
        channels = self.cm.channels
        matches = self.router.match(msg.topic, channels.__contains__)
        if not matches:
            self.metrics.drop(zone, "no_subscribers")
            if self.events is not None:
                self.events.emit(
                    DROP, zone, msg.sender, msg.msg_id, msg.topic, msg.qos, reason="no_subscribers"
                )
            return 0, durable and msg.retain
        sender = msg.sender
        if len(matches) > 1 and len({cid for cid, _ in matches}) != len(matches):
            targets = _merge_overlapping(matches, sender)
        else:
            targets = [
                (cid, sub.qos, sub.retain_as_published, _sub_ids(sub.sub_id))
                for cid, sub in matches
                if not (sub.no_local and cid == sender)
            ]
        needs_commit = durable and msg.retain
        mqos = msg.qos
        mretain = msg.retain
        for cid, sub_qos, rap, sub_ids in targets:
            qos = mqos if mqos < sub_qos else sub_qos
            retain = mretain and rap
            ch = channels.get(cid)
            if ch is not None and ch.session is not None:
                ch.deliver(msg, qos, retain, sub_ids)
                if qos and ch.session.dirty is not None:  # journaled: the publisher's ack awaits the commit
                    needs_commit = True
                continue
            if durable:  # the store knows whether the session exists and keeps QoS0 for it
                self.committer.add(Enqueue(cid, Delivery(msg, qos, retain, sub_ids)))
                needs_commit = True
                continue
            parked = self.cm.offline.get(cid)
            if parked is None:
                continue  # connecting right now: it resubscribes or resumes from the store
            if qos == 0 and not self.zones[parked.zone].mqueue_store_qos0:
                self.metrics.drop(parked.zone, "qos0_offline")
                if self.events is not None:
                    self.events.emit(DROP, parked.zone, cid, msg.msg_id, msg.topic, 0, reason="qos0_offline")
                continue
            self.committer.add(Enqueue(cid, Delivery(msg, qos, retain, sub_ids)))
            needs_commit = True
        return len(matches), needs_commit

    def publish_will(self, will: Will) -> None:
        """Publish a will that fell due, if its client may still publish on its topic: the rules may have
        changed since its CONNECT, and a v3 client was not told at CONNECT (Channel._open_session)."""
        acl = self.acl.get(will.zone)
        msg = will.msg
        if acl is not None and not acl.bind(will.username, msg.sender).can_publish(msg.topic):
            log.warning("dropped the will of %r: not authorized to publish on %r", msg.sender, msg.topic)
            self.metrics.drop(will.zone, "not_authorized")
            if self.events is not None:
                self.events.emit(
                    DROP, will.zone, msg.sender, msg.msg_id, msg.topic, msg.qos, reason="not_authorized"
                )
            return
        self.publish(msg, will.zone)

    def journal_dirty(self, session: Session) -> None:
        """A journaled session changed: its changes go into the next group commit."""
        self._journals.append(session)
        self.committer.touch()

    def _collect_journals(self, ops: list[Op]) -> None:
        sessions, self._journals = self._journals, []
        for s in sessions:
            changes = s.take_journal()
            if changes is not None:
                ops.append(Journal(s.client_id, s.epoch, s._next_pid, s.order, *changes))

    def _on_commit_failure(self, ops: list[Op]) -> None:
        """A journal write may be lost: those sessions resynchronise from the store (their clients
        reconnect and resume from what it holds, which never lost anything acknowledged)."""
        for op in ops:
            if isinstance(op, Journal):
                ch = self.cm.channels.get(op.client_id)
                if ch is not None and ch.session is not None and ch.session.epoch == op.epoch:
                    self.cm.resync(ch)

    def _on_commit(self, result: CommitResult) -> None:
        for zone, cid, n in result.dropped:
            self.metrics.drop(zone, "queue_full", n)
            if self.events is not None:  # the oldest messages of a full queue in the store (ids unknown)
                z = self.zones.get(zone)
                depth = z.max_mqueue_len if z is not None else -1  # the queue was trimmed back to its limit
                for _ in range(n):
                    self.events.emit(DROP, zone, cid, reason="queue_full", mqueue_len=depth)
        for zone, cid, n in result.skipped_qos0:
            self.metrics.drop(zone, "qos0_offline", n)
            if self.events is not None:
                for _ in range(n):
                    self.events.emit(DROP, zone, cid, reason="qos0_offline")
        for op in result.missing:  # the session ended (expired) somewhere: its routes go too
            if op.client_id not in self.cm.channels:
                self.router.remove_client(op.client_id)
        for cid in result.fenced:
            ch = self.cm.channels.get(cid)
            if ch is not None:
                self.cm.fenced(ch)

    # ---------------------------------------------------------------------------------------------
    def gauges(self) -> dict[str, dict[Any, float]]:
        """Connection, session and queue gauges and the zone limits by zone, computed at scrape time."""
        connections: dict[Any, float] = {z: 0 for z in self.zones}
        sessions: dict[Any, float] = {(z, s): 0 for z in self.zones for s in ("online", "offline")}
        inflight: dict[Any, float] = {z: 0 for z in self.zones}
        mqueue: dict[Any, float] = {z: 0 for z in self.zones}
        awaiting: dict[Any, float] = {z: 0 for z in self.zones}
        for ch in self.cm.channels.values():
            s = ch.session
            if s is None:
                continue
            z = ch.zone_name
            connections[z] = connections.get(z, 0) + 1
            sessions[(z, "online")] = sessions.get((z, "online"), 0) + 1
            inflight[z] = inflight.get(z, 0) + len(s.inflight)
            mqueue[z] = mqueue.get(z, 0) + len(s.mqueue)
            awaiting[z] = awaiting.get(z, 0) + len(s.awaiting_rel)
        for s in self.store.offline_sessions():
            z = s.zone_name
            sessions[(z, "offline")] = sessions.get((z, "offline"), 0) + 1
            mqueue[z] = mqueue.get(z, 0) + len(s.mqueue)
        return {
            "connections": connections,
            "sessions": sessions,
            "inflight": inflight,
            "mqueue": mqueue,
            "awaiting_rel": awaiting,
            # the zones' current limits (0 = no limit), so dashboards can show utilisation
            "max_inflight": {z: zs.max_inflight for z, zs in self.zones.items()},
            "max_mqueue_len": {z: zs.max_mqueue_len for z, zs in self.zones.items()},
        }


Target = tuple[str, int, bool, tuple[int, ...] | None]  # client id, subscription QoS, RAP, subscription ids
_SUB_IDS: dict[int, tuple[int, ...]] = {}


def _sub_ids(sid: int | None) -> tuple[int, ...] | None:
    if sid is None:
        return None
    t = _SUB_IDS.get(sid)
    if t is None:
        t = _SUB_IDS[sid] = (sid,)
    return t


def _merge_overlapping(matches: list[tuple[str, Subscription]], sender: str) -> list[Target]:
    """One delivery per client for overlapping subscriptions: the highest QoS and every subscription id
    [MQTT-3.3.4-2, -3]; a No Local subscription does not count for the publisher itself."""
    merged: dict[str, list[Any]] = {}
    for cid, sub in matches:
        if sub.no_local and cid == sender:
            continue
        m = merged.get(cid)
        if m is None:
            merged[cid] = [sub.qos, sub.retain_as_published, [sub.sub_id] if sub.sub_id else []]
            continue
        m[0] = max(m[0], sub.qos)
        m[1] = m[1] or sub.retain_as_published
        if sub.sub_id:
            m[2].append(sub.sub_id)
    return [(cid, q, rap, tuple(ids) or None) for cid, (q, rap, ids) in merged.items()]
