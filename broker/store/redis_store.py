"""The Redis session store: sessions a fleet of nodes shares, so a client resumes on any node.

Layout: every key of one session carries the hash tag ``{client_id}`` (one Redis Cluster slot):
``fmq:{cid}:m`` meta hash (epoch, node, zone, limits), ``:s`` subscriptions (filter -> options; the
fleet's route table), ``:q`` deliveries queued for it by other nodes, ``:i`` the journal of its
deliveries (message id -> order, packet id, stage, message: the Inflight Window and the Message Queue),
``:r`` incoming QoS2 packet ids awaiting PUBREL. Fleet-wide: ``fmq:retained``.

Multi-key changes of a session are Lua scripts fenced by the session's epoch: a node whose epoch is stale
(the session was taken over meanwhile) cannot write. Claiming and pulling move ``:q`` into ``:i`` inside
the script, so a delivery is always in Redis until its client acknowledges it. Sessions that wait for
their client carry a TTL of their expiry interval, so Redis deletes them when they expire, whichever
node is alive. Every write of one event-loop turn goes to Redis as one pipeline (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..config import RedisStoreConfig
from ..journal import JournalChanges
from ..message import Delivery, Message, Will
from ..router import Subscription
from ..session import Session
from ..zones import ZoneSettings
from . import keys, wire
from .base import (
    Claimed,
    ClaimOutcome,
    CommitResult,
    Discard,
    Enqueue,
    Op,
    Retain,
    Route,
    Save,
    SessionDetail,
    SessionInfo,
    SessionStore,
    StoredSession,
)
from .connections import Shard, StoreConnections, in_transition, redirected
from .scripts import lua
from .wire import (
    journal_field,
    journal_value,
    pack_delivery,
    pack_message,
    pack_sub,
    unpack_delivery,
    unpack_journal,
    unpack_message,
    unpack_sub,
)

log = logging.getLogger("fleetmq.redis")

SCAN_BATCH = 1000  # keys per SCAN, and sessions per pipelined read of the management API
CHUNK = 512  # values per HSET/RPUSH call inside scripts (Lua's unpack() has a limit)
#: error replies that say Redis did not run a command for a passing reason: a replica now (a failover), out of
#: memory, a cluster slot moving or a shard without its primary (loading its data comes as a connection
#: error); and those redis-py leaves unparsed: a slow script running, too few replicas
_TRANSIENT = (
    RedisConnectionError | RedisTimeoutError | OSError | TimeoutError
    | ReadOnlyError | OutOfMemoryError | TryAgainError | ClusterDownError
)  # fmt: skip
_TRANSIENT_CODES = ("BUSY ", "NOREPLICAS ")


# -- scripts ---------------------------------------------------------------------------------------
_PRELUDE = lua("prelude")


# What the scripts' @NAME@ placeholders stand for: values from their modules. Channels come as keys (the
# session's, keys.Channels.of_session): on a Redis Cluster they are in the session's slot, as Redis
# requires of everything a script touches.
_SUBSTITUTIONS = {
    "@ID_LEN@": str(wire.DELIVERY_ID_LEN),
    "CHUNK_N": str(CHUNK),
}


def _script(body: str, channels: keys.Channels = keys.Channels(sharded=False)) -> str:
    text = wire.LUA_PRELUDE + _PRELUDE + body
    for name, value in {**_SUBSTITUTIONS, "@PUBLISH@": f"'{channels.publish}'"}.items():
        text = text.replace(name, value)
    assert "@" not in text, "a script placeholder without a value"
    return text


# The scripts, each in lua/<name>.lua with its KEYS and ARGV described at its top.
SCRIPTS = {
    name: lua(name)
    for name in (
        "claim",
        "journal",
        "park",
        "enqueue",
        "discard",
        "route",
        "pull",
        "owner",
        "will",
        "reap",
        "takewill",
        "reassert",
        "claimed",
        "abandon",
        "conntake",
        "connfree",
        "listed",
    )
}


def _stored_will(packed: bytes | None, zone: bytes | None, username: bytes | None) -> Will | None:
    """A will read back from a session's meta. A session stored before zones and usernames were kept
    with it is judged by the "default" zone's rules."""
    if not packed:
        return None
    return Will(
        unpack_message(packed),
        zone.decode() if zone else "default",
        username.decode() if username is not None else None,
    )


def raw(value: bytes | str) -> bytes:
    """A reply value as bytes (the client never decodes replies; redis-py's types allow both)."""
    return value if isinstance(value, bytes) else value.encode()


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Guards:
    """The publisher sessions whose epochs a script checks before it queues what they routed
    (Message.sender_epoch): numbered from 1 in the order first met; 0 is no guard. Not `enabled` on a
    Redis Cluster, where those sessions live in other slots than the script's."""

    __slots__ = ("_numbers", "enabled")

    def __init__(self, enabled: bool = True) -> None:
        self._numbers: dict[tuple[str, int], int] = {}
        self.enabled = enabled

    def of(self, d: Delivery) -> int:
        msg = d.msg
        if not msg.sender_epoch or not self.enabled:
            return 0
        numbers = self._numbers
        return numbers.setdefault((msg.sender, msg.sender_epoch), len(numbers) + 1)

    @property
    def keys(self) -> list[str]:
        return [keys.session_keys(cid)[keys.META] for cid, _epoch in self._numbers]

    def publishers(self, numbers: Iterable[Any]) -> list[tuple[str, int]]:
        """The publisher sessions (client id, epoch) of these guard numbers."""
        by_number = {n: publisher for publisher, n in self._numbers.items()}
        return [by_number[int(n)] for n in numbers]

    @property
    def args(self) -> list[Any]:
        return [len(self._numbers), *(str(epoch) for _cid, epoch in self._numbers)]


def clock_offset() -> float:
    """Wall-clock time minus the event loop's clock. Times a session keeps (when an awaiting-PUBREL
    record was received) are the loop's, a monotonic clock of this host; the store keeps them as
    wall-clock times, which mean the same on every node of the fleet."""
    return time.time() - asyncio.get_running_loop().time()


#: a stored time below this is a monotonic one, as earlier nodes stored them (seconds since their host
#: booted, not since 1970): its age cannot be told here, so it counts as received now
_WALL_CLOCK_FROM = 1e9


def rel_value(wall: float, receipt: int) -> str:
    """An awaiting-PUBREL record as stored: the wall-clock time received, then ":<receipt>" if any."""
    return f"{wall:.3f}:{receipt}" if receipt else f"{wall:.3f}"


def parse_rel_value(value: bytes, wall_offset: float) -> tuple[float, int]:
    """(time received on the event loop's clock, receipt) of a stored awaiting-PUBREL record."""
    ts, _, receipt = value.partition(b":")
    wall = float(ts)
    if wall < _WALL_CLOCK_FROM:
        wall = time.time()
    return wall - wall_offset, int(receipt or 0)


def _received(rel: dict[int, tuple[float, int] | None]) -> Iterable[tuple[int, tuple[float, int]]]:
    return ((pid, v) for pid, v in rel.items() if v is not None)


def _pairs(flat: list[bytes]) -> Iterable[tuple[bytes, bytes]]:
    it = iter(flat)
    return zip(it, it, strict=True)


def _receipt(text: str) -> tuple[str, int]:
    """A receipt as a meta field names it: <publisher incarnation>:<number>."""
    incarnation, _, number = text.rpartition(":")
    return incarnation, int(number)


class NotReplicated(RedisConnectionError):
    """A write ran on the primary but fewer replicas than `wait_replicas` confirmed it in time: like a
    lost reply, its outcome is unknown to the fleet (a failover may still lose it)."""


@dataclass(slots=True)
class _Call:
    """One command of a round trip, routed by `key` (its slot picks the shard); `add` puts it on a
    pipeline."""

    key: str
    add: Callable[[Pipeline], Any]


class RedisStore(SessionStore):
    durable = True

    def __init__(
        self, conns: StoreConnections, node_id: str, wait_replicas: int = 0, wait_timeout_ms: int = 1000
    ) -> None:
        self.conns = conns
        self.channels = conns.channels
        self.node_id = node_id
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._scripts = {name: _script(body, self.channels) for name, body in SCRIPTS.items()}
        self._sha = {name: hashlib.sha1(body.encode()).hexdigest() for name, body in self._scripts.items()}
        self.round_trips: dict[str, int] = {}  # per shard (its primary's address)
        self.retries = 0  # operations run again on a fresh connection, or after reloading the scripts

    @classmethod
    def from_config(cls, cfg: RedisStoreConfig, node_id: str) -> RedisStore:
        conns = StoreConnections(cfg, f"fleetmq:{node_id}")
        return cls(conns, node_id, cfg.wait_replicas, cfg.wait_timeout_ms)

    @classmethod
    def from_url(cls, url: str, node_id: str, wait_replicas: int = 0) -> RedisStore:
        return cls.from_config(RedisStoreConfig(kind="redis", url=url, wait_replicas=wait_replicas), node_id)

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        return not self.conns.sharded

    @property
    def redis(self) -> aioredis.Redis:
        """The client of a store that is one Redis (a cluster has one per shard: conns.shard_for)."""
        return self.conns.redis

    async def open(self) -> None:
        await self.conns.open()
        for shard in self.conns.shards:
            await self._load_scripts(shard)

    async def _load_scripts(self, shard: Shard) -> None:
        """Load every script once, so pipelines carry bare EVALSHAs (no SCRIPT EXISTS round trip)."""
        pipe = shard.redis.pipeline(transaction=False)
        for body in self._scripts.values():
            pipe.script_load(body)
        await pipe.execute()

    def _script(self, script: str, script_keys: list[str], args: list[Any]) -> _Call:
        sha = self._sha[script]
        return _Call(script_keys[0], lambda pipe: pipe.evalsha(sha, len(script_keys), *script_keys, *args))

    # -- round trips ------------------------------------------------------------------------------
    async def _send(
        self, calls: list[_Call], *, atomic: bool = False, may_repeat: bool = False, write: bool = True
    ) -> list[Any]:
        """Run `calls` in one round trip to each shard they touch (in parallel); their replies in order.

        `atomic`: on one Redis the calls are one MULTI/EXEC transaction, which Redis (its AOF, its
        replicas) keeps whole or not at all, so a write cut off halfway cannot leave half a batch behind;
        on a Redis Cluster each slot's calls are one (a transaction cannot span slots).

        `write`: with `wait_replicas`, a WAIT follows on each shard's connection, and fewer confirmations
        than asked raise NotReplicated: a claim, a pull, a commit is relied upon only once a failover
        cannot lose it.

        `may_repeat`: running the calls twice does no harm, so a connection found dead (Redis restarted,
        the pool's connections reset) is retried once on a fresh one instead of failing the caller.

        Calls a cluster shard redirects (its slot moved: they did not run) are sent again once the map is
        read again; an error reply is returned in the call's place; a lost connection raises (the outcome
        of what was sent is unknown)."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(4):
            groups: dict[Shard, list[int]] = {}
            for i in todo:
                groups.setdefault(self.conns.shard_for(calls[i].key), []).append(i)
            results = await asyncio.gather(
                *(self._send_shard(shard, [calls[i] for i in idx], atomic, may_repeat, write)
                  for shard, idx in groups.items()),
                return_exceptions=True,
            )  # fmt: skip
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                if isinstance(failure, RedisConnectionError | OSError) and self.conns.sharded:
                    self._refresh_soon()  # (a shard went away: maybe a replica took over)
                raise failure
            todo = []
            for idx, got in zip(groups.values(), results, strict=True):
                assert isinstance(got, list)
                for i, reply in zip(idx, got, strict=True):
                    replies[i] = reply
                    if redirected(reply):
                        todo.append(i)
            if not todo:
                return replies
            if attempt < 3:
                self.retries += 1
                await self.conns.refresh()
                if in_transition(replies[todo[0]]):
                    await asyncio.sleep(0.1 * (attempt + 1))
        return replies  # (still redirected: the callers see the error replies)

    async def _send_shard(
        self, shard: Shard, calls: list[_Call], atomic: bool, may_repeat: bool, write: bool
    ) -> list[Any]:
        """One pipeline to one shard: the calls (in MULTI/EXEC blocks if atomic), then WAIT. The replies
        come in the order of `calls`, whatever the order of the blocks."""
        blocks: list[list[int]]  # indexes into calls
        if not atomic:
            blocks = [[i] for i in range(len(calls))]
        elif self.conns.sharded:
            by_slot: dict[int, list[int]] = {}
            for i, c in enumerate(calls):
                by_slot.setdefault(keys.slot_of(c.key), []).append(i)
            blocks = list(by_slot.values())
        else:
            blocks = [list(range(len(calls)))]
        wait = self.wait_replicas if write else 0
        for reload in (False, True):
            pipe: Pipeline = shard.redis.pipeline(transaction=False)
            for block in blocks:
                if atomic:
                    pipe.execute_command("MULTI")
                for i in block:
                    calls[i].add(pipe)
                if atomic:
                    pipe.execute_command("EXEC")
            if wait:
                pipe.wait(wait, self.wait_timeout_ms)
            try:
                raw_replies = await pipe.execute(raise_on_error=False)
            except RedisConnectionError:
                # Redis went away (restarted? failed over?): the pool's idle connections are dead too, and
                # each would fail the next operation that picks it up. Drop them; the caller decides
                # about this one.
                await shard.redis.connection_pool.disconnect(inuse_connections=False)
                if not may_repeat:
                    raise
                self.retries += 1
                may_repeat = False
                continue
            self.round_trips[shard.address] = self.round_trips.get(shard.address, 0) + 1
            if wait:
                acked = raw_replies.pop()
                if isinstance(acked, Exception) or int(acked) < wait:
                    raise NotReplicated(f"{acked} of {wait} Redis replicas confirmed the write in time")
            out: list[Any] = [None] * len(calls)
            pos = 0
            for block in blocks:
                if not atomic:
                    out[block[0]] = raw_replies[pos]
                    pos += 1
                    continue
                got = raw_replies[pos : pos + len(block) + 2]
                pos += len(block) + 2
                for i, reply in zip(block, self._exec_replies(got, len(block)), strict=True):
                    out[i] = reply
            if not reload and any(isinstance(r, NoScriptError) for r in out):
                # the scripts that failed did nothing; everything else in a batch is idempotent
                log.info("Redis lost its scripts (restarted? failed over?); loading them again")
                self.retries += 1
                await self._load_scripts(shard)
                continue
            for r in out:
                if isinstance(r, Exception) and not isinstance(r, ResponseError):
                    raise r
            return out
        raise RedisConnectionError("the shard's connection failed twice")

    @staticmethod
    def _exec_replies(replies: list[Any], n: int) -> list[Any]:
        """The results of the `n` commands of a MULTI/EXEC block (MULTI's, QUEUED's and EXEC's replies).
        A block that a cluster shard redirected, or that Redis refused while queueing, did not run: every
        command gets that reply."""
        executed = replies[-1]
        queued = [r for r in replies[:-1] if isinstance(r, Exception)]
        if isinstance(executed, list):
            return executed
        if queued:
            return [queued[0]] * n  # refused while queueing (EXEC aborted the whole transaction)
        if isinstance(executed, Exception):
            raise executed
        raise ConnectionError(f"the transaction did not run (EXEC replied {executed!r})")

    def _refresh_soon(self) -> None:
        async def refresh() -> None:
            with contextlib.suppress(Exception):
                await self.conns.refresh()

        asyncio.get_running_loop().create_task(refresh())

    def transient(self, error: Exception) -> bool:
        return isinstance(error, _TRANSIENT) or (
            isinstance(error, ResponseError) and str(error).startswith(_TRANSIENT_CODES)
        )

    async def drop_idle_connections(self) -> None:
        """Close the pool's idle connections (after Redis was away they are dead, and the next operation to
        pick one would fail with an outcome it cannot know)."""
        for shard in self.conns.shards:
            await shard.redis.connection_pool.disconnect(inuse_connections=False)

    async def close(self) -> None:
        await self.conns.close()

    # -- what scripts of a session take ----------------------------------------------------------
    def _session(self, client_id: str, parts: slice = slice(None), events: bool = False) -> list[str]:
        """A session's keys (those of `parts`), and its events channel if the script publishes events."""
        k = keys.session_keys(client_id)[parts]
        return [*k, self.channels.of_session(client_id)[0]] if events else k

    @staticmethod
    def _sadd(key: str, member: str) -> _Call:
        return _Call(key, lambda pipe: pipe.sadd(key, member))

    def _wakes(self, client_id: str) -> str:
        return self.channels.of_session(client_id)[1]

    def _guards(self) -> _Guards:
        """The publisher guards of a routing: none on a Redis Cluster (their sessions are in other slots)."""
        return _Guards(enabled=not self.conns.sharded)

    # -- sessions --------------------------------------------------------------------------------
    async def claim(
        self,
        client_id: str,
        zone: ZoneSettings,
        zone_name: str,
        clean_start: bool,
        will: Message | None = None,
        will_delay: float = 0.0,
        expiry: float = 0.0,
        username: str | None = None,
        token: str = "",
    ) -> Claimed:
        """Take ownership of a session for this node (epoch + 1); returns its stored state. Sent again
        (its reply lost), the same claim (`token`) gets the same answer and does nothing twice."""
        packed_will = pack_message(will) if will is not None else b""
        args = [
            self.node_id,
            "1" if clean_start else "0",
            client_id,
            packed_will,
            repr(will_delay),
            repr(expiry),
            zone_name,
            username or "",
            "0" if username is None else "1",
            os.urandom(8).hex(),  # (the incarnation, if the claim creates the session)
            token or os.urandom(8).hex(),
        ]
        mine = keys.node_sessions(self.node_id)
        calls = [
            self._script("claim", self._session(client_id, events=True), args),
            self._sadd(mine, client_id),  # so that, should this node die, others find it
        ]
        res = (await self._send(calls, atomic=True, may_repeat=True))[0]
        if isinstance(res, Exception):
            raise res
        epoch = int(res[0])
        if int(res[1]) != 2:
            ended_will = _stored_will(res[4], res[5], res[6])
            return Claimed(
                epoch,
                discarded=int(res[1]) == 1,
                previous=res[3].decode() or None,
                ended_will=ended_will,
                incarnation=res[7].decode(),
            )
        meta = {k.decode(): v for k, v in _pairs(res[3])}
        wall = clock_offset()
        awaiting = []
        for pid, value in _pairs(res[6]):
            ts, receipt = parse_rel_value(value, wall)
            awaiting.append((int(pid), ts, receipt))
        stored = StoredSession(
            expiry_interval=float(meta.get("expiry", b"0")),
            next_pid=int(meta.get("next_pid", b"1")),
            order=int(meta.get("order", b"0")),
            subscriptions=[(f.decode(), unpack_sub(o)) for f, o in _pairs(res[4])],
            deliveries=[unpack_journal(v) for _k, v in _pairs(res[5])],
            awaiting_rel=awaiting,
            incarnation=meta.get("inc", b"").decode(),
            received=int(meta.get("rcv", b"0")),
            seen={k[2:]: int(v) for k, v in meta.items() if k.startswith("x:")},
            twins={_receipt(k[2:]): wire.unpack_id(v) for k, v in meta.items() if k.startswith("d:")},
        )
        return Claimed(epoch, stored=stored, previous=res[2].decode() or None)

    async def commit(self, ops: list[Op]) -> CommitResult:
        # Deliveries for one session in this batch travel in one script call, at its first one's place.
        enqueues: dict[str, list[Enqueue]] = {}
        for op in ops:
            if isinstance(op, Enqueue):
                enqueues.setdefault(op.client_id, []).append(op)
        calls: list[_Call] = []
        kinds: list[Op | list[Enqueue] | None] = []  # what each call's reply belongs to
        guarded: dict[int, _Guards] = {}  # call index -> the publisher guards it checks
        mine = keys.node_sessions(self.node_id)

        def forget_here(cid: str) -> None:
            calls.append(_Call(mine, lambda pipe: pipe.srem(mine, cid)))
            kinds.append(None)

        for op in ops:
            if isinstance(op, Enqueue):
                group = enqueues[op.client_id]
                if group[0] is not op:
                    continue
                guards = self._guards()
                items: list[Any] = []
                for e in group:
                    d = e.delivery
                    inc, number = d.msg.receipt or ("", 0)
                    items += [pack_delivery(d), str(d.qos), guards.of(d), inc, number]
                k = keys.session_keys(op.client_id)
                script_keys = [k[0], k[2], self._wakes(op.client_id), *guards.keys]
                guarded[len(calls)] = guards
                calls.append(self._script("enqueue", script_keys, [op.client_id, *guards.args, *items]))
                kinds.append(group)
                continue
            if isinstance(op, JournalChanges):
                k = keys.session_keys(op.client_id)
                guards = self._guards()
                jkeys, args = self._journal_args(op, guards)
                guarded[len(calls)] = guards
                calls.append(
                    self._script("journal", [k[0], k[3], k[4], k[2], self._wakes(op.client_id), *jkeys], args)
                )
            elif isinstance(op, Save):
                cid = op.session.client_id
                calls.append(self._script("park", keys.session_keys(cid), self._park_args(op)))
            elif isinstance(op, Discard):
                args = [str(op.epoch) if op.epoch else "", self.node_id, op.client_id]
                calls.append(self._script("discard", self._session(op.client_id, events=True), args))
            elif isinstance(op, Route):
                packed = pack_sub(op.sub) if op.sub is not None else b""
                args = [str(op.epoch), op.topic_filter, packed, self.node_id, op.client_id]
                calls.append(self._script("route", self._session(op.client_id, slice(2), events=True), args))
            elif isinstance(op, Retain):
                calls += self._retain(op.msg)
                kinds.append(None)
            kinds.append(op)
            if isinstance(op, Discard) or (isinstance(op, Save) and op.will is None):
                forget_here(op.client_id if isinstance(op, Discard) else op.session.client_id)
                # (a session parked with a will waiting stays this node's until the will is out)

        replies = await self._send(calls, atomic=True)
        result = CommitResult()
        for n, (kind, reply) in enumerate(zip(kinds, replies, strict=True)):
            if isinstance(reply, Exception):
                raise reply
            if isinstance(kind, list):
                if reply == -1:
                    result.missing.extend(kind)
                elif isinstance(reply, list):
                    zone, cid = reply[1].decode(), kind[0].client_id
                    if int(reply[0]):
                        result.dropped.append((zone, cid, int(reply[0])))
                    if int(reply[2]):
                        result.skipped_qos0.append((zone, cid, int(reply[2])))
                    if int(reply[3]):
                        result.refused += int(reply[3])
                        result.refused_from.update(guarded[n].publishers(reply[4]))
            elif isinstance(kind, Route) and reply == -1:
                result.fenced.append((kind.client_id, kind.epoch))
            elif isinstance(kind, JournalChanges) and reply != 1:
                if int(reply[0]):  # stored, but what fenced publishers routed into it was refused
                    result.refused_from.update(guarded[n].publishers(reply[1]))
                    continue
                result.fenced.append((kind.client_id, kind.epoch))
                dropped, zone, refused = int(reply[1]), reply[2].decode(), int(reply[3])
                result.rerouted += int(reply[4])
                result.refused += refused
                result.refused_from.update(guarded[n].publishers(reply[5]))
                if dropped:
                    result.dropped.append((zone, kind.client_id, dropped))
        return result

    def _retain(self, msg: Message) -> list[_Call]:
        """Set or clear a topic's retained message in its bucket, and tell the fleet (on the bucket's
        slot's events channel)."""
        bucket, packed = keys.retained_bucket(msg.topic), pack_message(msg)
        event = wire.retained_changed(self.node_id, packed)
        channel = self.channels.events(keys.slot_of(bucket))
        publish = self.channels.publish
        if msg.payload:
            store = _Call(bucket, lambda pipe: pipe.hset(bucket, msg.topic, packed))
        else:
            store = _Call(bucket, lambda pipe: pipe.hdel(bucket, msg.topic))
        return [store, _Call(bucket, lambda pipe: pipe.execute_command(publish, channel, event))]

    @staticmethod
    def _journal_args(op: JournalChanges, guards: _Guards) -> tuple[list[str], list[Any]]:
        """The JOURNAL script's guard keys and arguments for one session's changes."""
        puts = [(mid, d) for mid, d in op.deliveries.items() if d is not None]
        dels = [mid for mid, d in op.deliveries.items() if d is None]
        wall = clock_offset()
        rputs = [(pid, rel_value(ts + wall, receipt)) for pid, (ts, receipt) in _received(op.rel)]
        rdels = [pid for pid, ts in op.rel.items() if ts is None]
        body: list[Any] = [len(puts)]
        fresh: list[Any] = []
        new = set(op.fresh) if op.fresh else ()
        unchecked = op.unchecked_from
        for n, (mid, d) in enumerate(puts, 1):
            body += [journal_field(mid), journal_value(d)]
            if mid in new and d.qos:  # (QoS 0 is best effort: not queued again)
                inc, number = d.msg.receipt or ("", 0)
                checked = unchecked is None or d.order < unchecked
                fresh += [n, guards.of(d), inc, number, int(checked)]
        body.append(len(dels))
        body += [journal_field(mid) for mid in dels]
        body.append(len(rputs))
        for pid, value in rputs:
            body += [pid, value]
        body.append(len(rdels))
        body += rdels
        seen = op.seen or {}
        body.append(len(seen))
        for inc, number in seen.items():
            body += [inc, number]
        body.append(len(fresh) // 5)
        body += fresh
        body.append("" if op.hold is None else op.hold)
        head = [str(op.epoch), op.next_pid, op.order, op.client_id, op.received, *guards.args]
        return guards.keys, head + body

    @staticmethod
    def _park_args(op: Save) -> list[Any]:
        s, z = op.session, op.session.zone
        meta = {
            "zone": s.zone_name,
            "expiry": repr(s.expiry_interval),
            "next_pid": s.next_pid,
            "order": s.order,
            "maxq": z.max_mqueue_len,
            "qnew": int(z.mqueue_overflow == "dropNew"),
            "maxb": z.max_mqueue_bytes,
            "qos0": int(z.mqueue_store_qos0),
            "online": 0,
            "node": "",
        }
        if op.will is not None:
            meta["will"] = pack_message(op.will)
            meta["will_at"] = f"{op.will_at:.3f}"
        args: list[Any] = [str(s.epoch), int(op.ttl * 1000), len(meta)]
        for k, v in meta.items():
            args += [k, v]
        return args

    async def set_will(self, s: Session, will: Message | None, will_delay: float) -> None:
        packed = pack_message(will) if will is not None else b""
        args = [str(s.epoch), packed, repr(will_delay), repr(s.expiry_interval)]
        (reply,) = await self._send([self._script("will", self._session(s.client_id, slice(1)), args)])
        if isinstance(reply, Exception):
            raise reply

    async def reap(
        self, dead: str, client_ids: list[str], token: str
    ) -> list[tuple[str, Will | None, float, float, int]]:
        """Let go of the sessions of a dead node: (client id, will, will_at, expiry, kind: REAP's). Sent
        again with the same `token` (its reply lost), the same answer."""
        now = f"{time.time():.3f}"
        calls = [
            self._script("reap", self._session(cid, events=True), [dead, self.node_id, cid, token, now])
            for cid in client_ids
        ]
        out = []
        for cid, r in zip(client_ids, await self._send(calls), strict=True):
            if isinstance(r, Exception):
                raise r
            if r:
                out.append((cid, _stored_will(r[0], r[4], r[5]), float(r[1]), float(r[2]), int(r[3])))
        return out

    async def take_will(self, client_id: str, will_at: float, token: str = "") -> Will | None:
        """The will due at `will_at`, if it is still due (exactly one caller gets it; the same `token`
        asking again, its reply lost, gets it again)."""
        mine = keys.node_sessions(self.node_id)
        calls = [
            self._script(
                "takewill",
                self._session(client_id, slice(1)),
                [f"{will_at:.3f}", token or os.urandom(8).hex()],
            ),
            _Call(mine, lambda pipe: pipe.srem(mine, client_id)),
        ]
        raw_will = (await self._send(calls, atomic=True))[0]
        if isinstance(raw_will, Exception):
            raise raw_will
        return _stored_will(*raw_will) if raw_will else None

    async def reassert(self, owned: list[tuple[str, int, Message | None, float]]) -> list[int]:
        """After losing Redis: for each session connected here ((client id, epoch, will, will delay)),
        1 still ours, 2 taken back (the fleet had released it), 0 gone (ended, or someone else's now)."""
        mine = keys.node_sessions(self.node_id)
        calls = []
        for cid, epoch, will, delay in owned:
            packed = pack_message(will) if will is not None else b""
            args = [str(epoch), self.node_id, packed, repr(delay)]
            calls.append(self._script("reassert", keys.session_keys(cid), args))
            calls.append(self._sadd(mine, cid))
        out = []
        for r in (await self._send(calls))[::2]:
            if isinstance(r, Exception):
                raise r
            out.append(int(r))
        return out

    async def claimed(self, client_id: str, token: str) -> ClaimOutcome:
        """Whether a claim whose reply never came ran, and what it ended (read, nothing changed)."""
        script = self._script("claimed", self._session(client_id, slice(1)), [token])
        (r,) = await self._send([script], may_repeat=True, write=False)
        if isinstance(r, Exception):
            raise r
        if not int(r[0]):
            return ClaimOutcome(ran=False)
        return ClaimOutcome(ran=True, discarded=int(r[1]) == 1, ended_will=_stored_will(r[2], r[3], r[4]))

    async def abandon(self, client_id: str, token: str) -> None:
        """Undo what a claim left that its client never got (idempotent)."""
        args = [token, self.node_id, client_id]
        (r,) = await self._send(
            [self._script("abandon", self._session(client_id, events=True), args)], may_repeat=True
        )
        if isinstance(r, Exception):
            raise r

    async def take_connection(
        self,
        zone: str,
        username: str,
        client_id: str,
        instance: str,
        limit: int,
        live: Collection[str],
        dead: Collection[str] = (),
        last: bool = False,
    ) -> bool | list[str]:
        args = [client_id, instance, limit, int(last), len(live), *live, *dead]
        call = self._script("conntake", [keys.user_connections(zone, username)], args)
        (r,) = await self._send([call], may_repeat=True)
        if isinstance(r, Exception):
            raise r
        if int(r[0]) < 0:
            return [text(i) for i in r[1:]]
        return int(r[0]) == 1

    async def free_connection(self, zone: str, username: str, client_id: str, instance: str) -> None:
        call = self._script("connfree", [keys.user_connections(zone, username)], [client_id, instance])
        (r,) = await self._send([call], may_repeat=True)
        if isinstance(r, Exception):
            raise r

    async def owner(self, client_id: str) -> str | None:
        """The node the client is connected to, if any (from the session's meta)."""
        (node,) = await self._send(
            [self._script("owner", self._session(client_id, slice(1)), [])], may_repeat=True, write=False
        )
        if isinstance(node, Exception):
            raise node
        return node.decode() if node else None

    async def pull(self, targets: list[tuple[str, int, int]], n: int) -> list[Any]:
        """Queued deliveries of sessions connected here ((client id, epoch, first order reserved, or -1
        when not journaled) each): per session -1 where this node was fenced, else [first order, items]."""
        calls = []
        for cid, epoch, first in targets:
            k = keys.session_keys(cid)
            calls.append(
                self._script("pull", [k[0], k[2], k[3]], [str(epoch), n, int(first >= 0), max(first, 0)])
            )
        replies = await self._send(calls)
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return replies

    # -- fleet-wide state loaded at start -------------------------------------------------------
    async def load_routes(self) -> list[tuple[str, str, Subscription]]:
        """Every subscription of every session in Redis: the fleet's route table."""
        out = []
        for shard in self.conns.shards:
            async for key in shard.redis.scan_iter(match=keys.SUBSCRIPTIONS_PATTERN, count=1000):
                cid = keys.client_of_subscriptions_key(text(key))
                for f, o in (await shard.redis.hgetall(key)).items():
                    out.append((cid, text(f), unpack_sub(raw(o))))
        return out

    async def load_retained(self) -> list[Message]:
        """Every retained message (those still in the old single hash moved into their buckets first)."""
        old = self.conns.shard_for(keys.RETAINED).redis
        for value in (await old.hgetall(keys.RETAINED)).values():
            msg = unpack_message(raw(value))
            await self._send(self._retain(msg)[:1], may_repeat=True)
            await old.hdel(keys.RETAINED, msg.topic)
        out = []
        for bucket in keys.retained_buckets():
            values = await self.conns.shard_for(bucket).redis.hvals(bucket)
            out += [unpack_message(raw(v)) for v in values]
        return out

    def offline_sessions(self) -> list[Session]:
        return []

    async def sessions(self) -> list[SessionInfo]:
        """Every session in Redis: SCAN over each shard's meta keys, then one script call per session (its
        fields and sizes in one reply), pipelined a batch at a time: read only, not a round trip per
        session, and a fifth of the replies five commands a session would take."""
        out: list[SessionInfo] = []
        for shard in self.conns.shards:
            batch: list[str] = []
            async for key in shard.redis.scan_iter(match=keys.META_PATTERN, count=SCAN_BATCH):
                batch.append(keys.client_of_meta_key(text(key)))
                if len(batch) >= SCAN_BATCH:
                    out += await self._infos(batch)
                    batch = []
            if batch:
                out += await self._infos(batch)
        return out

    async def _infos(self, cids: list[str]) -> list[SessionInfo]:
        replies = await self._send(
            [self._script("listed", self._session(cid), []) for cid in cids], may_repeat=True, write=False
        )
        out = []
        for cid, reply in zip(cids, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if not reply:  # (ended between the SCAN and the read, or kept only for its will)
                continue
            node, zone, user, expiry, subs, kept, rel = reply
            out.append(SessionInfo(
                cid, text(zone), text(user) if user is not None else None, text(node), float(expiry),
                int(subs), int(kept), int(rel),
            ))  # fmt: skip
        return out

    async def session(self, client_id: str, limit: int = 100) -> SessionDetail | None:
        m, s, q, i, r = keys.session_keys(client_id)
        shard = self.conns.shard_for(m)
        pipe = shard.redis.pipeline(transaction=False)
        pipe.hmget(m, "node", "online", "zone", "user", "expiry", "gone")
        pipe.hgetall(s)
        pipe.hvals(i)
        pipe.lrange(q, 0, limit - 1)
        pipe.llen(q)
        pipe.hlen(r)
        (node, online, zone, user, expiry, gone), subs, journal, queued, queue_len, rel = await pipe.execute()
        if zone is None or gone:
            return None
        kept = sorted((unpack_journal(raw(v)) for v in journal), key=lambda d: d.order)
        kept += [unpack_delivery(raw(v)) for v in queued][: max(0, limit - len(kept))]
        info = SessionInfo(
            client_id, text(zone), text(user) if user is not None else None,
            text(node) if online == b"1" and node else "", float(expiry or 0),
            len(subs), len(journal) + int(queue_len), int(rel),
        )  # fmt: skip
        subscriptions = sorted((text(f), unpack_sub(raw(o))) for f, o in subs.items())
        return SessionDetail(info, subscriptions, kept[:limit])
