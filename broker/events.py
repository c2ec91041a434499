"""The event log: flat delivery records appended to a Redis Stream per fleet, the PySpark pipeline's input.

The data path only formats one string and appends it to a list (``EventLog.emit``: no I/O, no logging); a
background task sends the buffer every ``interval`` seconds, or as soon as it holds ``batch`` records, as one
EVAL whose script splits each record and XADDs it (``MAXLEN ~ max_len``): one round trip, one argument
per record and one reply per batch, where a pipeline of XADDs costs the event loop about ten times more
packing and a reply to parse per record. The stream gets its own connection so a slow batch never delays
session-store writes.

Overload: the buffer holds at most ``max_buffer`` records; past that, and for batches that cannot be sent
while Redis is slow or down, records are dropped and counted (``dropped``), never waited for. A batch whose
send failed is retried while it fits in the buffer, so an outcome-unknown send may store a record twice;
the unique ``eid`` lets readers drop the copy.

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
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError

from . import keys
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

if TYPE_CHECKING:
    from .config import EventLogConfig
    from .zones import ZoneSettings

log = logging.getLogger("fleetmq.events")


# A buffered record is a tuple of the values of _RECORD (or _CONFIG_RECORD); eid is run + seq, node is the
# same for every record of a log. Formatting is left to Redis: the data path only builds the tuple.
_RECORD = ("seq", "ts_ms", "zone", "event", "client", *FIELDS[6:14])
_CONFIG_RECORD = ("seq", "ts_ms", "zone", "event", "max_inflight", "max_mqueue_len", "sample")

# XADD each record of a batch. ARGV: max_len, node, run, n, the n field names of a record, then the records'
# values one after the other (n each). "" and "-1" mean absent and are left out of the entry; ts_ms comes as
# integer microseconds and is stored as milliseconds with three decimals. Returns the number stored.
# (Values arrive as separate arguments: splitting packed strings in Lua cost Redis ~40 µs a record.)
_XADD_BATCH = """
local key, maxlen, node, run = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
local stored = 0
for a = 5 + n, #ARGV - n + 1, n do
  local us = ARGV[a + 1]
  local fv = {'eid', run .. '-' .. ARGV[a], 'ts_ms', string.sub(us, 1, -4) .. '.' .. string.sub(us, -3),
              'node', node}
  for i = 2, n - 1 do
    local v = ARGV[a + i]
    if v ~= '' and v ~= '-1' then
      fv[#fv + 1] = ARGV[5 + i]
      fv[#fv + 1] = v
    end
  end
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fv))
  stored = stored + 1
end
return stored
"""
_VALUE_TYPES = (str, int, float)

#: how often the overload cap re-estimates the offered rate (short: a burst is cut within this long)
ADAPT_INTERVAL = 0.25
_CLIENT_CACHE_MAX = 100_000


class EventLog:
    """One node's writer to its fleet's event stream. ``await start()``, ``emit(...)`` from the data path,
    ``await stop()`` to send what is buffered (within ``timeout``) and close."""

    def __init__(
        self,
        redis: str | ConnectionPool,
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
        self.key = keys.event_stream(fleet)
        self.node = node
        self.max_len = max_len
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
        if isinstance(redis, ConnectionPool):  # (the session store's, following its primary)
            self._pool = redis
        else:
            try:
                self._pool = ConnectionPool.from_url(
                    redis, socket_timeout=timeout, socket_connect_timeout=timeout
                )
            except ValueError as e:
                raise ValueError(f"event log redis url {redis!r}: {e}") from e
        self._conn: AbstractConnection | None = None
        self.run = os.urandom(6).hex()  # eid prefix: unique per log instance, so eids never repeat
        self._seq = itertools.count(1)
        self._buf: list[tuple[Any, ...]] = []
        self._configs: list[tuple[Any, ...]] = []
        self._zones: dict[str, tuple[int, int]] = {}
        self._clients: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._config_due = 0.0
        self._closing = False
        self._sending = 0
        #: records stored in Redis (confirmed by a reply), dropped (overload, Redis down, bad values; a send
        #: that timed out may still have been stored), and failed sends (their records retried or dropped)
        self.written = 0
        self.dropped = 0
        self.errors = 0

    @classmethod
    def from_config(
        cls, config: EventLogConfig, *, redis: str | ConnectionPool, fleet: str, node: str, **kwargs: Any
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
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.disconnect()
            self._conn = None
        await self._pool.disconnect()

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
                self._failing = True
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
        """Send everything buffered now, batch by batch. After a failed send (or a cancel) the unsent records
        go back to the buffer, as far as it has room (retry=False: none do); the rest are counted dropped."""
        pending, self._buf = self._buf, []
        self._sending = len(pending)
        i = 0
        ok = False
        try:
            if self._configs:  # rare (start, reload, every config_interval): its own round trip
                self.written += await self._send(_CONFIG_RECORD, self._configs)
                self._configs = []
            while i < len(pending):
                chunk = pending[i : i + self.batch]
                stored = await self._send(_RECORD, chunk)
                self.written += stored
                self.dropped += len(chunk) - stored  # malformed records the script skipped
                i += len(chunk)
            ok = True
        except (RedisError, OSError, TimeoutError) as e:
            self.errors += 1
            if not self._failing:
                self._failing = True
                log.warning(
                    "event log: cannot write to Redis (%s); buffering up to %d events", e, self.max_buffer
                )
        finally:
            self._sending = 0
            if not ok:
                rest = pending[i:] if retry else []
                self.dropped += len(pending) - i - len(rest)
                overflow = len(rest) + len(self._buf) - self.max_buffer
                if overflow > 0:
                    self.dropped += overflow
                    rest = rest[overflow:]
                self._buf[:0] = rest
        if ok and self._failing:
            self._failing = False
            log.warning("event log: writing to Redis again (%d events dropped so far)", self.dropped)

    async def _send(self, layout: tuple[str, ...], records: list[tuple[Any, ...]]) -> int:
        """One round trip: an EVAL of the records; returns how many Redis stored (a record with a value that
        is not a str, int or float is left out)."""
        # EVAL rather than EVALSHA: the script is small next to a batch and Redis caches it by its sha, so
        # there is no NOSCRIPT to recover from after a Redis restart
        args: list[Any] = ["EVAL", _XADD_BATCH, 1, self.key, self.max_len, self.node, self.run, len(layout)]
        args += layout
        for rec in records:
            args += rec
        try:
            packed = hiredis.pack_command(tuple(args))
        except TypeError:  # a bad value (None...): leave its records out rather than lose the batch
            del args[8 + len(layout) :]
            for rec in records:
                if all(isinstance(v, _VALUE_TYPES) and not isinstance(v, bool) for v in rec):
                    args += rec
            packed = hiredis.pack_command(tuple(args))
        conn = self._conn
        if conn is None:
            # redis-py leaves make_connection unannotated; it returns the pool's connection class
            conn = self._conn = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(packed, check_health=False)
            return int(await conn.read_response())
        except ResponseError:
            raise  # an error reply (OOM, WRONGTYPE...) was read in full: the connection stays usable
        except BaseException:
            await conn.disconnect()  # a reply may still be on its way: never reuse this socket
            raise
