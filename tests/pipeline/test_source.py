"""The optional Spark Python data source reading the event log's Redis Streams directly, batch and streaming."""

from __future__ import annotations

import pytest
from fleetmq.broker.eventschema import DELIVER, DROP
from fleetmq.pipeline.source import NAME, EventStreamSource

from .conftest import FLEET, emit_events

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]


def test_batch_and_streaming_reads_of_the_stream(spark, redis_server, tmp_path):
    spark.dataSource.register(EventStreamSource)
    written = emit_events(redis_server.url, 40)  # 80 entries: publish_in + deliver
    opts = {"redis_url": redis_server.url, "fleet": FLEET}
    batch = spark.read.format(NAME).options(**opts).load()
    rows = batch.where(f"event = '{DELIVER}'").orderBy("msg_id").collect()
    assert batch.count() == written == 80 and len(rows) == 40
    assert (rows[0]["zone"], rows[0]["msg_id"], rows[0]["qos"], rows[0]["node"]) == ("external", 1, 1, "n1")

    sink = str(tmp_path / "sink")
    query = (
        spark.readStream.format(NAME)
        .options(**opts)
        .load()
        .writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
    )
    query.start().awaitTermination()
    assert spark.read.parquet(sink).count() == 80
    redis_server.command("XADD", "fmq:eventlog:" + FLEET, "*", "eid", "x-1", "zone", "z", "event", DROP)
    query.start().awaitTermination()  # the next run reads only what came after its last offset
    got = spark.read.parquet(sink)
    assert got.count() == 81 and got.where(f"event = '{DROP}'").first()["eid"] == "x-1"


def test_options_are_required(spark):
    spark.dataSource.register(EventStreamSource)
    with pytest.raises(Exception, match="redis_url"):
        spark.read.format(NAME).option("fleet", FLEET).load().count()
