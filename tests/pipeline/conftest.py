"""Fixtures of the pipeline tests: one local Spark for the whole run, event builders (by hand, or written
to Redis by a real EventLog), Parquet helpers."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetmq.broker.events import EventLog
from fleetmq.broker.eventschema import DELIVER, PUBLISH_IN
from fleetmq.pipeline.schema import FILE_COLUMNS

#: 2026-01-01 00:00:00 UTC in epoch milliseconds: the hand-built events' clock
T0_MS = 1_767_225_600_000.0
T0 = dt.datetime(2026, 1, 1)
#: the fleet whose event log the tests write and export
FLEET = "edge"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[1] SparkSession shared by every pipeline test (the JVM takes ~15 s to start)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.fail("Spark needs a Java 17 runtime: apt-get install openjdk-17-jre-headless")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("fleetmq-tests")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")  # halves each query's time on the tests' tiny data
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


_eids = itertools.count(1)


def event(ms: float, event: str, zone: str = "a", **fields: Any) -> dict[str, Any]:
    """One event row at T0 + ms, with a fresh eid unless given."""
    row: dict[str, Any] = dict.fromkeys((*FILE_COLUMNS, "zone", "date"))
    row.update(
        stream_id=f"{int(T0_MS + ms)}-0",
        eid=f"t-{next(_eids)}",
        ts_ms=T0_MS + ms,
        node="n1",
        zone=zone,
        event=event,
    )
    row.update(fields)
    row["date"] = (T0 + dt.timedelta(milliseconds=row["ts_ms"] - T0_MS)).strftime("%Y-%m-%d")
    return row


def events_df(spark: Any, rows: list[dict[str, Any]]) -> Any:
    from fleetmq.pipeline.schema import spark_schema

    schema = spark_schema()
    return spark.createDataFrame([tuple(r[f.name] for f in schema.fields) for r in rows], schema)


def write_events(out: Path, rows: list[dict[str, Any]], name: str = "part-test") -> None:
    """Rows as the exporter lays them out (one file per date and zone), for the report's input."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fleetmq.pipeline.schema import arrow_schema

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["date"], r["zone"]), []).append(r)
    for (date, zone), rs in groups.items():
        folder = out / "events" / f"date={date}" / f"zone={zone}"
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pydict({c: [r[c] for r in rs] for c in FILE_COLUMNS}, schema=arrow_schema())
        pq.write_table(table, folder / f"{name}.parquet")


def emit_events(url: str, n: int, *, zones: tuple[str, ...] = ("external",)) -> int:
    """n messages' publish_in + deliver through a real EventLog; returns the events written."""

    async def go() -> int:
        log = EventLog(url, fleet=FLEET, node="n1", batch=500)
        await log.start()
        for m in range(1, n + 1):
            zone = zones[m % len(zones)]
            log.emit(PUBLISH_IN, zone, "pub", m, "t/1", 1, m, 10)
            log.emit(DELIVER, zone, "sub", m, "t/1", 1, m, 10, "", 1, 0)
            if m % 100 == 0:
                await asyncio.sleep(0)
        await log.stop()
        assert log.dropped == 0
        return log.written

    return asyncio.run(go())
