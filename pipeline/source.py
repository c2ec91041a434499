"""A Spark Python data source over a fleet's Redis Stream, for streaming use without the exporter.

    spark.dataSource.register(EventStreamSource)
    spark.readStream.format("fleetmq-events").option("redis_url", URL).option("fleet", "edge").load()

Batch reads take the whole stream; a streaming read's offsets are stream ids, so each micro-batch reads
(start, end] with XRANGE. It reads without a consumer group and acknowledges nothing: what MAXLEN trims
before a micro-batch reads it is gone, and it is the exporter's Parquet files that keep history (the
report's default input). Rows have the event table's columns (schema.COLUMNS), zone included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fleetmq.pipeline.schema import COLUMNS
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

NAME = "fleetmq-events"
CHUNK = 10_000
_DDL = {"str": "string", "int": "bigint", "float": "double"}


class IdRange(InputPartition):
    """Stream ids after ``start`` up to and including ``end`` (None: to the stream's end)."""

    def __init__(self, start: str, end: str | None) -> None:
        self.start = start
        self.end = end


class EventStreamSource(DataSource):
    """Options: redis_url (redis://host:6379/0), fleet (the stream is fmq:eventlog:<fleet>)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return ", ".join(f"{c} {_DDL[kind]}" for c, kind in COLUMNS.items())

    def _options(self) -> tuple[str, str]:
        from fleetmq.broker.keys import event_stream

        url, fleet = self.options.get("redis_url"), self.options.get("fleet")
        if not url or not fleet:
            raise ValueError(f"the {NAME} source needs .option('redis_url', URL) and .option('fleet', NAME)")
        return url, event_stream(fleet)

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(*self._options())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(*self._options())


def _read(url: str, key: str, part: IdRange) -> Iterator[tuple[Any, ...]]:
    import redis
    from fleetmq.pipeline.schema import parse_entry

    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        low, high = f"({part.start}", part.end or "+"
        while True:
            entries = r.xrange(key, low, high, count=CHUNK)
            for stream_id, fields in entries:
                row, _ = parse_entry(stream_id, fields)
                yield tuple(row[c] for c in COLUMNS)
            if len(entries) < CHUNK:
                return
            low = f"({entries[-1][0]}"
    finally:
        r.close()


class _BatchReader(DataSourceReader):
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def partitions(self) -> Sequence[InputPartition]:
        return [IdRange("0-0", None)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdRange)
        return _read(self.url, self.key, partition)


class _StreamReader(DataSourceStreamReader):
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def initialOffset(self) -> dict[str, str]:
        return {"id": "0-0"}

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        import redis

        r = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            last = r.xrevrange(self.key, "+", "-", count=1)
        finally:
            r.close()
        if not last:
            return start or self.initialOffset()
        return {"id": last[0][0]}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        return [IdRange(start["id"], end["id"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdRange)
        return _read(self.url, self.key, partition)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to acknowledge: the stream is trimmed by MAXLEN, not by readers."""
