"""The event log: flat delivery records appended to a fleet's Redis Streams, the PySpark pipeline's input.

The log is ``keys.EVENT_PARTITIONS`` streams (``keys.event_streams``) whose slots sit evenly over a Redis
Cluster's primaries, so no one slot carries the fleet's event traffic. A record goes to its message's
partition (msg_id: a message's publish_in, deliver, ack and retransmit records, written by any node, share
a stream, each node's in the order it wrote them), or, when it has no message, its client's (connect,
disconnect, takeover...); zone_config records go to their node's. On a single Redis (or Sentinel's
primary) all partitions live on the one server: the same code path.

The data path only formats one tuple and appends it to a list (``EventLog.emit``: no I/O, no logging); a
background task sends the buffer every ``interval`` seconds, or as soon as it holds ``batch`` records: one
EVAL per partition the batch touches, whose script splits each record and XADDs it (``MAXLEN ~`` the
partition's share of ``max_len``), and the EVALs of the partitions one shard serves pipelined in a single
round trip, the shards in parallel: one argument per record and one reply per partition, where a pipeline
of XADDs costs the event loop about ten times more packing and a reply to parse per record. The log has
its own connection to each shard, so a slow batch never delays session-store writes. An EVAL a cluster
shard redirects (MOVED: its slot moved, so it did not run) is sent again once the map is read again
(``StoreConnections.refresh``).

Overload: the buffer holds at most ``max_buffer`` records; past that, and for records whose send failed
while Redis (a shard) is slow or down, records are dropped and counted (``dropped``), never waited for.

Exactly once: the records of a failed send are retried while they fit in the buffer, and a send whose
reply was lost (it may have run) is idempotent. Each record carries its log's seq (eid = run + seq); next
to each partition stream the script keeps, in the same slot and the same call, the highest seq it stored
there for this run (``<stream>:stored:<run>``, zone_config records their own), and skips records at or
below it. That mark is right because a partition's records are sent in seq order: once a partition's send
failed, its later records wait for the next flush, behind the retried ones. A mark lives ``MARK_TTL``
after its run's last batch; records are retried for at most half that, then dropped and counted. The
pipeline still drops repeated eids (records older brokers resent).

Sampling (``sample`` < 1) keeps the per-message events (``SAMPLED_EVENTS``) of a deterministic subset of
message ids, the same subset on every node, so a sampled message keeps its publish_in, deliver, ack and
retransmit records together and joins on msg_id stay exact. Other events are always kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import RedisError, ResponseError

from .eventschema import (
    FIELDS,
    SAMPLE_ALL,
    SAMPLE_MASK,
    SAMPLE_MIX,
    SAMPLED_EVENTS,
    ZONE_CONFIG,
    client_hash,
    sample_threshold,
    sampled,
)
from .store import keys
from .store.connections import Shard, StoreConnections, in_transition, redirected

if TYPE_CHECKING:
    from .config import EventLogConfig
    from .zones import ZoneSettings

log = logging.getLogger("fleetmq.events")


# A buffered record is a tuple of the values of _RECORD (or _CONFIG_RECORD); eid is run + seq, node is the
# same for every record of a log. Formatting is left to Redis: the data path only builds the tuple.
_RECORD = ("seq", "ts_ms", "zone", "event", "client", *FIELDS[6:14])
_CONFIG_RECORD = ("seq", "ts_ms", "zone", "event", "max_inflight", "max_mqueue_len", "sample")

# XADD each record of a batch not stored yet. KEYS: the partition's stream, its mark for this run (the
# highest seq stored). ARGV: max_len, node, run, n, the mark's ttl, the n field names of a record, then the
# records' values one after the other (n each), in seq order: those at or below the mark (stored by a send
# whose reply was lost) are a prefix, skipped with one comparison each, and the rest cost what they did
# before marks. "" and "-1" mean absent and are left out of the entry; ts_ms comes as integer microseconds
# and is stored as milliseconds with three decimals. Returns the number stored now.
# (Values arrive as separate arguments: splitting packed strings in Lua cost Redis ~40 µs a record. Bytes:
# packed as they are, with no encoding per batch.)
_XADD_BATCH = b"""
local key, mark, maxlen, node, run = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
local first, last = 6 + n, #ARGV - n + 1
local done = tonumber(redis.call('GET', mark) or 0)
while first <= last and tonumber(ARGV[first]) <= done do first = first + n end
for a = first, last, n do
  local us = ARGV[a + 1]
  local fv = {'eid', run .. '-' .. ARGV[a], 'ts_ms', string.sub(us, 1, -4) .. '.' .. string.sub(us, -3),
              'node', node}
  for i = 2, n - 1 do
    local v = ARGV[a + i]
    if v ~= '' and v ~= '-1' then
      fv[#fv + 1] = ARGV[6 + i]
      fv[#fv + 1] = v
    end
  end
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fv))
end
if first > last then return 0 end
redis.call('SET', mark, ARGV[last], 'EX', ARGV[5])
return (last - first) / n + 1
"""
#: how long a run's marks outlive its last batch (s); its records are retried for at most half that
MARK_TTL = 86_400
_VALUE_TYPES = (str, int, float)
#: sends of one batch to the shard a cluster's map names, while shards answer MOVED (the map is changing)
_REDIRECT_TRIES = 4


def partition(msg_id: int, client: str) -> int:
    """A record's partition: its message's if it has one (msg_id >= 0; a node numbers its messages in
    sequence, so they spread evenly, sampled or not), else its client's (``client``: a client_hash)."""
    if isinstance(msg_id, int) and msg_id >= 0:
        return msg_id % keys.EVENT_PARTITIONS
    return int(client[:8], 16) % keys.EVENT_PARTITIONS


#: how often the overload cap re-estimates the offered rate (short: a burst is cut within this long)
ADAPT_INTERVAL = 0.25
_CLIENT_CACHE_MAX = 100_000


class EventLog:
    """One node's writer to its fleet's event log. ``await start()``, ``emit(...)`` from the data path,
    ``await stop()`` to send what is buffered (within ``timeout``) and close."""

    def __init__(
        self,
        redis: str | StoreConnections,
        *,
        fleet: str,
        node: str,
        max_len: int = 1_000_000,
        sample: float = 1.0,
        interval: float = 0.1,
        batch: int = 1000,
        max_buffer: int = 100_000,
        timeout: float = 2.0,
        config_interval: float = 300.0,
        max_rate: float = 0.0,
        offered: Callable[[], int] | None = None,
    ) -> None:
        if not node:
            raise ValueError("the event log needs a node name")
        if max_len < 1:
            raise ValueError(f"event log max_len must be >= 1, got {max_len}")
        if batch < 1 or max_buffer < batch:
            raise ValueError(
                f"event log needs 1 <= batch <= max_buffer, got batch={batch} max_buffer={max_buffer}"
            )
        if interval <= 0 or timeout <= 0 or config_interval <= 0:
            raise ValueError("event log interval, timeout and config_interval must be > 0")
        self.streams = keys.event_streams(fleet)
        self.node = node
        self.max_len = max_len
        self._partition_len = -(-max_len // keys.EVENT_PARTITIONS)  # (rounded up: the whole keeps max_len)
        self.sample = sample
        self._threshold = sample_threshold(sample)
        if max_rate < 0:
            raise ValueError(f"event log max_rate must be >= 0 (0: no cap), got {max_rate}")
        # Overload: past max_rate per-message events a second, fewer messages are sampled (see keeps()).
        self.max_rate = max_rate
        self.effective_sample = sample
        # the node's count of per-message events so far (its delivery counters): the load offered to the cap
        self._offered = offered or (lambda: 0)
        self._offered_last = 0
        #: the data path's test: log a message's events when ``(msg_id * SAMPLE_MIX) & SAMPLE_MASK < keep``
        self.keep = SAMPLE_ALL if self._threshold is None else self._threshold
        self._adjusted = time.monotonic()
        self.interval = interval
        self.batch = batch
        self.max_buffer = max_buffer
        self.timeout = timeout
        self.config_interval = config_interval
        # the store's shards (following its primaries), or a Redis of the log's own
        if isinstance(redis, StoreConnections):
            self._conns, self._own = redis, False
        else:
            try:
                self._conns, self._own = StoreConnections.of_url(redis, f"fleetmq:{node}"), True
            except ValueError as e:
                raise ValueError(f"event log redis url {redis!r}: {e}") from e
        # by shard address: the log's own pool there and its one connection
        self._pools: dict[str, ConnectionPool] = {}
        self._links: dict[str, AbstractConnection] = {}
        self._node_partition = partition(-1, client_hash(node))
        self.run = os.urandom(6).hex()  # eid prefix: unique per log instance, so eids never repeat
        self._seq = itertools.count(1)
        # each partition's mark for this run, and the node partition's for zone_config records (a sequence of
        # their own: they are sent ahead of records numbered before them)
        self._marks = tuple(f"{s}:stored:{self.run}" for s in self.streams)
        self._config_mark = f"{self.streams[self._node_partition]}:stored:{self.run}:config"
        self._buf: list[tuple[Any, ...]] = []
        self._configs: list[tuple[Any, ...]] = []
        self._zones: dict[str, tuple[int, int]] = {}
        self._clients: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        # (monotonic) the start of the current failure: every send of unknown outcome came after it
        self._failing_since = 0.0
        self._config_due = 0.0
        self._closing = False
        self._sending = 0
        #: records stored in Redis (confirmed by a reply), dropped (overload, Redis down, bad values; a send
        #: that timed out may still have been stored), failed sends (their records retried or dropped), and
        #: round trips (one per shard a batch touches)
        self.written = 0
        #: of those written, the records a retry found stored already (a send whose reply was lost)
        self.repeated = 0
        self.dropped = 0
        self.errors = 0
        self.round_trips = 0

    @classmethod
    def from_config(
        cls, config: EventLogConfig, *, redis: str | StoreConnections, fleet: str, node: str, **kwargs: Any
    ) -> EventLog | None:
        """The log a node's config asks for, or None when it is disabled."""
        if not config.enabled:
            return None
        return cls(
            redis,
            fleet=fleet,
            node=node,
            max_len=config.max_len,
            sample=config.sample,
            max_rate=config.max_rate,
            **kwargs,
        )

    # -- the data path ---------------------------------------------------------------------------------
    def keeps(self, msg_id: int) -> bool:
        """Whether a message's events are logged (the data path inlines this test)."""
        return ((msg_id * SAMPLE_MIX) & SAMPLE_MASK) < self.keep

    def _adapt(self, now: float) -> None:
        """Every ADAPT_INTERVAL: past max_rate, sample fewer messages (at once); below it, more (doubling)."""
        elapsed = now - self._adjusted
        if elapsed < ADAPT_INTERVAL:
            return
        total = self._offered()
        offered, self._offered_last, self._adjusted = (total - self._offered_last) / elapsed, total, now
        target = self.sample
        if self.max_rate and offered * target > self.max_rate:
            target = self.max_rate / offered
        current = self.effective_sample
        new = target if target <= current else min(target, current * 2)
        if abs(new - current) > 0.1 * current or (new == self.sample and current != new):
            self.effective_sample = new
            self._threshold = sample_threshold(new)
            self.keep = SAMPLE_ALL if self._threshold is None else self._threshold
            self._config_due = 0.0  # the stream learns the new rate (zone_config records carry it)

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
    ) -> None:
        """Buffer one event (-1 / "" = field absent). O(1), no I/O, no await; drops (counted) when the buffer
        is full. Pass ints, floats and strs: a record with another value (None...) is dropped, counted."""
        if self._threshold is not None and event in SAMPLED_EVENTS and not sampled(msg_id, self._threshold):
            return
        buf = self._buf
        n = len(buf)
        if n >= self.max_buffer:
            self.dropped += 1
            return
        client = self._clients.get(client_id)
        if client is None:
            client = self._hash_client(client_id)
        buf.append(
            (
                next(self._seq),
                time.time_ns() // 1000,
                zone,
                event,
                client,
                msg_id,
                topic,
                qos,
                packet_id,
                nbytes,
                reason,
                inflight_len,
                mqueue_len,
            )
        )
        if n + 1 == self.batch:
            self._wake.set()

    def _hash_client(self, client_id: str) -> str:
        if len(self._clients) >= _CLIENT_CACHE_MAX:
            self._clients.clear()
        h = self._clients[client_id] = client_hash(client_id)
        return h

    def set_zones(self, zones: Mapping[str, ZoneSettings]) -> None:
        """Record the zones' limits (the report's denominators); call again after a config reload."""
        self._zones = {name: (z.max_inflight, z.max_mqueue_len) for name, z in zones.items()}
        self._config_due = 0.0

    @property
    def buffered(self) -> int:
        """Records not yet stored: in the buffer or in a send."""
        return len(self._buf) + self._sending

    # -- the flush task --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the background flush task (idempotent)."""
        if self._task is None or self._task.done():
            if self._own:
                await self._conns.open()
            self._config_due = 0.0
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fleetmq-eventlog")

    async def stop(self) -> None:
        """Let the task send what is buffered (one try per batch, within ``2 * timeout``), count what could not
        be sent as dropped, close the connection."""
        task, self._task = self._task, None
        self._closing = True
        self._wake.set()
        if task is not None:
            try:
                async with asyncio.timeout(self.timeout * 2):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timeout * 2):
                    await self.flush(retry=False)
        self.dropped += len(self._buf)
        self._buf.clear()
        self._closing = False
        for conn in self._links.values():
            with contextlib.suppress(Exception):
                await conn.disconnect()
        self._links.clear()
        for pool in self._pools.values():
            await pool.disconnect()
        self._pools.clear()
        if self._own:
            await self._conns.close()

    async def _run(self) -> None:
        backoff = 0.0
        while not self._closing:
            if backoff:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await self._wake.wait()
            self._wake.clear()
            if self.max_rate:
                self._adapt(time.monotonic())
            if self._zones and time.monotonic() >= self._config_due:
                self._config_due = time.monotonic() + self.config_interval
                self._emit_zone_config()
            try:
                await self.flush(retry=not self._closing)
            except Exception:  # never let the task die: the data path keeps emitting
                log.exception("event log flush failed unexpectedly")
                self._fail()
            # while Redis fails, retry with a growing pause instead of every interval
            backoff = min(max(backoff * 2, self.interval), 5.0) if self._failing else 0.0
        if self._buf:
            await self.flush(retry=False)

    def _emit_zone_config(self) -> None:
        now = time.time_ns() // 1000
        self._configs = [
            (next(self._seq), now, zone, ZONE_CONFIG, max_inflight, max_mqueue_len, self.effective_sample)
            for zone, (max_inflight, max_mqueue_len) in self._zones.items()
        ]

    async def flush(self, *, retry: bool = True) -> None:
        """Send everything buffered now, batch by batch; once a shard or a partition fails, the rest of its
        records are not sent this time (the others' are), so each partition's go in seq order. The records
        of failed sends (and of the batch a cancel cut off) go back to the front of the buffer, as far as it
        has room (retry=False, or failing for MARK_TTL / 2: none do); the rest are counted dropped."""
        pending, self._buf = self._buf, []
        self._sending = len(pending)
        unsent: list[tuple[Any, ...]] = []
        down: set[str] = set()  # the shards that failed in this flush
        held: set[int] = set()  # the partitions whose send failed in this flush
        i = 0
        try:
            if self._configs:  # rare (start, reload, every config_interval): its own round trip
                configs = {self._node_partition: self._configs}  # (kept if unsent)
                stored, self._configs = await self._send(_CONFIG_RECORD, configs, down, set())
                self.written += stored
            while i < len(pending):
                chunk = pending[i : i + self.batch]
                stored, failed = await self._send(_RECORD, self._partitioned(chunk), down, held)
                i += len(chunk)
                self.written += stored
                self.dropped += len(chunk) - stored - len(failed)  # malformed records _eval left out
                unsent += failed
        finally:
            self._sending = 0
            rest = unsent + pending[i:]
            if rest:
                # past MARK_TTL / 2 of failing, a send whose outcome is unknown may have outlived its mark
                stale = self._failing and time.monotonic() - self._failing_since >= MARK_TTL / 2
                keep = rest if retry and not stale else []
                self.dropped += len(rest) - len(keep)
                overflow = len(keep) + len(self._buf) - self.max_buffer
                if overflow > 0:
                    self.dropped += overflow
                    keep = keep[overflow:]
                self._buf[:0] = keep
        if self._failing and not unsent and not self._configs:
            self._failing = False
            log.warning("event log: writing to Redis again (%d events dropped so far)", self.dropped)

    @staticmethod
    def _partitioned(records: list[tuple[Any, ...]]) -> dict[int, list[tuple[Any, ...]]]:
        groups: dict[int, list[tuple[Any, ...]]] = {}
        for rec in records:  # (_RECORD: rec[4] is the client, rec[5] the msg_id)
            p = partition(rec[5], rec[4])
            group = groups.get(p)
            if group is None:
                groups[p] = [rec]
            else:
                group.append(rec)
        return groups

    async def _send(
        self,
        layout: tuple[str, ...],
        groups: dict[int, list[tuple[Any, ...]]],
        down: set[str],
        held: set[int],
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """Each partition's records as one EVAL, those of one shard pipelined in one round trip, the shards
        in parallel, except to shards in ``down`` and partitions in ``held`` (those that failed, to which
        this adds). Returns how many records Redis holds (stored now or by a send whose reply was lost) and
        those of the partitions not sent or whose send failed (Redis refused it, or its outcome is unknown);
        a record with a value that is not a str, int or float is in neither. EVALs a shard redirected (they
        did not run) go again where the map, read again, says."""
        evals: dict[int, bytes] = {}
        for p, records in groups.items():
            evals[p], groups[p] = self._eval(layout, p, records)
        stored = 0
        failed: list[int] = []
        todo = list(evals)
        for attempt in range(_REDIRECT_TRIES):
            by_shard: dict[str, tuple[Shard, list[int]]] = {}
            for p in todo:
                shard = self._conns.shard_for(self.streams[p])
                if shard.address in down or p in held:
                    failed.append(p)
                else:
                    by_shard.setdefault(shard.address, (shard, []))[1].append(p)
            results = await asyncio.gather(
                *(self._round_trip(shard, [evals[p] for p in ps]) for shard, ps in by_shard.values()),
                return_exceptions=True,
            )
            todo = []
            lost = busy = False
            for (shard, ps), result in zip(by_shard.values(), results, strict=True):
                if not isinstance(result, list):
                    if not isinstance(result, RedisError | OSError | TimeoutError):
                        raise result
                    self._failed(result, shard)
                    failed += ps
                    down.add(shard.address)
                    lost = True
                    continue
                for p, reply in zip(ps, result, strict=True):
                    if redirected(reply):
                        todo.append(p)
                        busy = busy or in_transition(reply)
                    elif isinstance(reply, ResponseError):  # (OOM, READONLY...): it did not run
                        self._failed(reply, shard)
                        failed.append(p)
                    else:
                        stored += len(groups[p])
                        self.repeated += len(groups[p]) - int(reply)
            if not (todo or lost) or not self._conns.sharded:
                break
            # a shard redirected (its slots moved) or went away (a replica may be taking over)
            if not await self._refresh() or not todo or attempt == _REDIRECT_TRIES - 1:
                break
            if busy:  # TRYAGAIN, CLUSTERDOWN: a failover or a migration under way
                await asyncio.sleep(0.1 * (attempt + 1))
        if todo:
            self._failed(RedisError(f"still redirected after {_REDIRECT_TRIES} sends"))
            failed += todo
        held.update(failed)
        return stored, [rec for p in failed for rec in groups[p]]

    async def _refresh(self) -> bool:
        """Read the cluster's map again and close the connections to servers no longer primaries."""
        try:
            await self._conns.refresh()
        except (RedisError, OSError) as e:
            log.warning("event log: cannot read the Redis Cluster's map: %s", e)
            return False
        current = {s.address for s in self._conns.shards}
        for address in [a for a in self._pools if a not in current]:
            conn = self._links.pop(address, None)
            pool = self._pools.pop(address)
            with contextlib.suppress(Exception):
                if conn is not None:
                    await conn.disconnect()
                await pool.disconnect()
        return True

    def _eval(
        self, layout: tuple[str, ...], p: int, records: list[tuple[Any, ...]]
    ) -> tuple[bytes, list[tuple[Any, ...]]]:
        """The EVAL of one partition's records, and the records it holds (those with sendable values)."""
        # EVAL rather than EVALSHA: the script is small next to a batch and Redis caches it by its sha, so
        # there is no NOSCRIPT to recover from after a Redis restart or a failover
        mark = self._marks[p] if layout is _RECORD else self._config_mark
        args: list[Any] = [
            "EVAL", _XADD_BATCH, 2, self.streams[p], mark, self._partition_len, self.node, self.run,
            len(layout), MARK_TTL,
        ]  # fmt: skip
        head = len(args)
        args += layout
        for rec in records:
            args += rec
        try:
            return hiredis.pack_command(tuple(args)), records
        except TypeError:  # a bad value (None...): leave its records out rather than lose the batch
            del args[head + len(layout) :]
            records = [
                rec
                for rec in records
                if all(isinstance(v, _VALUE_TYPES) and not isinstance(v, bool) for v in rec)
            ]
            for rec in records:
                args += rec
            return hiredis.pack_command(tuple(args)), records

    async def _round_trip(self, shard: Shard, commands: list[bytes]) -> list[Any]:
        """One shard's EVALs, sent together on the log's own connection there, every reply read (an error
        reply in its command's place) within ``timeout``."""
        conn = self._links.get(shard.address)
        if conn is None:
            pool = self._pools.get(shard.address)
            if pool is None:
                pool = self._pools[shard.address] = self._conns.new_pool(shard)
            # redis-py leaves make_connection unannotated; it returns the pool's connection class
            conn = self._links[shard.address] = pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            async with asyncio.timeout(self.timeout):
                await conn.send_packed_command(commands, check_health=False)
                replies: list[Any] = []
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as e:  # read in full: the connection stays usable
                        replies.append(e)
        except BaseException:
            self._links.pop(shard.address, None)
            await conn.disconnect()  # a reply may still be on its way: never reuse this socket
            raise
        self.round_trips += 1
        return replies

    def _fail(self) -> None:
        if not self._failing:
            self._failing, self._failing_since = True, time.monotonic()

    def _failed(self, error: BaseException, shard: Shard | None = None) -> None:
        self.errors += 1
        if not self._failing:
            self._fail()
            where = (
                f" {shard.address}" if shard and self._conns.sharded else ""
            )  # (a url may hold a password)
            log.warning(
                "event log: cannot write to Redis%s (%s); buffering up to %d events",
                where,
                error,
                self.max_buffer,
            )
