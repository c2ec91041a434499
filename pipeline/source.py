"""A Spark Python data source over a fleet's event log in Redis, for streaming use without the exporter.

    spark.dataSource.register(EventStreamSource)
    spark.readStream.format("fleetmq-events").option("redis_url", URL).option("fleet", "edge").load()

The log is several streams (pipeline.streams); each is one input partition, so Spark reads them in
parallel. Batch reads take every stream whole; a streaming read's offset is the last stream id read in each
stream, so each micro-batch reads (start, end] of each with XRANGE. It reads without a consumer group and
acknowledges nothing: what MAXLEN trims before a micro-batch reads it is gone, and it is the exporter's
Parquet files that keep history (the report's default input). Rows have the event table's columns
(schema.COLUMNS), zone included. ``redis_url`` may name any node of a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fleetmq.pipeline.schema import COLUMNS
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

NAME = "fleetmq-events"
CHUNK = 10_000
_DDL = {"str": "string", "int": "bigint", "float": "double"}
_START = "0-0"


class IdRange(InputPartition):
    """One stream's ids after ``start`` up to and including ``end`` (None: to the stream's end)."""

    def __init__(self, key: str, start: str, end: str | None) -> None:
        self.key = key
        self.start = start
        self.end = end


class EventStreamSource(DataSource):
    """Options: redis_url (redis://host:6379/0), fleet (its streams are fmq:eventlog:<fleet>...)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return ", ".join(f"{c} {_DDL[kind]}" for c, kind in COLUMNS.items())

    def _options(self) -> tuple[str, tuple[str, ...]]:
        from fleetmq.pipeline.streams import log_keys

        url, fleet = self.options.get("redis_url"), self.options.get("fleet")
        if not url or not fleet:
            raise ValueError(f"the {NAME} source needs .option('redis_url', URL) and .option('fleet', NAME)")
        return url, log_keys(fleet)

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(*self._options())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(*self._options())


def _read(url: str, part: IdRange) -> Iterator[tuple[Any, ...]]:
    from fleetmq.pipeline.schema import parse_entry
    from fleetmq.pipeline.streams import connect

    r = connect(url, decode_responses=True)
    try:
        low, high = f"({part.start}", part.end or "+"
        while True:
            entries = r.xrange(part.key, low, high, count=CHUNK)
            for stream_id, fields in entries:
                row, _ = parse_entry(stream_id, fields)
                yield tuple(row[c] for c in COLUMNS)
            if len(entries) < CHUNK:
                return
            low = f"({entries[-1][0]}"
    finally:
        r.close()


class _BatchReader(DataSourceReader):
    def __init__(self, url: str, keys: tuple[str, ...]) -> None:
        self.url, self.keys = url, keys

    def partitions(self) -> Sequence[InputPartition]:
        return [IdRange(key, _START, None) for key in self.keys]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdRange)
        return _read(self.url, partition)


class _StreamReader(DataSourceStreamReader):
    """Offsets: {stream key: last id read}. A checkpoint of the single-stream source ({"id": last id}) is
    read as the stream of old's offset."""

    def __init__(self, url: str, keys: tuple[str, ...]) -> None:
        self.url, self.keys = url, keys

    def initialOffset(self) -> dict[str, str]:
        return dict.fromkeys(self.keys, _START)

    def _offset(self, offset: dict[str, str] | None) -> dict[str, str]:
        offset = dict(offset or {})
        if "id" in offset:
            offset[self.keys[0]] = offset.pop("id")
        return {**self.initialOffset(), **offset}

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        from fleetmq.pipeline.streams import connect

        offset = self._offset(start)
        r = connect(self.url, decode_responses=True)
        try:
            for key in self.keys:
                if last := r.xrevrange(key, "+", "-", count=1):
                    offset[key] = last[0][0]
        finally:
            r.close()
        return offset

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        start, end = self._offset(start), self._offset(end)
        return [IdRange(key, start[key], end[key]) for key in self.keys if end[key] != start[key]]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdRange)
        return _read(self.url, partition)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to acknowledge: the streams are trimmed by MAXLEN, not by readers."""
