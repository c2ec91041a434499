"""The fleet: nodes sharing one Redis (node registry, routes, cross-node delivery, takeover).

- Registry: each node refreshes its ``keys.alive`` key with a TTL; a node whose key lapsed is dead.
- Routes: every node keeps the whole fleet's subscriptions in its router; changes are published to the
  fleet (keys.Channels: one channel on one Redis, one per slot on a Redis Cluster) by the same Lua
  script that stores them, so a route is never announced unstored.
- Delivery: a message for a session that is not connected here is appended to that session's queue in
  Redis; the enqueue script wakes the session's owner on its channel, which pulls its queue.
The messages are wire's.
- Takeover: a node that gets a CONNECT for a client connected elsewhere asks the owner to hand the
  session over (the owner closes the connection with 0x8E and stores the session), then claims it with
  a higher epoch. An owner that does not answer (dead, paused) is fenced: its writes carry a stale epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from .banned import Ban
from .message import Delivery, Message, Will
from .metrics import Metrics
from .retained import Retained
from .router import Router
from .session import Session
from .store import keys, wire
from .store.base import retrying
from .store.connections import Shard, command
from .store.redis_store import RedisStore, text
from .trace import STREAM_MAX, TraceSpec

log = logging.getLogger("fleetmq.cluster")

HEARTBEAT_TTL = 5.0
REAP_INTERVAL = 1.0
#: A node is released only once this reaper has been connected, and Redis up, for this long: a node whose
#: heartbeat lapsed while Redis was away, or while this reaper was cut off too, gets the time to come back.
REAP_GRACE = HEARTBEAT_TTL + 3.0
HANDOVER_TIMEOUT = 3.0
ASK_TIMEOUT = 3.0  # for another node's management API to answer (api.local)
PULL_BATCH = 1000
SUBSCRIBE_TIMEOUT = 5.0  # for Redis to confirm the event stream's subscriptions
REPLICA_LAG = 1  # seconds since a replica last acknowledged: more, and it is not in sync
SYNC_TIMEOUT = 3.0  # for Redis to answer a PING on the event stream (sync)
RELEASE_FOR = 10.0  # a dead node's release is sent again (its reply lost) for this long


M = TypeVar("M", bound=BaseModel)


def parse_entries(raw: dict[Any, Any], model: type[M], what: str) -> list[M]:
    """A fleet-wide hash of JSON entries (bans, traces) as stored; an entry that does not parse (another
    version's) is skipped, said."""
    out = []
    for key, value in raw.items():
        try:
            out.append(model.model_validate_json(value))
        except ValueError as e:
            log.warning("skipping the %s %s: %s", what, text(key), e)
    return out


def parse_bans(raw: dict[Any, Any]) -> list[Ban]:
    return parse_entries(raw, Ban, "ban")


def parse_traces(raw: dict[Any, Any]) -> list[TraceSpec]:
    return parse_entries(raw, TraceSpec, "trace")


def replicas_in_sync(replication: dict[str, Any]) -> int:
    """The replicas an INFO replication reply lists as online and at most REPLICA_LAG seconds behind."""
    return sum(
        1
        for field, value in replication.items()
        if field.startswith("slave") and field[5:].isdigit() and isinstance(value, dict)
        and value.get("state") == "online" and int(value.get("lag", REPLICA_LAG + 1)) <= REPLICA_LAG
    )  # fmt: skip


class Sessions(Protocol):
    """What the fleet needs of the sessions connected to this node (cm.ChannelManager)."""

    def session_of(self, client_id: str) -> Session | None: ...

    def connected(self) -> Iterable[str]: ...

    def owned(self) -> list[tuple[str, int, Message | None, float]]: ...

    def deliver_stored(self, client_id: str, epoch: int, deliveries: Iterable[Delivery]) -> None: ...

    async def hand_over(self, client_id: str, clean_start: bool) -> None: ...

    def resync(self, client_id: str, epoch: int) -> None: ...

    def fenced(self, client_id: str, epoch: int | None = None) -> None: ...

    def publish_will(self, will: Will) -> None: ...


Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class Cluster:
    def __init__(
        self,
        node_id: str,
        store: RedisStore,
        sessions: Sessions,
        router: Router,
        retained: Retained,
        metrics: Metrics,
        spawn: Spawn,
        report: Callable[[], dict[FieldT, EncodableT]],
        ordered: Callable[[bytes | None], None] = lambda _: None,
        banned: Callable[[list[Ban]], object] = lambda _: None,
        traced: Callable[[list[TraceSpec]], object] = lambda _: None,
    ) -> None:
        self.node_id = node_id
        #: this run of the node: its heartbeat's value, and what the store's connection counts name (a pod
        #: restarted under the same name does not inherit the counts of its previous run)
        self.instance = f"{node_id}:{os.urandom(6).hex()}"
        self._live: dict[str, str] = {}  # node id -> its live instance, as of the last check
        self.store = store
        self.sessions = sessions
        self.router = router
        self.retained = retained
        self.metrics = metrics
        self.spawn = spawn
        self.report = report  # what this node tells the operator with every heartbeat (keys.nodeinfo)
        self.ordered = ordered  # given what the operator asks of this node, read with every heartbeat
        self.banned = banned  # given the fleet's bans, read with every heartbeat
        self.traced = traced  # given the fleet's packet traces, read with every heartbeat
        self._ban_cache: dict[Any, Ban] = {}  # stored value -> parsed
        self.channels = store.channels
        self.channel = self.channels.node(self.node_id)  # handovers and kicks come here
        # the event stream: a pub/sub connection to each shard of the store (one on one Redis)
        self._streams: list[tuple[Shard, PubSub]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._handovers: dict[str, asyncio.Future[None]] = {}
        self._asks: dict[str, asyncio.Future[bytes]] = {}
        #: what answers other nodes' management API here (api.local, set by the server; None: no API)
        self.answer: Callable[[bytes], Awaitable[bytes]] | None = None
        self._req_ids = itertools.count(1)
        self._pulls: set[str] = set()
        self._pull_scheduled = False
        # sessions with a pull on its way, and those woken meanwhile (pulled again once it is back)
        self._pulling: set[str] = set()
        self._pull_again: set[str] = set()
        self._connected_since: float | None = None  # when the event stream last came up (None: it is down)
        #: replicas of the primary online and at most REPLICA_LAG behind, as of the last heartbeat (-1: unknown)
        self.replicas_in_sync = -1
        # Set while the event stream is up and everything queued before it came up was pulled: wakes for
        # this node's sessions reach it (sync relies on them).
        self._stream_ready = asyncio.Event()
        # sync(): PINGs on the event stream awaiting their PONG, and what pulls did while any waits
        self._syncs: dict[bytes, asyncio.Future[None]] = {}
        self._syncing = 0
        self._pull_seq = 0  # grows with every pull sent
        self._pulled_after: dict[str, int] = {}  # per session, the latest pull sent that came back
        self._pull_progress = asyncio.Condition()

    def _client(self, key: str) -> Redis:
        """The client of the shard that holds `key`."""
        return self.store.conns.shard_for(key).redis

    async def start(self) -> None:
        await self._open_streams()
        self._connected_since = time.monotonic()
        self._stream_ready.set()
        # Sessions still listed for this node id belong to an earlier run of it (a restarted pod).
        await self._release(self.node_id)
        await self._beat()
        await self._client(keys.NODES).sadd(keys.NODES, self.node_id)
        await self._check_live()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._listen(), name="fleetmq-cluster-listen"),
            loop.create_task(self._heartbeat(), name="fleetmq-heartbeat"),
            loop.create_task(self._reaper(), name="fleetmq-reaper"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            mine = keys.alive(self.node_id)  # (the node's own keys share one slot)
            await self._client(mine).delete(mine, keys.nodeinfo(self.node_id))
            await self._client(keys.NODES).srem(keys.NODES, self.node_id)
        await self._close_streams()

    # -- registry --------------------------------------------------------------------------------
    async def _beat(self) -> None:
        conns = self.store.conns
        info: dict[FieldT, EncodableT] = {
            **self.report(),
            "ts_ms": int(time.time() * 1000),
            "store_primary": ",".join(conns.primaries()),
            "store_failovers": conns.failovers,
            "store_replicas_in_sync": self.replicas_in_sync,
        }
        ttl = int(HEARTBEAT_TTL * 1000)
        mine = keys.alive(self.node_id)
        # The fleet-wide bans and traces ride along where they live on the node's own server (one Redis);
        # on a Redis Cluster they are other slots', read from their own shards.
        here = conns.shard_for(mine)
        fleet_wide = (keys.BANNED, keys.TRACES)
        along = [k for k in fleet_wide if conns.shard_for(k) is here]
        apart = [k for k in fleet_wide if k not in along]
        async with self._client(mine).pipeline(transaction=False) as pipe:
            pipe.set(mine, self.instance, px=ttl)
            pipe.hset(keys.nodeinfo(self.node_id), mapping=info)
            pipe.pexpire(keys.nodeinfo(self.node_id), 3 * ttl)
            pipe.get(keys.rebalance(self.node_id))
            for key in along:
                pipe.hgetall(key)
            replies = await pipe.execute()
        self.ordered(replies[3])
        read = dict(zip(along, replies[4:], strict=True))
        read |= zip(apart, await asyncio.gather(*(self._client(k).hgetall(k) for k in apart)), strict=True)
        self.banned(self._bans(read[keys.BANNED]))
        self.traced(parse_traces(read[keys.TRACES]))
        # the shard with the fewest replicas in sync is what a failover could cost
        replication = await asyncio.gather(*(s.redis.info("replication") for s in conns.shards))
        self.replicas_in_sync = min(replicas_in_sync(r) for r in replication)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_TTL / 5)
            try:
                await self._beat()
            except Exception as e:  # Redis away: keep trying; the store's errors are counted elsewhere
                log.warning("heartbeat failed: %s", e)

    async def is_alive(self, node_id: str) -> bool:
        """A node is alive while its heartbeat lasts or while it listens on its channel (a node killed
        with -9 stops listening at once; one that lost Redis for a while has let its heartbeat lapse)."""
        if await self._client(keys.alive(node_id)).exists(keys.alive(node_id)):
            return True
        return await self.listening(node_id)

    async def listening(self, node_id: str) -> bool:
        """Whether the node's subscription to its own channel is there: its event stream is connected."""
        channel = self.channels.node(node_id)
        numsub = "PUBSUB SHARDNUMSUB" if self.channels.sharded else "PUBSUB NUMSUB"
        reply = await command(self._client(channel), numsub, channel)
        # (redis-py pairs the reply up for PUBSUB NUMSUB, not for SHARDNUMSUB)
        pairs = reply if reply and isinstance(reply[0], tuple) else zip(reply[::2], reply[1::2], strict=True)
        return any(int(n) > 0 for _channel, n in pairs)

    async def _may_reap(self) -> bool:
        """Whether this node can tell a dead node from one that was cut off like itself or Redis: it has
        been connected for REAP_GRACE, and so has Redis (a restarted Redis has every heartbeat lapsed)."""
        since = self._connected_since
        if since is None or time.monotonic() - since < REAP_GRACE:
            return False
        infos = await asyncio.gather(*(s.redis.info("server") for s in self.store.conns.shards))
        return min(float(i.get("uptime_in_seconds", 0)) for i in infos) >= REAP_GRACE

    # -- dead nodes ------------------------------------------------------------------------------
    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            try:
                await self._check_live()
                await self._reap_dead()
            except Exception as e:
                log.warning("checking for dead nodes failed: %s", e)

    async def read_bans(self) -> list[Ban]:
        return self._bans(await self._client(keys.BANNED).hgetall(keys.BANNED))

    def _bans(self, raw: dict[Any, Any]) -> list[Ban]:
        """The bans as stored, parsed once each (read every heartbeat); expired ones are deleted."""
        cache, self._ban_cache = self._ban_cache, {}
        now = time.time()
        out = []
        for key, value in raw.items():
            ban = cache.get(value)
            if ban is None:
                (ban,) = parse_bans({key: value}) or (None,)
            if ban is None:
                continue
            if not ban.active(now):
                self._later(self._drop_ban, text(key))
                continue
            self._ban_cache[value] = ban
            out.append(ban)
        return out

    async def _drop_ban(self, key: str) -> None:
        try:
            await self._client(keys.BANNED).hdel(keys.BANNED, key)
        except Exception as e:  # (the next heartbeat tries again)
            log.info("could not delete the expired ban %s: %s", key, e)

    async def put_ban(self, ban: Ban) -> None:
        await self._client(keys.BANNED).hset(keys.BANNED, ban.key, ban.model_dump_json())

    async def delete_ban(self, key: str) -> bool:
        return bool(await self._client(keys.BANNED).hdel(keys.BANNED, key))

    # -- packet traces (trace.py) --------------------------------------------------------------
    async def read_traces(self) -> list[TraceSpec]:
        return parse_traces(await self._client(keys.TRACES).hgetall(keys.TRACES))

    async def put_trace(self, spec: TraceSpec) -> None:
        await self._client(keys.TRACES).hset(keys.TRACES, spec.name, spec.model_dump_json())

    async def delete_trace(self, name: str) -> bool:
        stream = keys.trace_stream(name)
        await self._client(stream).delete(stream)
        return bool(await self._client(keys.TRACES).hdel(keys.TRACES, name))

    async def append_trace(self, name: str, lines: list[str]) -> None:
        stream = keys.trace_stream(name)
        async with self._client(stream).pipeline(transaction=False) as pipe:
            for line in lines:
                pipe.xadd(stream, {"r": line}, maxlen=STREAM_MAX, approximate=True)
            await pipe.execute()

    async def trace_lines(self, name: str) -> list[str]:
        stream = keys.trace_stream(name)
        entries = await self._client(stream).xrange(stream) or []
        return [text(fields[b"r"]) for _id, fields in entries if fields]

    async def trace_sizes(self, names: list[str]) -> list[int]:
        return [int(await self._client(keys.trace_stream(n)).xlen(keys.trace_stream(n))) for n in names]

    async def nodes(self) -> list[tuple[str, bool, dict[str, str]]]:
        """Every registered node: (node id, whether its heartbeat lasts, its last report)."""
        nodes = sorted(text(n) for n in await self._client(keys.NODES).smembers(keys.NODES))

        async def one(node: str) -> tuple[str, bool, dict[str, str]]:
            alive = await self._client(keys.alive(node)).exists(keys.alive(node))
            info = await self._client(keys.nodeinfo(node)).hgetall(keys.nodeinfo(node))
            return node, bool(alive), {text(k): text(v) for k, v in info.items()}

        return list(await asyncio.gather(*(one(n) for n in nodes)))

    def live_instances(self) -> frozenset[str]:
        return frozenset((self.instance, *self._live.values()))

    async def check_instances(self, instances: list[str]) -> frozenset[str]:
        """Those of `instances` alive now: their node's heartbeat names them, or their node still listens
        on its channel with no heartbeat naming another run (it lost Redis for a while)."""
        alive = set()
        for instance in instances:
            node = instance.rpartition(":")[0]
            beat = await self._client(keys.alive(node)).get(keys.alive(node))
            if (beat is not None and text(beat) == instance) or (beat is None and await self.listening(node)):
                alive.add(instance)
        return frozenset(alive)

    async def _check_live(self) -> None:
        """Which run of each registered node is alive (its heartbeat's value). A node whose heartbeat
        lapsed while it still listens on its channel keeps the instance it had."""
        nodes = [text(n) for n in await self._client(keys.NODES).smembers(keys.NODES)]
        beats = await asyncio.gather(*(self._client(keys.alive(n)).get(keys.alive(n)) for n in nodes))
        live: dict[str, str] = {}
        for node, beat in zip(nodes, beats, strict=True):
            if beat is not None:
                live[node] = text(beat)
            elif node in self._live and await self.listening(node):
                live[node] = self._live[node]
        self._live = live

    async def _reap_dead(self) -> None:
        if not await self._may_reap():
            return
        nodes = self._client(keys.NODES)
        for raw in await nodes.smembers(keys.NODES):
            dead = text(raw)
            if dead == self.node_id or await self.is_alive(dead):
                continue
            # One node of the fleet cleans up after the dead one.
            lock = keys.reap_lock(dead)
            if not await self._client(lock).set(lock, self.node_id, nx=True, px=30_000):
                continue
            n = await self._release(dead)
            await nodes.srem(keys.NODES, dead)
            log.warning("node %s stopped heartbeating; released its %d sessions", dead, n)

    async def _release(self, dead: str) -> int:
        """Its sessions wait for their clients (or end, if clean); their wills go out after their delay.
        A release whose reply is lost is sent again with the same token (the same answer)."""
        theirs = keys.node_sessions(dead)
        redis = self._client(theirs)
        cids = [text(c) for c in await redis.smembers(theirs)]
        if not cids:
            return 0
        token = os.urandom(8).hex()
        released = await retrying(
            self.store, lambda: self.store.reap(dead, cids, token), time.monotonic() + RELEASE_FOR
        )
        await redis.delete(theirs)
        loop = asyncio.get_running_loop()
        for cid, _will, will_at, _expiry, kind in released:
            if kind in (1, 3):  # ended: its routes go
                self.router.remove_client(cid)
            if kind in (2, 3):  # its will is due at will_at: exactly one taker publishes it
                loop.call_later(max(0.0, will_at - time.time()), self._later, self._due_will, cid, will_at)
        return len(released)

    def _later(self, task: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        self.spawn(task(*args))

    async def _due_will(self, client_id: str, will_at: float) -> None:
        token = os.urandom(8).hex()  # (a take whose reply is lost is asked again: the same answer)
        try:
            will = await retrying(
                self.store, lambda: self.store.take_will(client_id, will_at, token), time.monotonic() + 60.0
            )
        except Exception as e:
            log.warning("the will of %r was not published: the store did not answer (%s)", client_id, e)
            return
        if will is not None:
            self.sessions.publish_will(will)

    # -- takeover --------------------------------------------------------------------------------
    async def take_over(self, client_id: str, clean_start: bool) -> str | None:
        """Ask the node the client is connected to (if any, and alive) to hand its session over; returns
        that node if it did (a node that does not answer in time is fenced by the claim instead)."""
        owner = await self.store.owner(client_id)
        if not owner or owner == self.node_id:
            return None
        req = f"{self.node_id}:{next(self._req_ids)}"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._handovers[req] = fut
        try:
            heard = await self._tell(owner, wire.handover(client_id, clean_start, self.node_id, req))
            if not heard:  # nobody listens on its channel: crashed (or cut off), fenced by the claim at once
                log.info("node %s is not listening; taking %r over without it", owner, client_id)
                return None
            await asyncio.wait_for(fut, HANDOVER_TIMEOUT)
            return owner
        except TimeoutError:
            log.warning(
                "node %s did not hand over %r within %.0fs; fencing it", owner, client_id, HANDOVER_TIMEOUT
            )
            return None
        finally:
            self._handovers.pop(req, None)

    async def kick_stale(self, client_id: str, owner: str, epoch: int) -> None:
        """Tell a former owner its connection of this client is over (it may have missed the handover).
        Best effort: a former owner that does not hear it finds out at its next write (fenced)."""
        try:
            await self._tell(owner, wire.kick(client_id, epoch))
        except Exception as e:  # (a background task: its failure must be said, not left unretrieved)
            log.info("could not tell node %s that %r moved: %s", owner, client_id, e)

    async def ask(self, node_id: str, body: bytes, timeout: float = ASK_TIMEOUT) -> bytes | None:
        """Ask another node's management API (Ask); its answer, or None when it does not listen (dead, or
        cut off) or does not answer in time."""
        req = f"{self.node_id}:a{next(self._req_ids)}"
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._asks[req] = fut
        try:
            if not await self._tell(node_id, wire.ask(self.node_id, req, body)):
                return None
            return await asyncio.wait_for(fut, timeout)
        except (TimeoutError, RedisError, ConnectionError) as e:
            log.info("node %s did not answer the API's %s: %s", node_id, body[:40], e or "timeout")
            return None
        finally:
            self._asks.pop(req, None)

    def _on_ask(self, requester: str, req: str, body: bytes) -> None:
        async def run() -> None:
            if self.answer is None:
                out = b'{"error": "this node serves no API"}'
            else:
                try:
                    out = await self.answer(body)
                except Exception as e:  # (said to the asker, which turns it into a problem)
                    log.warning("answering the API of node %s failed: %s", requester, e)
                    out = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
            try:
                await self._tell(requester, wire.answer(req, out))
            except Exception as e:  # the asker times out instead
                log.info("could not answer node %s: %s", requester, e)

        self.spawn(run())

    async def _tell(self, node_id: str, message: bytes) -> int:
        """Send another node a message on its channel; how many listened (0: its stream is gone)."""
        channel = self.channels.node(node_id)
        return int(await command(self._client(channel), self.channels.publish, channel, message))

    def _on_handover(self, client_id: str, clean_start: bool, requester: str, req: str) -> None:
        async def run() -> None:
            await self.sessions.hand_over(client_id, clean_start)
            try:
                await self._tell(requester, wire.handed_over(req))
            except Exception as e:  # the requester fences this node after its timeout instead
                log.info("could not tell node %s that %r was handed over: %s", requester, client_id, e)

        self.spawn(run())

    # -- ordering: what Redis queued comes first ---------------------------------------------------
    async def sync(self) -> None:
        """Wait until what Redis had queued, before now, for the sessions connected here is delivered to
        them. A client that connects here may have published through another node just before, and
        its messages for sessions here are then in Redis: they must reach those sessions before what it
        publishes here goes to them directly. A PING on the event stream is answered after every wake
        published before it; then the pulls those wakes started (or later ones) must come back. If
        Redis does not answer in time, the stream is taken for broken and reset: every session here then
        holds its new deliveries until it has caught up."""
        streams = self._streams
        conns = self.store.conns
        if (
            not streams
            or not self._stream_ready.is_set()
            or not all(conns.on_primary(pubsub.connection) for _shard, pubsub in streams)
        ):
            await self._pull_all()  # (no stream: whatever wakes were sent, pull every queue now)
            return
        n = next(self._req_ids)
        tokens = [b"sync:%d:%d" % (n, i) for i in range(len(streams))]
        loop = asyncio.get_running_loop()
        futures = [self._syncs.setdefault(t, loop.create_future()) for t in tokens]
        self._syncing += 1
        try:
            for (_shard, pubsub), token in zip(streams, tokens, strict=True):
                await pubsub.ping(token)
            await asyncio.wait_for(asyncio.gather(*futures), SYNC_TIMEOUT)
            await asyncio.sleep(0)  # (the wakes dispatched before the PONGs schedule their pull now)
            mark = self._pull_seq
            waiting = self._pulls | self._pulling | self._pull_again

            def pulled() -> bool:
                busy = self._pulls | self._pulling | self._pull_again
                return all(c not in busy or self._pulled_after.get(c, -1) > mark for c in waiting)

            async with self._pull_progress:
                await asyncio.wait_for(self._pull_progress.wait_for(pulled), SYNC_TIMEOUT)
        except (TimeoutError, RedisError, OSError) as e:
            log.warning("event stream did not answer in %.0fs (%r); reconnecting it", SYNC_TIMEOUT, e)
            self._stream_broke()
            for _shard, pubsub in streams:
                conn: Any = pubsub.connection  # (redis-py types it as always None)
                if conn is not None:
                    await conn.disconnect()  # the listener sees it and reconnects
            await self._pull_all()
        finally:
            for token in tokens:
                self._syncs.pop(token, None)
            self._syncing -= 1
            if not self._syncing:
                self._pulled_after.clear()

    async def _progress(self) -> None:
        """Pulls moved on: whoever waits for them (sync, catch_up) looks again."""
        async with self._pull_progress:
            self._pull_progress.notify_all()

    # -- pulling queued messages for sessions connected here --------------------------------------
    def wake(self, client_id: str) -> None:
        self._pulls.add(client_id)
        if not self._pull_scheduled:
            self._pull_scheduled = True
            asyncio.get_running_loop().call_soon(lambda: self.spawn(self._pull()))

    async def catch_up(self, client_id: str, epoch: int, first: int, reserved: int) -> None:
        """Pull what the store queued for a session that just opened here into the `reserved` positions
        from `first` that it kept for it, ahead of its later deliveries (Session.hold_back): this node
        may have routed messages to it through Redis just before (its client was not here yet). Returns
        once they are in: its held deliveries may go."""
        end = first + reserved
        while first < end:
            s = self.sessions.session_of(client_id)
            if s is None or s.epoch != epoch:
                return  # let go of meanwhile: what is queued waits in Redis for the next owner
            n = min(PULL_BATCH, end - first)
            async with self._pull_progress:  # one pull per session at a time (see _pull)
                await self._pull_progress.wait_for(lambda: client_id not in self._pulling)
            [got] = await self._pull_targets([(client_id, epoch, first)], n)
            first += max(got, 0)
            if got < n:
                break
        self.wake(client_id)  # (past the reservation, if ever: the usual way)

    async def _pull_all(self) -> None:
        """Pull, now, what Redis queued for every session connected here: without the event stream its
        wakes may have been missed. Sessions catching up (opening here) are waited for first."""
        deadline = time.monotonic() + SYNC_TIMEOUT
        while time.monotonic() < deadline and any(
            (s := self.sessions.session_of(c)) is not None and s.held_from is not None
            for c in self.sessions.connected()
        ):
            await asyncio.sleep(0.005)
        cids = list(self.sessions.connected())
        while cids:
            async with self._pull_progress:  # one pull per session at a time (see _pull)
                await self._pull_progress.wait_for(self._none_pulling(set(cids)))
            targets = []
            for cid in cids:
                s = self.sessions.session_of(cid)
                if s is not None:
                    first = s.journal.reserve(PULL_BATCH) if s.journal is not None else -1
                    targets.append((cid, s.epoch, first))
            counts = await self._pull_targets(targets, PULL_BATCH)
            cids = [cid for (cid, _e, _f), got in zip(targets, counts, strict=True) if got >= PULL_BATCH]

    def _none_pulling(self, cids: set[str]) -> Callable[[], bool]:
        return lambda: not (self._pulling & cids)

    async def _pull(self) -> None:
        self._pull_scheduled = False
        cids, self._pulls = self._pulls, set()
        targets = []
        for cid in cids:
            if cid in self._pulling:
                # One pull per session at a time: each reserves its positions when it is sent, but two
                # on different connections may reach Redis in the other order, and the later pull would
                # take the older messages into the later positions.
                self._pull_again.add(cid)
                continue
            s = self.sessions.session_of(cid)
            if s is not None and s.held_from is None:  # (one catching up pulls itself, then wakes again)
                # a journaled session reserves positions for what the pull brings, ahead of later ones
                first = s.journal.reserve(PULL_BATCH) if s.journal is not None else -1
                targets.append((cid, s.epoch, first))
        if targets:
            counts = await self._pull_targets(targets, PULL_BATCH)
            for (cid, _epoch, _first), got in zip(targets, counts, strict=True):
                if got >= PULL_BATCH:
                    self.wake(cid)  # more may be waiting
        else:
            await self._progress()

    async def _pull_targets(self, targets: list[tuple[str, int, int]], n: int) -> list[int]:
        """Pull up to `n` queued deliveries for each target and deliver them; returns how many each got
        (-1: fenced, or the pull failed)."""
        cids = {cid for cid, _epoch, _first in targets}
        self._pulling |= cids
        self._pull_seq += 1
        seq = self._pull_seq
        try:
            return await self._pull_and_deliver(targets, n)
        finally:
            self._pulling -= cids
            for cid in cids & self._pull_again:
                self._pull_again.discard(cid)
                self.wake(cid)
            if self._syncing:
                for cid in cids:
                    self._pulled_after[cid] = seq
            await self._progress()

    async def _pull_and_deliver(self, targets: list[tuple[str, int, int]], n: int) -> list[int]:
        try:
            replies = await self.store.pull(targets, n)
        except Exception as e:
            # Redis may have run the pull (moving deliveries into the journal) without us seeing the
            # reply: those clients resume from Redis, which holds everything.
            self.metrics.store_errors += 1
            log.warning("pulling queued messages failed (%s): %d sessions resynchronise", e, len(targets))
            for cid, epoch, _first in targets:
                self.sessions.resync(cid, epoch)
            return [-1] * len(targets)
        counts = []
        for (cid, epoch, _first), reply in zip(targets, replies, strict=True):
            if reply == -1:
                s = self.sessions.session_of(cid)
                if s is not None and s.epoch == epoch:
                    self.sessions.fenced(cid)  # the session lives elsewhere now
                counts.append(-1)
                continue
            start, items = int(reply[0]), reply[1]
            deliveries = [wire.unpack_delivery(raw) for raw in items]
            if start >= 0:
                for k, d in enumerate(deliveries):
                    d.order = start + k  # the position the pull gave it in the session's journal
            self.sessions.deliver_stored(cid, epoch, deliveries)
            counts.append(len(items))
        return counts

    # -- events ----------------------------------------------------------------------------------
    async def _open_streams(self) -> None:
        """Subscribe on every shard (first reading a cluster's map again) and wait until Redis confirms:
        from then on nothing published for this node is missed (what came before, a resync pulls)."""
        await self._close_streams()
        conns = self.store.conns
        if conns.sharded:
            await conns.refresh()
        # The map as it is now: another task may read it again while this one waits for Redis (a
        # failover), and a shard of the old map is then no longer in the new one. A stream subscribed on
        # a shard whose slots move is told so (sunsubscribe) and opened again.
        plan = []
        for shard in conns.shards:
            channels = self.channels.subscriptions(self.node_id, conns.slots_of(shard))
            if conns.sharded and conns.shard_for(self.channel) is shard:
                channels.append(self.channel)
            plan.append((shard, channels))
        streams: list[tuple[Shard, PubSub]] = []
        try:
            for shard, channels in plan:
                pubsub = shard.redis.pubsub()
                streams.append((shard, pubsub))
                await self._subscribe(pubsub, channels)
        except BaseException:
            for _shard, pubsub in streams:
                await _close(pubsub)
            raise
        self._streams = streams

    async def _subscribe(self, pubsub: PubSub, channels: list[str]) -> None:
        if self.channels.sharded:  # (one SSUBSCRIBE per channel: a command's channels share one slot)
            for channel in channels:
                await pubsub.ssubscribe(channel)
        else:
            await pubsub.subscribe(*channels)
        pending = {c.encode() for c in channels}
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Redis did not confirm the subscriptions within {SUBSCRIBE_TIMEOUT:.0f}s")
            msg = await pubsub.get_message(timeout=min(left, 1.0))
            if msg is None:
                continue
            if msg["type"] in ("subscribe", "ssubscribe"):
                pending.discard(msg["channel"])
            else:
                self._dispatch(msg)

    async def _close_streams(self) -> None:
        streams, self._streams = self._streams, []
        for _shard, pubsub in streams:
            await _close(pubsub)

    async def _pump(self, pubsub: PubSub) -> None:
        """Dispatch what one shard's stream brings until it breaks (raises). A sharded channel this node
        never left being unsubscribed means its slot moved (a failover, a migration): the shard no longer
        carries its wakes, so the stream counts as broken (subscribed again where the map says, resynced);
        so does a Sentinel stream left on the old primary by a failover."""
        checked = time.monotonic()
        while True:
            msg = await pubsub.get_message(timeout=1.0)
            if (now := time.monotonic()) - checked >= 1.0:
                checked = now
                if not self.store.conns.on_primary(pubsub.connection):
                    raise ConnectionError("the stream's Redis is not the primary any more (a failover)")
            if msg is None:
                continue
            if msg["type"] == "sunsubscribe":
                raise ConnectionError(f"Redis moved the slot of {msg['channel']!r} elsewhere")
            self._dispatch(msg)

    def _stream_broke(self) -> None:
        """Wakes for this node's sessions may be lost from now until the stream is back and resynced
        (which pulls every queue): meanwhile a client connecting here has every queue pulled first
        (sync), so its messages never overtake its own earlier ones routed through Redis."""
        self._connected_since = None
        self._stream_ready.clear()
        for fut in self._syncs.values():  # (they pull every queue instead)
            if not fut.done():
                fut.set_exception(TimeoutError("the event stream broke"))

    async def _listen(self) -> None:
        """Keep the event stream up: when any shard's connection breaks, every session here holds its new
        deliveries, and once all are subscribed again (backing off meanwhile) the node resyncs."""
        backoff = 0.1
        gap = False
        while True:
            try:
                if gap:  # until this succeeds, Redis is still away: keep backing off
                    await self._open_streams()
                    await self._resync()
                    gap = False
                    backoff = 0.1
                    self._connected_since = time.monotonic()
                    self._stream_ready.set()
                    self.metrics.store_reconnects += 1
                pumps = [asyncio.ensure_future(self._pump(pubsub)) for _shard, pubsub in self._streams]
                try:
                    done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
                    for t in done:
                        t.result()
                finally:
                    for t in pumps:
                        t.cancel()
                    # (a pump that failed too meanwhile: its error is the same story, not one to leave
                    # unretrieved)
                    await asyncio.gather(*pumps, return_exceptions=True)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("cluster event stream interrupted (%s); reconnecting in %.1fs", e, backoff)
                gap = True
                self._stream_broke()
                await self._close_streams()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind not in ("message", "smessage"):
            if kind == "pong":
                fut = self._syncs.get(msg["data"])
                if fut is not None and not fut.done():
                    fut.set_result(None)
            return  # (subscription confirmations)
        try:
            self._on_message(msg["channel"], msg["data"])
        except Exception:
            log.exception("bad cluster message on %s", msg.get("channel"))

    async def _resync(self) -> None:
        """After a gap in the event stream: reload routes and retained messages, and pull the queues of
        every session connected here (wakes sent during the gap were lost)."""
        log.info(
            "event stream back: resynchronising sessions, routes, retained messages and queues from Redis"
        )
        await self.store.drop_idle_connections()  # from before the gap: dead
        # The fleet may have released this node's sessions while it was away (it looked dead): take back
        # what nobody else took, let go of the rest (their clients reconnect), never keep a client deaf.
        owned = self.sessions.owned()
        gone = 0
        for (cid, *_), state in zip(owned, await self.store.reassert(owned), strict=True):
            if state == 0:
                self.sessions.fenced(cid)
                gone += 1
        if gone:
            log.warning("%d sessions connected here were ended or taken over while Redis was away", gone)
        before = {cid: self.router.filters_of(cid) for cid in self.router.clients()}
        routes = await self.store.load_routes()
        connected = set(self.sessions.connected())
        stored: dict[str, set[str]] = {}
        for cid, topic_filter, sub in routes:
            if cid not in connected:
                self.router.add(cid, topic_filter, sub)
                stored.setdefault(cid, set()).add(topic_filter)
        # What changed during the gap without this node hearing of it (a session ended, a filter
        # removed), or what it routed itself by a write whose outcome it never learnt (a Clean Start
        # claim's), goes too: for the sessions not connected here, the store's routes are the routes
        # (but those the event stream brought while the store was read, which the read may have missed).
        for cid, filters in before.items():
            if cid not in connected:
                for topic_filter in filters - stored.get(cid, set()):
                    self.router.remove(cid, topic_filter)
        for msg in await self.store.load_retained():
            self.retained.put(msg)
        for cid in connected:
            self.wake(cid)  # (those holding back pull themselves: catch_up)

    def _on_message(self, channel: bytes, data: bytes) -> None:
        if self.channels.to_node(channel):
            self._on_node_message(wire.parse_node_message(data))
            return
        event = wire.parse_fleet_event(data)
        if event.origin == self.node_id:
            return  # our own changes are already applied here
        router = self.router
        match event:
            case wire.RouteAdded(_, cid, topic_filter, sub):
                router.add(cid, topic_filter, sub)
            case wire.RouteRemoved(_, cid, topic_filter):
                router.remove(cid, topic_filter)
            case wire.SessionEnded(_, cid):
                if self.sessions.session_of(cid) is None:
                    router.remove_client(cid)
            case wire.RetainedChanged(_, msg):
                self.retained.put(msg)

    def _on_node_message(self, m: wire.NodeMessage) -> None:
        match m:
            case wire.Wake(cid):
                self.wake(cid)
            case wire.Handover(cid, clean_start, requester, request):
                self._on_handover(cid, clean_start, requester, request)
            case wire.HandedOver(request):
                fut = self._handovers.get(request)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case wire.Kick(cid, epoch):
                self.sessions.fenced(cid, epoch)
            case wire.Ask(requester, request, body):
                self._on_ask(requester, request, body)
            case wire.Answer(request, body):
                got = self._asks.get(request)
                if got is not None and not got.done():
                    got.set_result(body)


async def _close(pubsub: PubSub) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated in redis-py
