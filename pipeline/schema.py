"""The event table: the stream's flat records as typed columns, and where their Parquet files live.

The column list is broker.eventschema.FIELDS (the writer's contract) plus the stream entry id; the exporter
writes these columns and the Spark job reads them with this schema, so neither guesses types. Files are
Hive-partitioned by ``date`` (UTC day of ts_ms) and ``zone``, which are not stored inside the files.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetmq.broker.eventschema import FIELDS

#: column -> kind ("str", "int", "float"); every column is nullable (absent fields are null)
COLUMNS: dict[str, str] = {
    "stream_id": "str",
    "eid": "str",
    "ts_ms": "float",
    "node": "str",
    "zone": "str",
    "event": "str",
    "client": "str",
    "msg_id": "int",
    "topic": "str",
    "qos": "int",
    "packet_id": "int",
    "bytes": "int",
    "reason": "str",
    "inflight_len": "int",
    "mqueue_len": "int",
    "max_inflight": "int",
    "max_mqueue_len": "int",
    "sample": "float",
}
assert set(COLUMNS) == {"stream_id", *FIELDS}, "schema.COLUMNS must follow broker.eventschema.FIELDS"

PARTITIONS = ("date", "zone")
#: columns stored in a Parquet file (the partition columns live in its path)
FILE_COLUMNS = tuple(c for c in COLUMNS if c not in PARTITIONS)
EVENTS_DIR = "events"
#: Spark and Hive read this partition value as null
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# characters Hive/Spark escape in partition values as %XX (Spark unescapes them when it reads)
_ESCAPE = set("\"#%'*/:=?\\\x7f{[]^") | {chr(i) for i in range(32)}


def arrow_schema() -> Any:
    import pyarrow as pa

    kinds = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
    return pa.schema([pa.field(c, kinds[COLUMNS[c]]) for c in FILE_COLUMNS])


def spark_schema() -> Any:
    """The events' schema for spark.read / readStream, partition columns included (no inference)."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    kinds = {"str": StringType(), "int": LongType(), "float": DoubleType()}
    fields = [StructField(c, kinds[COLUMNS[c]]) for c in FILE_COLUMNS]
    return StructType([*fields, StructField("date", StringType()), StructField("zone", StringType())])


def escape_partition(value: str | None) -> str:
    if value is None or value == "":
        return NULL_PARTITION
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in value)


def utc_date(ts_ms: float | None) -> str | None:
    if ts_ms is None:
        return None
    return dt.datetime.fromtimestamp(ts_ms / 1000.0, dt.UTC).strftime("%Y-%m-%d")


def parse_entry(stream_id: str, fields: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """A stream entry as a typed row; values that do not parse become null and are named in the list."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row["stream_id"] = stream_id
    bad: list[str] = []
    for name, value in fields.items():
        kind = COLUMNS.get(name)
        if kind is None or name == "stream_id":
            continue  # a field a newer writer added: ignored, not fatal
        if kind == "str":
            row[name] = value
            continue
        try:
            row[name] = int(value) if kind == "int" else float(value)
        except ValueError:
            bad.append(name)
    return row, bad
