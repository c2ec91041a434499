"""Bridges at run time: on the node that leads a bridge, its link to the remote broker (bridge.link),
connected, relayed and reconnected.

Exactly one node of a fleet forwards a bridge. Leadership is a lease in the store, in the bridge
session's slot (``fmq:{$bridge:<name>}:lease``, the leader's node id with a short TTL that it renews);
nodes other than the preferred one (rendezvous hashing over the live nodes) wait a lease period longer
before they try, so placement spreads over the fleet, and a healthy leader is never displaced. The lease
only decides who connects: the bridge's session is claimed like any client's, so a stale leader that
lost its lease is fenced by the session's epoch before it can store or acknowledge anything. A leader
that cannot renew in time stops forwarding. Without a shared store (the memory store) the node always
leads.

The remote connection is tcp or tls (asyncio streams); the in-process side is a Channel of the node
whose IO hands bytes to the link on the next loop turn (never re-entering the channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..bridges import BridgeConfig
from ..channel import Channel, ChannelIO
from ..codec import (
    MQTT5,
    Connack,
    Connect,
    Disconnect,
    Parser,
    Publish,
    Pubrel,
    Suback,
    Subscribe,
    Unsubscribe,
)
from ..eventschema import BridgeCloseReason as Close
from ..negotiation import INTERNAL
from ..router import Subscription
from ..store import keys
from ..store.connections import read_secret
from ..telemetry import Telemetry
from ..websocket import ClientWebSocket
from .backoff import Backoff
from .link import BridgeLink, Phase, local_connect, local_subscriptions

log = logging.getLogger("fleetmq.bridge")

LEASE_TTL = 5.0  # seconds a leader's lease lasts unless renewed
RENEW_EVERY = 1.0
CONNECT_TIMEOUT = 10.0
ROUTE_RETRY_MIN, ROUTE_RETRY_MAX = 0.5, 5.0  # seconds between attempts to route a bridge's forwards

#: makes the in-process channel of a bridge's session: (its IO, peer, listener) -> channel
NewChannel = Callable[[ChannelIO, str, str], Channel]


def lease_key(bridge: BridgeConfig) -> str:
    return f"fmq:{{{bridge.session_id}}}:lease"


def preferred(bridge: str, nodes: list[str]) -> str | None:
    """The node a bridge should run on when it is free: rendezvous hashing, so a node joining or leaving
    moves only its share of the bridges."""
    if not nodes:
        return None
    return max(nodes, key=lambda n: hashlib.sha256(f"{bridge}\0{n}".encode()).digest())


def routed(cfg: BridgeConfig, routes: Mapping[str, Subscription]) -> bool:
    """Whether a route table (the bridge session's subscriptions in it) has every forward, as
    subscribed: the options decide the QoS and retain flag a message is queued for the remote with."""
    for topic_filter, opts in local_subscriptions(cfg):
        sub = routes.get(topic_filter)
        if sub is None or (sub.qos, sub.no_local, sub.retain_as_published) != (
            opts.qos,
            opts.no_local,
            opts.retain_as_published,
        ):
            return False
    return True


class Lease:
    """Leadership of one bridge. `hold` is awaited until this node leads; `lost` is set when it stops."""

    _RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
    _RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

    def __init__(
        self,
        bridge: BridgeConfig,
        node_id: str,
        redis: Callable[[str], Any] | None,
        alive: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.key = lease_key(bridge)
        self._alive = alive  # whether a node is up (cluster.Cluster.listening)
        self.name = bridge.name
        self.node_id = node_id
        self._client = redis  # the Redis client holding a key (None: no shared store, this node always leads)
        self.lost = asyncio.Event()

    @property
    def _redis(self) -> Any:
        assert self._client is not None
        return self._client(self.key)

    async def _first(self) -> bool:
        """Whether this node is the bridge's preferred one among the fleet's registered nodes."""
        assert self._client is not None
        members = await self._client(keys.NODES).smembers(keys.NODES)
        return preferred(self.name, sorted(m.decode() for m in members)) in (None, self.node_id)

    async def hold(self) -> None:
        """Return once this node holds the lease: a free one (the preferred node at once, the others
        once it stayed free for a lease period), or one whose holder crashed (its event stream is gone:
        `alive` says no), taken at once.

        It looks every RENEW_EVERY. A SET whose reply never came (a timeout) may still land, later, and
        then lives only LEASE_TTL: so no other SET follows it for a lease period, and the next looks find
        this node's id there (it is renewed, then leads) before it lapses. Sleeping between looks instead
        let a slow store's SETs land and lapse unseen, over and over (seen in CI under load)."""
        self.lost.clear()
        if self._client is None:
            return
        ttl = int(LEASE_TTL * 1000)
        loop = asyncio.get_running_loop()
        free_since: float | None = None  # when the lease was first seen free (loop time)
        quiet_until = 0.0  # no SET before then: the last one's outcome may be unknown yet
        while True:
            try:
                holder = (await self._redis.get(self.key) or b"").decode()
                if holder == self.node_id:
                    # ours (a SET that timed out, or a restart within the TTL), maybe about to lapse
                    if await self._redis.eval(self._RENEW, 1, self.key, self.node_id, ttl):
                        return
                    continue  # it lapsed just now: look again
                if holder and self._alive is not None and not await self._alive(holder):
                    log.info("bridge %s: its leader %s is gone; taking the bridge over", self.name, holder)
                    await self._redis.eval(self._RELEASE, 1, self.key, holder)
                    holder, free_since = "", -math.inf
                if holder:
                    free_since = None
                else:
                    now = loop.time()
                    if free_since is None:
                        free_since = now
                    waited = now - free_since >= LEASE_TTL
                    if now >= quiet_until and (waited or await self._first()):
                        quiet_until = now + LEASE_TTL
                        if await self._redis.set(self.key, self.node_id, nx=True, px=ttl):
                            return
            except Exception as e:  # the store away or slow: keep looking
                log.debug("bridge %s: lease: %s", self.name, e)
            await asyncio.sleep(RENEW_EVERY)

    async def keep(self) -> None:
        """Renew until renewal fails for a lease period; then `lost` is set and this returns."""
        if self._client is None:
            await asyncio.Event().wait()  # forever
        ttl = int(LEASE_TTL * 1000)
        last = time.monotonic()
        while True:
            await asyncio.sleep(RENEW_EVERY)
            try:
                if await self._redis.eval(self._RENEW, 1, self.key, self.node_id, ttl):
                    last = time.monotonic()
                    continue
                log.warning("bridge %s: another node leads it now", self.name)
                break
            except Exception as e:
                if time.monotonic() - last >= LEASE_TTL - RENEW_EVERY:
                    log.warning("bridge %s: cannot renew its lease (%s); stopping", self.name, e)
                    break
        self.lost.set()

    async def queued(self, session_id: str) -> int | None:
        """Messages the bridge's parked session holds in the store (queue and journal); None: unknown."""
        if self._client is None:
            return None
        k = keys.session_keys(session_id)
        redis = self._client(k[0])
        with contextlib.suppress(Exception):
            async with redis.pipeline(transaction=False) as pipe:
                pipe.llen(k[2])
                pipe.hlen(k[3])
                q, i = await pipe.execute()
            return int(q) + int(i)
        return None

    async def release(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._redis.eval(self._RELEASE, 1, self.key, self.node_id)


class _LocalIO:
    """The ChannelIO of the bridge session's in-process connection: what the channel writes goes to the
    link on the next loop turn, in order: bytes (acks, CONNACK, ...) and PUBLISH packets, which the
    channel hands over unencoded (write_packet)."""

    def __init__(
        self, deliver: Callable[[list[bytes | Publish]], None], on_close: Callable[[], None]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deliver = deliver
        self._on_close = on_close
        self._buf: list[bytes | Publish] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self._add(data)

    def write_packet(self, packet: Publish) -> None:
        self._add(packet)

    def _add(self, item: bytes | Publish) -> None:
        if self.closed:
            return
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(item)

    def _flush(self) -> None:
        items, self._buf = self._buf, []
        if items:
            self._deliver(items)

    def close(self) -> None:
        if not self.closed:
            self._flush()
            self.closed = True
            self._loop.call_soon(self._on_close)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Session:
    """A short in-process connection to a bridge's session, to set it up or end it: ask() sends a packet
    and returns the fleet's reply (what the session delivers meanwhile waits for the link)."""

    def __init__(self, new_channel: NewChannel, cfg: BridgeConfig) -> None:
        self._parser = Parser(version=MQTT5)
        self._replies: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = asyncio.Event()
        self._io = _LocalIO(self._received, self._closed.set)
        self._ch = new_channel(self._io, f"bridge:{cfg.name}", INTERNAL)

    def _received(self, items: list[bytes | Publish]) -> None:
        for item in items:
            if type(item) is bytes:
                for p in self._parser.feed(item):
                    if type(p) is not Pubrel:
                        self._replies.put_nowait(p)

    async def ask(self, packet: Any) -> Any:
        self._ch.packets_received([packet])
        return await asyncio.wait_for(self._replies.get(), CONNECT_TIMEOUT)

    def subscriptions(self) -> list[str]:
        session = self._ch.session
        return list(session.subscriptions) if session is not None else []

    async def close(self) -> None:
        """DISCONNECT (normal: a persistent session is kept) and wait until the channel closed."""
        self._ch.packets_received([Disconnect(0)])
        await asyncio.wait_for(self._closed.wait(), CONNECT_TIMEOUT)

    async def __aenter__(self) -> _Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._io.closed = True
        self._ch.connection_lost()


class Bridge:
    """One bridge on this node: leads it when the lease says so, and keeps its link up while it does."""

    def __init__(
        self,
        cfg: BridgeConfig,
        fleet: str,
        new_channel: NewChannel,
        lease: Lease,
        rand: Callable[[], float] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.cfg = cfg
        self.telemetry = telemetry  # its session's zone's: the event log's bridge events
        self.fleet = fleet
        self._new_channel = new_channel
        self.lease = lease
        r = cfg.reconnect
        kw = {"rand": rand} if rand is not None else {}
        self.backoff = Backoff(r.initial_delay, r.max_delay, r.jitter, r.stable_after, **kw)
        self.leader = False
        self.connected = False
        self.link: BridgeLink | None = None
        self.last_error: str | None = None
        # what links did, summed over the ended ones (report() adds the live one's)
        self.forwarded = 0
        self.received = 0
        self.dropped: Counter[str] = Counter()
        self.reconnects: Counter[str] = Counter()  # ended connections and failed attempts, by Close kind
        self.leader_changes = 0  # times this node became the bridge's leader
        self.sessions_lost = 0  # connections that found the remote had lost the bridge's session
        self.channel: Channel | None = None  # the session's in-process connection, while the link is up
        self.stored = 0  # what the parked session holds in the store, as last counted
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        if not cfg.persist:
            log.warning(
                "bridge %s: persist is false: everything goes to the remote as QoS 0, and what comes while "
                "it is away is dropped (not_persisted) unless queue.storeQos0 keeps it",
                cfg.name,
            )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def route(self, routes: Callable[[], Mapping[str, Subscription]]) -> None:
        """Return once this node routes every forward to the bridge's session, which keeps what they
        match until a leader sends it: the node must not accept a publish before, or it would
        acknowledge a message that no session takes. `routes` reads the session's subscriptions in the
        node's route table, loaded from the store when the session has its forwards there already (a
        restart, a bridge another node set up: nothing is touched, a live link stays up); otherwise (a
        new session, a forward added or changed) the session is opened here with them, as a leader
        does, retrying until the fleet answers."""
        delay = ROUTE_RETRY_MIN
        while not routed(self.cfg, routes()):
            trouble = await self._open_session()
            if trouble is None:
                return
            log.warning(
                "bridge %s: cannot route its forwards in the fleet (%s); retrying in %.1fs",
                self.cfg.name,
                trouble,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, ROUTE_RETRY_MAX)

    async def drain(self, timeout: float) -> None:
        """Before a graceful stop: send nothing new, and wait up to `timeout` for the remote to acknowledge
        what it has, so the next leader need not send it again (a QoS 1 repeat at the remote)."""
        link = self.link
        if link is None or not link.live or link.phase != Phase.UP:
            return
        link.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while link.live and not link.settled and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self, release: bool = True) -> None:
        """Stop leading: the link closes and the session parks. `release`: give the lease up now (a
        node handing over releases it once the session's last writes are committed)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if release:
            await self.lease.release()

    async def _run(self) -> None:
        while not self._stopping:
            await self.lease.hold()
            self.leader = True
            self.leader_changes += 1
            log.info("bridge %s: leading it on this node", self.cfg.name)
            keeper = asyncio.get_running_loop().create_task(self.lease.keep())
            counter = asyncio.get_running_loop().create_task(self._count_stored())
            try:
                while not self.lease.lost.is_set():
                    trouble = await self._open_session()
                    if trouble is None:
                        break
                    log.warning(
                        "bridge %s: cannot open its session in the fleet (%s)", self.cfg.name, trouble
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.lease.lost.wait(), self.backoff.next_delay())
                while not self.lease.lost.is_set():
                    kind, why = await self._connect_once()
                    self.last_error = why
                    if self.lease.lost.is_set():
                        break
                    self.reconnects[kind] += 1
                    if self.telemetry is not None:
                        self.telemetry.bridge_reconnect(self.cfg.session_id, kind)
                    delay = self.backoff.next_delay()
                    log.info("bridge %s: %s; reconnecting in %.1fs", self.cfg.name, why, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.lease.lost.wait(), delay)
            finally:
                keeper.cancel()
                counter.cancel()
                self.leader = False

    async def discard(self) -> None:
        """The bridge was removed: end its session in the fleet (its queue and its routes go with it)."""
        async with _Session(self._new_channel, self.cfg) as session:
            await session.ask(Connect(self.cfg.session_id, proto_level=MQTT5, clean_start=True, keepalive=0))
            await session.close()

    async def _open_session(self) -> str | None:
        """Open the bridge's session in the fleet with the forwards as its subscriptions (those of an
        older config removed), and park it: from now on what is published for the remote is queued in
        the store, whether the remote is reachable or not. None, or what went wrong."""
        cfg = self.cfg
        try:
            async with _Session(self._new_channel, cfg) as session:
                # (a window of 1: nobody reads what the session delivers to this short connection)
                ack = await session.ask(local_connect(cfg, 1))
                if type(ack) is not Connack or ack.reason_code:
                    return f"CONNACK {getattr(ack, 'reason_code', ack)!r}"
                wanted = local_subscriptions(cfg)
                stale = [f for f in session.subscriptions() if f not in dict(wanted)]
                if stale:
                    await session.ask(Unsubscribe(2, stale))
                    log.info("bridge %s: forwards %s removed from its session", cfg.name, ", ".join(stale))
                if wanted:
                    suback = await session.ask(Subscribe(1, wanted))
                    if type(suback) is not Suback or any(rc >= 0x80 for rc in suback.reason_codes):
                        return f"SUBACK {getattr(suback, 'reason_codes', suback)!r}"
                await session.close()
                return None
        except TimeoutError:
            return "the fleet did not answer in time"

    async def _count_stored(self) -> None:
        """While the link is down, count what waits in the store every few seconds (the queue gauge)."""
        while True:
            if self.channel is None and (n := await self.lease.queued(self.cfg.session_id)) is not None:
                self.stored = n
            await asyncio.sleep(5.0)

    def report(self) -> dict[str, Any]:
        """This node's view of the bridge, for metrics and the MqttBridge status."""
        link, session = self.link, self.channel.session if self.channel is not None else None
        queue = len(session.mqueue) if session is not None else self.stored
        dropped = Counter(self.dropped)
        if link is not None:
            dropped.update(link.dropped)
        return {
            "connected": self.connected,
            "leader": self.leader,
            "queue": queue,
            "queue_limit": self.cfg.queue.max_length,
            "inflight": len(session.inflight) if session is not None else 0,
            "forwarded": self.forwarded + (link.forwarded if link else 0),
            "received": self.received + (link.received if link else 0),
            "dropped": dropped,
            "reconnects": self.reconnects,
            "leader_changes": self.leader_changes,
            "sessions_lost": self.sessions_lost,
            "last_error": self.last_error,
        }

    async def _connect_once(self) -> tuple[Close, str]:
        """One connection to the remote, relayed until it ends; returns how and why it ended."""
        cfg = self.cfg
        host, port = cfg.remote.address
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=_client_tls(cfg), server_hostname=_sni(cfg)),
                CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError) as e:
            return Close.CONNECT_ERROR, f"cannot connect to {host}:{port} ({e or type(e).__name__})"
        loop = asyncio.get_running_loop()
        try:
            password = read_secret(cfg.remote.password_file)
        except ValueError as e:
            writer.close()
            return Close.CONNECT_ERROR, str(e)
        link = self.link = BridgeLink(cfg, self.fleet, password.encode() if password else None, loop.time())
        ws = ClientWebSocket(host, cfg.remote.path) if cfg.remote.transport in ("ws", "wss") else None
        early = bytearray()  # (ws: MQTT bytes waiting for the handshake)
        if ws is not None:
            writer.write(ws.handshake())

        def to_remote(out: bytes) -> None:
            if ws is None:
                writer.write(out)
            elif ws.open:
                writer.write(ws.frame(out))
            else:
                early.extend(out)

        ended = asyncio.Event()
        channel: Channel | None = None
        connected_at: float | None = None

        def flush() -> None:
            nonlocal channel, connected_at
            if link.drops_pending and self.telemetry is not None:
                for reason, n in Counter(link.take_drops()).items():
                    self.telemetry.bridge_dropped(cfg.session_id, reason, n)
            out = link.take_remote()
            if out and not writer.is_closing():
                to_remote(out)
            packets = link.take_local()
            if packets and not io.closed:
                if channel is None:  # the link's CONNECT: the session's connection opens now
                    channel = self.channel = self._new_channel(io, f"bridge:{cfg.name}", INTERNAL)
                channel.packets_received(packets)
            if connected_at is None and link.phase == Phase.UP:
                connected_at = loop.time()
                self.backoff.connected(connected_at)
                self.connected = True
                log.info("bridge %s: connected to %s:%d", cfg.name, host, port)
            if not link.live:
                ended.set()

        def from_local(items: list[bytes | Publish]) -> None:
            link.local_data(items, loop.time())
            flush()

        def local_closed() -> None:
            if link.live:
                link.close("the fleet closed the bridge's session", Close.FLEET)
            ended.set()

        io = _LocalIO(from_local, local_closed)
        flush()

        async def read_remote() -> None:
            while link.live:
                try:
                    raw = await reader.read(65536)
                    why = "the remote closed the connection"
                except OSError as e:  # (reset: a remote gone while we were writing to it)
                    raw, why = b"", f"the connection to the remote failed ({e})"
                data = raw
                if ws is not None:
                    data, out = ws.receive(raw or None)
                    if ws.open and early:
                        out += ws.frame(bytes(early))
                        early.clear()
                    if out and not writer.is_closing():
                        writer.write(out)
                    if ws.closed:
                        why = ws.error or why
                        if data:
                            link.remote_data(data, loop.time())
                            flush()
                        data = b""
                    elif not data:
                        continue  # (the handshake's answer, a ping)
                if not data:
                    if link.phase == Phase.REMOTE_CONNECT:  # (an attempt that failed, not an outage)
                        link.close(f"{why} before CONNACK", Close.CONNECT_ERROR)
                    else:
                        link.close(why, Close.REMOTE_CLOSED)
                    break
                link.remote_data(data, loop.time())
                flush()
            ended.set()

        async def tick() -> None:
            while True:
                nxt = link.tick(loop.time())
                flush()
                if nxt is None:
                    return
                await asyncio.sleep(max(nxt - loop.time(), 0.01))

        tasks = [loop.create_task(read_remote()), loop.create_task(tick())]
        try:
            await ended.wait()
        finally:
            for t in tasks:
                t.cancel()
            if link.live:
                link.close("stopped")
            flush()
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            io.closed = True
            if channel is not None:  # (the session is parked: what comes for the remote queues in the store)
                channel.connection_lost()
            if connected_at is not None:
                self.backoff.disconnected(loop.time())
            self.connected = False
            self.link = self.channel = None
            self.forwarded += link.forwarded
            self.received += link.received
            self.dropped.update(link.dropped)
            self.sessions_lost += link.session_lost
        return link.close_kind or Close.STOPPED, link.closed or "ended"


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What a node says of a bridge in its heartbeat (JSON-ready; the operator's MqttBridge status)."""
    keys = ("leader", "connected", "queue", "forwarded", "last_error")
    return {**{k: report[k] for k in keys}, "dropped": dict(report["dropped"])}


def _client_tls(cfg: BridgeConfig) -> ssl.SSLContext | None:
    if cfg.remote.transport not in ("tls", "wss"):
        return None
    tls = cfg.remote.tls
    ctx = ssl.create_default_context(cafile=tls.cafile if tls is not None else None)
    if tls is None:
        return ctx
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.certfile and tls.keyfile:
        ctx.load_cert_chain(tls.certfile, tls.keyfile)
    return ctx


def _sni(cfg: BridgeConfig) -> str | None:
    if cfg.remote.transport not in ("tls", "wss"):
        return None
    tls = cfg.remote.tls
    return (tls.server_name if tls else None) or cfg.remote.host
