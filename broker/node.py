"""The broker node: the composition root, the one module that knows every part.

It builds the zones, the router and retained messages, the session store with its group committer, the
channel manager, the fleet (with a Redis store) and the event log, wires them together, starts and stops
them, applies a changed config, and reads the gauges at scrape time. It knows nothing of sockets
(server.py runs it on asyncio listeners and asks it for a channel per connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from . import __version__
from .banned import Ban, Flapping
from .bridge.runtime import Bridge, Lease, summary
from .bridges import BridgeConfig
from .channel import Channel, ChannelIO
from .clock import Clock, LoopClock
from .cluster import Cluster
from .cm import ChannelManager
from .config import BrokerConfig, RedisStoreConfig
from .events import EventLog
from .eventschema import BridgeDropReason, DropReason
from .metrics import Metrics
from .rebalance import Order, Progress
from .retained import Retained
from .router import Router
from .store.base import SessionStore
from .store.committer import GroupCommitter
from .store.connections import StoreConnections
from .store.memory import MemoryStore
from .store.redis_store import RedisStore
from .telemetry import Telemetry
from .trace import STREAM_MAX, Tracer, TraceSpec
from .zone import Zone

log = logging.getLogger("fleetmq.node")

#: how a rebalance order is carried out: tell that many connected clients to use another server
Evict = Callable[[Order, Progress], Awaitable[None]]

STORE_RETRY_MIN, STORE_RETRY_MAX = 0.5, 5.0  # seconds between attempts to reach the store at start
#: at a graceful stop, how long a bridge led here may wait for the remote's acks before it hands over
BRIDGE_DRAIN = 2.0


TRACE_FLUSH = 0.5  # seconds between two writes of a running trace's records


class Node:
    def __init__(
        self,
        config: BrokerConfig,
        store: SessionStore | None = None,
        metrics: Metrics | None = None,
        evict: Evict | None = None,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.metrics = metrics or Metrics()
        self.store = store or MemoryStore()
        self.router = Router()
        self.retained = Retained()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._clock: LoopClock | None = None  # (its loop is the one the first connection comes on)
        self.bridges: list[Bridge] = []
        self._started = False  # (bridges start once the node has joined the fleet)
        self._bridges_changing = asyncio.Lock()  # (one config's bridges applied after the other)
        self._bridges_applied: asyncio.Task[None] | None = None
        self.events: EventLog | None = None
        if config.event_log.enabled:
            log_cfg = config.event_log
            where: str | StoreConnections | None = config.event_log_url()
            if where is None:  # the session store's Redis (config validation saw to it that there is one)
                assert isinstance(self.store, RedisStore)
                where = self.store.conns
            self.events = EventLog.from_config(
                log_cfg, redis=where, fleet=log_cfg.fleet, node=self.node_id, offered=self._message_events
            )
        self.zones: dict[str, Zone] = {
            name: Zone(name, settings, self._telemetry(name)) for name, settings in config.zones.items()
        }
        for bridge in config.bridges:  # each bridge's session has a zone of its own (BridgeConfig.zone)
            self.zones[bridge.session_id] = Zone(
                bridge.session_id, bridge.zone(), self._telemetry(bridge.session_id)
            )
        self.committer = GroupCommitter(self.store, self.metrics)
        self.cm = ChannelManager(
            self.node_id,
            self.zones,
            self.router,
            self.retained,
            self.store,
            self.committer,
            self.metrics,
            self.spawn,
        )
        if isinstance(config.store, RedisStoreConfig):
            self.cm.claim_wait = config.store.connect_wait_ms / 1000
        self.cluster: Cluster | None = None
        if isinstance(self.store, RedisStore):
            self.cluster = self.cm.fleet = Cluster(
                self.node_id,
                self.store,
                self.cm,
                self.router,
                self.retained,
                self.metrics,
                self.spawn,
                self._report,
                self._ordered,
                self.apply_bans,
                self.apply_traces,
            )
        self._evict = evict  # (the server's: it has the connections)
        self.rebalance: Progress | None = None  # the last rebalance order taken on
        self._rebalancing: asyncio.Task[None] | None = None
        self._bad_order: bytes | None = None
        self.config_hash = config.config_hash()
        self.started_ms = int(time.time() * 1000)
        flapping = config.flapping
        if flapping.enabled:
            self.cm.flapping = Flapping(flapping.max_count, flapping.window)
        self.cm.on_flapping = self._flapping
        self.tracers: dict[str, Tracer] = {}  # the traces running on this node, by name
        self._trace_specs: dict[str, TraceSpec] = {}  # a node alone (memory store): its traces ...
        self._trace_log: dict[str, deque[str]] = {}  # ... and what they recorded
        self._trace_flusher: asyncio.Task[None] | None = None
        self.metrics.gauges = self.gauges
        self.metrics.store_round_trips = lambda: getattr(self.store, "round_trips", {})
        if isinstance(self.store, RedisStore):
            store = self.store
            cluster = self.cluster
            self.metrics.store_replicas_in_sync = lambda: cluster.replicas_in_sync if cluster else -1
            self.metrics.store_topology = lambda: (
                store.conns.topology,
                store.conns.primaries(),
                store.conns.failovers,
                store.retries,
            )
        self.metrics.config_info = {name: self.config_hash for name in self.zones}
        if self.events is not None:
            self.events.set_zones(config.zones)
            events = self.events
            self.metrics.event_log = lambda: (events.written, events.dropped, events.errors)

    def _telemetry(self, zone: str) -> Telemetry:
        return Telemetry(zone, self.metrics.zone(zone), self.events)

    def _message_events(self) -> int:
        """Per-message events so far (publishes in, deliveries, acks, resends): the event log's offered load."""
        return sum(
            sum(z.received) + sum(z.delivered) + sum(z.acked) + z.retransmitted
            for z in self.metrics.zones.values()
        )

    def report(self) -> dict[FieldT, EncodableT]:
        return self._report()

    def bridge_summaries(self) -> dict[str, dict[str, Any]]:
        return {n: summary(r) for n, r in self._bridge_reports().items()}

    def _report(self) -> dict[FieldT, EncodableT]:
        connections, sessions = self.cm.counts()
        out: dict[FieldT, EncodableT] = {
            "config_hash": self.config_hash,
            "connections": connections,
            "sessions": sessions,
            # (totals: the operator's autoscaler takes their rates between two reports)
            "delivered": sum(sum(z.delivered) for z in self.metrics.zones.values()),
            "cpu_seconds": f"{time.process_time():.3f}",
            "version": __version__,
            "started_ms": self.started_ms,
        }
        if self.rebalance is not None:
            out["rebalance"] = self.rebalance.encode()
        if self.bridges:  # (the operator's MqttBridge status: which pod leads, connected, queue, drops)
            reports = self._bridge_reports()
            out["bridges"] = json.dumps({n: summary(r) for n, r in reports.items()}, sort_keys=True)
        return out

    # -- bans (banned.py) -------------------------------------------------------------------------
    def apply_bans(self, bans: list[Ban]) -> int:
        """The fleet's bans as read from the store: connected clients a new one matches are let go."""
        if self.cm.banned.replace(bans):
            return self.cm.kick_banned()
        return 0

    async def refresh_bans(self) -> int:
        if self.cluster is None:
            return self.cm.kick_banned()
        return self.apply_bans(await self.cluster.read_bans())

    async def ban(self, ban: Ban) -> int:
        """Ban fleet-wide (in the store, then here); returns the clients disconnected here."""
        if self.cluster is not None:
            await self.cluster.put_ban(ban)
        self.cm.banned.put(ban)
        return self.cm.kick_banned()

    async def unban(self, key: str) -> bool:
        removed = self.cm.banned.remove(key)
        if self.cluster is not None:
            removed = await self.cluster.delete_ban(key) or removed
        return removed

    # -- packet traces (trace.py) -------------------------------------------------------------
    def apply_traces(self, specs: list[TraceSpec]) -> None:
        """The fleet's traces as read from the store: those now on start here, the others stop."""
        now = time.time()
        wanted = {s.name: s for s in specs if s.active(now)}
        for name, tracer in list(self.tracers.items()):
            if wanted.get(name) != tracer.spec:
                self._stop_trace(name)
        for name, spec in wanted.items():
            if name not in self.tracers:
                self._start_trace(spec)

    def _start_trace(self, spec: TraceSpec) -> None:
        tracer = self.tracers[spec.name] = Tracer(spec, self.node_id)
        if spec.kind == "clientid":
            self.cm.client_tracers.setdefault(spec.filter, []).append(tracer)
            ch = self.cm.channels.get(spec.filter)
            if ch is not None:
                ch.start_trace(tracer)
        else:
            self.cm.topic_tracers.append(tracer)
        if self._trace_flusher is None:
            self._trace_flusher = self.spawn(self._flush_traces())
        log.info("trace %s started: %s %r until %s", spec.name, spec.kind, spec.filter,
                 time.strftime("%H:%M:%S", time.gmtime(spec.end)))  # fmt: skip

    def _stop_trace(self, name: str) -> None:
        tracer = self.tracers.pop(name)
        spec = tracer.spec
        if spec.kind == "clientid":
            tracers = self.cm.client_tracers.get(spec.filter, [])
            if tracer in tracers:
                tracers.remove(tracer)
            if not tracers:
                self.cm.client_tracers.pop(spec.filter, None)
            ch = self.cm.channels.get(spec.filter)
            if ch is not None:
                ch.stop_trace(tracer)
        elif tracer in self.cm.topic_tracers:
            self.cm.topic_tracers.remove(tracer)
        self.spawn(self._write_trace(tracer))

    async def _write_trace(self, tracer: Tracer) -> None:
        lines = tracer.take()
        if not lines:
            return
        if self.cluster is None:
            self._trace_log.setdefault(tracer.spec.name, deque(maxlen=STREAM_MAX)).extend(lines)
            return
        try:
            await self.cluster.append_trace(tracer.spec.name, lines)
        except Exception as e:  # (lost for the trace only: said, and counted in the trace itself next time)
            tracer.dropped += len(lines)
            log.warning("could not store %d records of trace %s: %s", len(lines), tracer.spec.name, e)

    async def _flush_traces(self) -> None:
        try:
            while self.tracers:
                await asyncio.sleep(TRACE_FLUSH)
                now = time.time()
                for name, tracer in list(self.tracers.items()):
                    if not tracer.spec.active(now):
                        self._stop_trace(name)
                    else:
                        await self._write_trace(tracer)
        finally:
            self._trace_flusher = None

    async def refresh_traces(self) -> None:
        if self.cluster is not None:
            self.apply_traces(await self.cluster.read_traces())
        else:
            self.apply_traces(list(self._trace_specs.values()))

    async def flush_traces(self) -> None:
        for tracer in list(self.tracers.values()):
            await self._write_trace(tracer)

    async def put_trace(self, spec: TraceSpec) -> None:
        if self.cluster is not None:
            await self.cluster.put_trace(spec)
        else:
            self._trace_specs[spec.name] = spec
        await self.refresh_traces()

    async def delete_trace(self, name: str) -> bool:
        if name in self.tracers:
            self._stop_trace(name)
        if self.cluster is not None:
            return await self.cluster.delete_trace(name)
        self._trace_log.pop(name, None)
        return self._trace_specs.pop(name, None) is not None

    async def trace_specs(self) -> list[tuple[TraceSpec, int]]:
        """Every trace, with how many records it holds."""
        if self.cluster is None:
            specs = sorted(self._trace_specs.values(), key=lambda s: s.name)
            return [(s, len(self._trace_log.get(s.name, ()))) for s in specs]
        specs = sorted(await self.cluster.read_traces(), key=lambda s: s.name)
        return list(zip(specs, await self.cluster.trace_sizes([s.name for s in specs]), strict=True))

    async def trace_lines(self, name: str) -> list[str]:
        if self.cluster is None:
            return list(self._trace_log.get(name, ()))
        return await self.cluster.trace_lines(name)

    def _flapping(self, client_id: str) -> None:
        now = time.time()
        ban = Ban(kind="clientid", who=client_id, reason="flapping", by="flapping", at=now,
                  until=now + self.config.flapping.ban_time)  # fmt: skip

        async def write() -> None:
            try:
                await self.ban(ban)
            except Exception as e:  # (banned here all the same; the other nodes learn of it if Redis returns)
                self.cm.banned.put(ban)
                log.warning("could not store the flapping ban of %r: %s", client_id, e)

        self.spawn(write())

    def _ordered(self, raw: bytes | None) -> None:
        """The operator's rebalance order (rebalance.py), as read with the heartbeat: taken on once."""
        if self._evict is None:
            return
        if raw is None:  # withdrawn (the fleet stopped being steady) or run out: stop moving clients
            if self._rebalancing is not None and not self._rebalancing.done():
                self._rebalancing.cancel()
            return
        try:
            order = Order.parse(raw)
        except ValueError as e:
            if raw != self._bad_order:  # (once, not with every heartbeat)
                self._bad_order = raw
                log.error("%s", e)
            return
        if (self.rebalance is not None and self.rebalance.id == order.id) or order.expired():
            return
        self.rebalance = progress = Progress(order.id, order.count)
        log.info(
            "rebalance %s: moving %d connections to other nodes, %g a second",
            order.id,
            order.count,
            order.rate,
        )
        if self._rebalancing is not None:
            self._rebalancing.cancel()
        self._rebalancing = self.spawn(self._carry_out(self._evict, order, progress))

    @staticmethod
    async def _carry_out(evict: Evict, order: Order, progress: Progress) -> None:
        try:
            await evict(order, progress)
        finally:
            progress.done = True
            log.info("rebalance %s: %d connections told to use another server", order.id, progress.evicted)

    def channel(
        self, zone: str, io: ChannelIO, peer: str = "", listener: str = "", clock: Clock | None = None
    ) -> Channel:
        """A channel for a new connection on a listener of `zone`, on the node's loop clock unless given
        one (a test's)."""
        if clock is None:
            clock = self._clock
            if clock is None:
                clock = self._clock = LoopClock(asyncio.get_running_loop())
        return Channel(self.cm, self.zones[zone], io, clock, peer, listener)

    def apply_config(self, config: BrokerConfig) -> None:
        """Adopt a changed config's zones: new sessions get them at once, live ones at their next
        delivery (Channel.apply_zone). Raises (changing nothing) if a users file cannot be read."""
        for name, settings in config.zones.items():
            Zone.access(settings)  # every users file readable, every key, or nothing changes
            zone = self.zones.get(name)
            if zone is None or zone.settings.authentication != settings.authentication:
                Zone.chain(name, settings)
        for name, settings in config.zones.items():
            zone = self.zones.get(name)
            if zone is None:
                self.zones[name] = Zone(name, settings, self._telemetry(name))
            else:
                zone.update(settings)
        self.cm.revoke_certificates()
        self.config = config
        self.config_hash = config.config_hash()
        self.metrics.config_info = {name: self.config_hash for name in config.zones}
        if self.events is not None:
            self.events.set_zones(config.zones)
        if self._started:
            self._bridges_applied = self.spawn(self._apply_bridges(config.bridges))

    async def bridges_applied(self) -> None:
        """Wait until the bridges of the config applied last run, their forwards routed here: only then
        is the config applied (a publish acknowledged from then on reaches a bridge added or changed)."""
        if self._bridges_applied is not None:
            await asyncio.wait([self._bridges_applied])  # (its failure is the task's to report)

    async def _apply_bridges(self, bridges: list[BridgeConfig]) -> None:
        """Bridges added, removed or changed in a new config: a changed one stops (parking its session,
        which keeps what is queued and its routes) and starts again with its new settings."""
        async with self._bridges_changing:
            wanted = {b.name: b for b in bridges}
            for bridge in list(self.bridges):
                cfg = wanted.get(bridge.cfg.name)
                if cfg is None or cfg != bridge.cfg:
                    self.bridges.remove(bridge)
                    leading = bridge.leader
                    await bridge.stop()
                    if cfg is None and leading:
                        try:
                            await bridge.discard()
                        except TimeoutError:  # (its routes stay too: what they match queues, bounded)
                            log.warning(
                                "bridge %s: removed, but the fleet did not end its session in time",
                                bridge.cfg.name,
                            )
                    log.info(
                        "bridge %s: %s",
                        bridge.cfg.name,
                        "removed" if cfg is None else "changed: restarting it",
                    )
            running = {b.cfg.name for b in self.bridges}
            for cfg in bridges:
                if cfg.name not in running:
                    self.zones[cfg.session_id] = Zone(
                        cfg.session_id, cfg.zone(), self._telemetry(cfg.session_id)
                    )
                    await self._start_bridge(cfg)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task, keeping a reference so it is not garbage collected mid-flight."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the store and load the fleet's routes and retained messages from it. Each step waits for
        the store rather than exit: a broker pod that starts before its Redis (a new fleet, a Redis
        restarting, a failover under way) stays alive and unready instead of crash-looping, and serves
        once it answers."""
        await self._until_the_store_answers("opening the session store", self.store.open)
        if self.cluster is not None:  # events first, so no route change falls between load and listen
            await self._until_the_store_answers("joining the fleet", self.cluster.start)
        await self._until_the_store_answers("loading routes and retained messages", self._load)
        if self.events is not None:
            await self.events.start()
        await self._start_bridges()

    async def _load(self) -> None:
        routes = await self.store.load_routes()
        retained = await self.store.load_retained()
        for cid, topic_filter, sub in routes:
            self.router.add(cid, topic_filter, sub)
        for msg in retained:
            self.retained.put(msg)

    async def _until_the_store_answers(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        delay = STORE_RETRY_MIN
        while True:
            try:
                await step()
                return
            except (OSError, RedisError) as e:
                self.metrics.store_errors += 1
                log.warning("%s failed (%s); retrying in %.1fs", what, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_MAX)
                if isinstance(self.store, RedisStore):
                    # (pooled connections may still point at a primary that is a replica now: Sentinel
                    # and the cluster's map are asked again by fresh ones)
                    with contextlib.suppress(Exception):
                        await self.store.drop_idle_connections()

    async def _start_bridges(self) -> None:
        """Before the listeners open: each bridge's forwards are routed by then (Bridge.route)."""
        self._started = True
        self.metrics.bridges = self._bridge_reports
        for cfg in self.config.bridges:
            await self._start_bridge(cfg)

    def _bridge_reports(self) -> dict[str, dict[str, Any]]:
        """Each bridge's report, with what its session's queue dropped here (a full queue in this node's
        copy, or in the store when this node routed to it: each node counts its own, Prometheus sums) and
        its session's delivery latency, which is the forward latency: publish to the remote's ack."""
        out = {}
        for b in self.bridges:
            r = out[b.cfg.name] = b.report()
            zone = self.zones.get(b.cfg.session_id)
            if zone is None:
                continue
            counters = zone.telemetry.counters
            for reason, n in counters.dropped.items():
                if n:  # (persist off: every message is QoS 0 to the session, so qos0_offline means it
                    # came while the remote was away: the bridge's not_persisted)
                    off = reason == DropReason.QOS0_OFFLINE and not b.cfg.persist
                    r["dropped"][BridgeDropReason.NOT_PERSISTED if off else str(reason)] += n
            r["latency"] = counters.latency
        return out

    async def _start_bridge(self, cfg: BridgeConfig) -> None:
        """Route the bridge's forwards here, then run it (it leads when the lease says so)."""
        redis = None
        if isinstance(self.store, RedisStore):
            conns = self.store.conns
            redis = lambda key: conns.shard_for(key).redis  # noqa: E731
        alive = self.cluster.listening if self.cluster is not None else None
        lease = Lease(cfg, self.node_id, redis, alive)
        zone = self.zones.get(cfg.session_id)
        telemetry = zone.telemetry if zone is not None else None
        bridge = Bridge(
            cfg, self.config.fleet, partial(self.channel, cfg.session_id), lease, telemetry=telemetry
        )
        await bridge.route(partial(self.router.subscriptions, cfg.session_id))
        self.bridges.append(bridge)
        bridge.start()

    async def hand_over_bridges(self, timeout: float = BRIDGE_DRAIN) -> None:
        """A graceful stop's first step: the bridges led here wait for the remote's acks (so the next
        leader sends nothing twice), park their sessions, and give up their leases once those writes are
        committed, so another node takes over at once."""
        await asyncio.gather(*(b.drain(timeout) for b in self.bridges))
        for bridge in self.bridges:
            await bridge.stop(release=False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.committer.drain(), timeout)
        for bridge in self.bridges:
            await bridge.lease.release()

    async def stop(self) -> None:
        for bridge in self.bridges:
            await bridge.stop()
        for zone in self.zones.values():
            await zone.authn.close()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.events is not None:
            await self.events.stop()
        await self.store.close()

    # ---------------------------------------------------------------------------------------------
    def gauges(self) -> dict[str, dict[Any, float]]:
        """Connection, session and queue gauges and the zone limits by zone, computed at scrape time."""
        names = list(self.config.zones)
        connections: dict[Any, float] = dict.fromkeys(names, 0)
        sessions: dict[Any, float] = {(z, s): 0 for z in names for s in ("online", "offline")}
        inflight: dict[Any, float] = dict.fromkeys(names, 0)
        mqueue: dict[Any, float] = dict.fromkeys(names, 0)
        awaiting: dict[Any, float] = dict.fromkeys(names, 0)
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
        zones = self.config.zones
        return {
            "connections": connections,
            "sessions": sessions,
            "inflight": inflight,
            "mqueue": mqueue,
            "awaiting_rel": awaiting,
            # the zones' current limits (0 = no limit), so dashboards can show utilisation
            "max_inflight": {z: zs.max_inflight for z, zs in zones.items()},
            "max_mqueue_len": {z: zs.max_mqueue_len for z, zs in zones.items()},
        }
