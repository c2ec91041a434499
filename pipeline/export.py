"""The exporter: events from a fleet's Redis Streams to Parquet files, losing and duplicating nothing.

The log is several streams (pipeline.streams), each read on its own with the same consumer group. It reads
with a consumer group, so Redis remembers what was handed out and not yet acknowledged (the
pending entries). A batch becomes one file per (date, zone), written under a temporary name, fsynced and
renamed into place; only then are its entries XACKed. A crash before the rename leaves a temporary file
(ignored by readers, removed at the next start); a crash after it leaves the entries pending, and the next
run reads its pending entries first (XREADGROUP from id 0) and writes them again under the same names
(``part-<partition>-<first id>-<last id>``: the stream's short name and the stream ids of the file's own
rows; the stream of old keeps ``part-<first id>-<last id>``), replacing the files with the same rows. Within
a batch duplicate eids (an older broker's resend: brokers now store each record once) are dropped; the
Spark job deduplicates anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .schema import EVENTS_DIR, FILE_COLUMNS, arrow_schema, escape_partition, parse_entry, utc_date
from .streams import Client, connect, log_keys, part_name

log = logging.getLogger("fleetmq.pipeline.export")

DEFAULT_GROUP = "fleetmq-pipeline"
DEFAULT_CONSUMER = "exporter"
#: test hook: pause (write this file, then sleep) at a named point so a test can SIGKILL the exporter there
PAUSE_AT_ENV = "FLEETMQ_EXPORT_PAUSE_AT"  # "before_rename" or "after_rename" (before the XACK)
PAUSE_FILE_ENV = "FLEETMQ_EXPORT_PAUSE_FILE"
PAUSE_POINTS = ("before_rename", "after_rename")


class ExportError(Exception):
    """The exporter cannot run (Redis unreachable, not a stream, unwritable output)."""


Entries = list[tuple[str, dict[str, str] | None]]


@dataclass
class ExportStats:
    entries: int = 0  # stream entries read and acknowledged
    rows: int = 0  # rows written (entries less duplicate eids and trimmed entries)
    files: int = 0
    duplicates: int = 0
    trimmed: int = 0  # pending entries that MAXLEN removed before they were exported
    bad_values: int = 0
    batches: int = 0
    paths: list[str] = field(default_factory=list)


class Exporter:
    """Moves one fleet's events to ``out/events/date=D/zone=Z/part-<first>-<last>.parquet``."""

    def __init__(
        self,
        redis_url: str,
        fleet: str,
        out: str | Path,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str = DEFAULT_CONSUMER,
        batch: int = 10_000,
        block_ms: int = 1000,
        flush_interval: float = 10.0,
        claim_idle_ms: int = 60_000,
    ) -> None:
        if batch < 1:
            raise ValueError(f"--batch must be >= 1, got {batch}")
        self.fleet = fleet
        self.keys = log_keys(fleet)
        self.out = Path(out)
        self.group = group
        self.consumer = consumer
        self.batch = batch
        self.block_ms = block_ms
        self.flush_interval = flush_interval
        self.claim_idle_ms = claim_idle_ms
        try:
            redis.connection.parse_url(redis_url)
        except ValueError as e:
            raise ExportError(f"--redis-url {redis_url!r}: {e}") from e
        self.url = redis_url
        self._redis: Client | None = None
        self._keys: list[str] = []  # the streams being read (the stream of old only if it exists)
        self.stats = ExportStats()
        self._pause_at = os.environ.get(PAUSE_AT_ENV) or None
        if self._pause_at is not None and self._pause_at not in PAUSE_POINTS:
            raise ExportError(f"{PAUSE_AT_ENV}={self._pause_at!r}: expected one of {', '.join(PAUSE_POINTS)}")

    # -- the loop ---------------------------------------------------------------------------------------
    @property
    def redis(self) -> Client:
        if self._redis is None:
            try:
                self._redis = connect(self.url, decode_responses=True, socket_timeout=30)
            except (redis.RedisError, OSError) as e:
                raise ExportError(f"cannot reach Redis for the {self.fleet} fleet's event log: {e}") from e
        return self._redis

    def run(self, *, once: bool, stop_after: float | None = None) -> ExportStats:
        """Export until the streams are drained (once) or forever (follow; ``stop_after`` seconds for tests)."""
        try:
            self._prepare()
            # what an earlier run (or a dead consumer) took but did not acknowledge comes first; once: then
            # what each stream has now, a batch at a time
            for key in self._keys:
                for last_id in ("0", ">") if once else ("0",):
                    while entries := self._read(key, last_id):
                        self._export(key, entries)
            deadline = None if stop_after is None else time.monotonic() + stop_after
            while not once and (deadline is None or time.monotonic() < deadline):
                for key, entries in self._collect(deadline).items():
                    self._export(key, entries)
        finally:
            if self._redis is not None:
                self._redis.close()
                self._redis = None
        return self.stats

    def _prepare(self) -> None:
        """A consumer group on every partition stream, and on the stream of old if there is one."""
        self._keys = []
        for key in self.keys:
            try:
                legacy = not part_name(self.fleet, key)
                if legacy and not self.redis.exists(key):
                    continue
                self.redis.xgroup_create(key, self.group, id="0", mkstream=True)
                log.info("created consumer group %s on %s", self.group, key)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise ExportError(f"cannot create consumer group {self.group} on {key}: {e}") from e
            except redis.RedisError as e:
                raise ExportError(f"cannot reach Redis for {key}: {e}") from e
            self._keys.append(key)
        self._remove_temporaries()
        for key in self._keys:
            self._claim_abandoned(key)

    def _claim_abandoned(self, key: str) -> None:
        """Entries another consumer of the group took and left pending (a renamed exporter) become ours."""
        start = "0-0"
        while True:
            reply = self.redis.xautoclaim(
                key, self.group, self.consumer, self.claim_idle_ms, start_id=start, count=self.batch
            )
            start = reply[0]
            if reply[1]:
                log.info("claimed %d pending entries of other consumers", len(reply[1]))
            if len(reply) > 2 and reply[2]:  # Redis 7: pending entries MAXLEN removed leave the PEL here
                self.stats.trimmed += len(reply[2])
                log.warning("%d pending entries were trimmed from the stream before export", len(reply[2]))
            if start in ("0-0", b"0-0"):
                return

    def _read(self, key: str, last_id: str, count: int | None = None) -> Entries:
        reply = self.redis.xreadgroup(self.group, self.consumer, {key: last_id}, count=count or self.batch)
        return list(reply[0][1]) if reply else []

    def _collect(self, until: float | None) -> dict[str, Entries]:
        """New entries, up to one batch a stream: reads round the streams until a batch is full or
        ``flush_interval`` has passed, pausing ``block_ms`` after a round that found nothing (one blocking
        read cannot wait on keys of several cluster slots)."""
        got: dict[str, Entries] = {}
        deadline = time.monotonic() + self.flush_interval
        if until is not None:
            deadline = min(deadline, until)
        while (left := deadline - time.monotonic()) > 0:
            found = False
            for key in self._keys:
                have = got.setdefault(key, [])
                if len(have) < self.batch and (entries := self._read(key, ">", self.batch - len(have))):
                    have += entries
                    found = True
            if any(len(v) >= self.batch for v in got.values()):
                break
            if not found:
                time.sleep(min(self.block_ms / 1000, left))
        return {k: v for k, v in got.items() if v}

    # -- one batch --------------------------------------------------------------------------------------
    def _export(self, key: str, entries: Entries) -> None:
        groups: dict[tuple[str | None, str | None], list[dict[str, Any]]] = defaultdict(list)
        seen: set[str] = set()
        for stream_id, fields in entries:
            if not fields:  # pending, but trimmed away by MAXLEN before we could export it
                self.stats.trimmed += 1
                continue
            row, bad = parse_entry(stream_id, fields)
            if bad:
                self.stats.bad_values += len(bad)
                log.warning("entry %s: unreadable %s set to null", stream_id, ", ".join(bad))
            eid = row["eid"]
            if eid is not None:
                if eid in seen:
                    self.stats.duplicates += 1
                    continue
                seen.add(eid)
            groups[(utc_date(row["ts_ms"]), row["zone"])].append(row)
        part = part_name(self.fleet, key)
        written = [
            self._write(part, date, zone, rows) for (date, zone), rows in sorted(groups.items(), key=str)
        ]
        if written:
            self._fsync_dirs(
                {p.parent for p in written} | {p.parent.parent for p in written} | {self.out / EVENTS_DIR}
            )
        self._pause("after_rename")
        ids = [stream_id for stream_id, _ in entries]
        for chunk in _chunks(ids, 1000):
            self.redis.xack(key, self.group, *chunk)
        self.stats.entries += len(entries)
        self.stats.rows += sum(len(rows) for rows in groups.values())
        self.stats.files += len(written)
        self.stats.batches += 1
        self.stats.paths.extend(str(p) for p in written)
        log.info("exported %d entries as %d files", len(entries), len(written))

    def _write(self, part: str, date: str | None, zone: str | None, rows: list[dict[str, Any]]) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = self.out / EVENTS_DIR / f"date={escape_partition(date)}" / f"zone={escape_partition(zone)}"
        folder.mkdir(parents=True, exist_ok=True)
        first, last = rows[0]["stream_id"], rows[-1]["stream_id"]
        final = folder / (f"part-{part}-{first}-{last}.parquet" if part else f"part-{first}-{last}.parquet")
        tmp = folder / f".{final.name}.{os.getpid()}.tmp"  # a leading dot: Spark and pyarrow skip it
        table = pa.Table.from_pydict({c: [r[c] for r in rows] for c in FILE_COLUMNS}, schema=arrow_schema())
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        self._pause("before_rename")
        os.replace(tmp, final)
        return final

    def _fsync_dirs(self, dirs: set[Path]) -> None:
        for d in sorted(dirs, key=str):
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _remove_temporaries(self) -> None:
        root = self.out / EVENTS_DIR
        if root.is_dir():
            for tmp in root.glob("date=*/zone=*/.part-*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                    log.info("removed %s, left by an interrupted run", tmp)

    def _pause(self, point: str) -> None:
        if self._pause_at == point:
            marker = os.environ.get(PAUSE_FILE_ENV)
            if marker:
                Path(marker).write_text(f"{os.getpid()} {socket.gethostname()} {point}\n")
            while True:  # until the test kills us
                time.sleep(3600)


def _chunks(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
