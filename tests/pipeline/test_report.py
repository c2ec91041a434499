"""The report job end to end: EventLog -> real Redis -> exporter -> Spark job -> tables, report, patch;
and incremental runs (file stream, availableNow, checkpoint) agreeing with a batch run."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import yaml
from fleetmq.broker.events import EventLog
from fleetmq.broker.eventschema import (
    ACK,
    CONNECT,
    DELIVER,
    DROP,
    PUBLISH_IN,
    RETRANSMIT,
    TAKEOVER,
)
from fleetmq.broker.zones import ZoneSettings
from fleetmq.pipeline import report
from fleetmq.pipeline.export import Exporter
from fleetmq.pipeline.kpis import zone_kpis
from pyspark.testing import assertDataFrameEqual

from .conftest import event, write_events

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]


def broker_scenario(url: str) -> None:
    """What a node of zone external (max_mqueue_len 10) logs: 20 messages delivered and acked, 2 of them
    resent; an offline session whose queue fills (15 queue_full drops) and that resumes with 10 waiting;
    one takeover."""

    async def go() -> None:
        log = EventLog(url, fleet="edge", node="node-0")
        log.set_zones({"external": ZoneSettings(max_inflight=32, max_mqueue_len=10)})
        await log.start()
        for m in range(1, 21):
            log.emit(PUBLISH_IN, "external", "pub", m, "t", 1, m, 64)
            log.emit(DELIVER, "external", "sub", m, "t", 1, m, 64, "", 1, 0)
            if m % 10 == 0:
                log.emit(RETRANSMIT, "external", "sub", m, "t", 1, m)
            await asyncio.sleep(0.002)
            log.emit(ACK, "external", "sub", m, "t", 1, m, inflight_len=0)
        for m in range(21, 36):
            log.emit(DROP, "external", "offline", m, "t", 1, reason="queue_full", mqueue_len=10)
        log.emit(TAKEOVER, "external", "sub", reason="remote")
        log.emit(CONNECT, "external", "offline", reason="resumed", mqueue_len=10)
        await log.stop()
        assert log.dropped == 0

    asyncio.run(go())


def test_report_shows_the_drops_and_takeovers_and_asks_for_a_larger_queue(spark, redis_server, tmp_path):
    broker_scenario(redis_server.url)
    Exporter(redis_server.url, "edge", tmp_path / "data").run(once=True)
    out = tmp_path / "report"
    assert report.main(["--in", str(tmp_path / "data"), "--out", str(out), "--window", "1h"]) == 0

    kpis = spark.read.parquet(str(out / "zone_kpis")).collect()
    assert {r["zone"] for r in kpis} == {"external"}
    assert sum(r["deliveries"] for r in kpis) == 20 and sum(r["retransmits"] for r in kpis) == 2
    assert sum(r["drops"].get("queue_full", 0) for r in kpis) == 15
    assert sum(r["takeovers"] for r in kpis) == 1
    assert max(r["offline_backlog_p99"] for r in kpis) == 10

    recs = {r["setting"]: r for r in spark.read.parquet(str(out / "zone_recommendations")).collect()}
    queue = recs["max_mqueue_len"]
    assert (queue["current"], queue["recommended"]) == (10, 15)
    assert "dropped 15 messages (queue_full)" in queue["reason"]
    assert recs["max_inflight"]["current"] == 32 and recs["max_inflight"]["recommended"] >= 1

    md = (out / "report.md").read_text()
    summary = next(line for line in md.splitlines() if line.startswith("| external |"))
    assert "queue_full 15" in summary and summary.rstrip().endswith("| 1 | 0 |")  # 1 takeover, 0 timeouts
    assert "![zone external](plots/zone-0.png)" in md and (out / "plots" / "zone-0.png").stat().st_size > 1000
    patch = [d for d in yaml.safe_load_all((out / "mqttzone-patch.yaml").read_text()) if d]
    assert patch[0]["kind"] == "MqttZone" and patch[0]["metadata"]["name"] == "external"
    assert patch[0]["spec"]["session"]["maxMqueueLen"] == 15


def test_incremental_runs_agree_with_a_batch_run_across_midnight(spark, tmp_path):
    day1 = 86_400_000 - 60_000  # 2026-01-01 23:59 UTC, in ms after T0
    first = [
        event(0, "zone_config", max_inflight=4, max_mqueue_len=50, sample=1.0),
        *[event(day1 + 59_990 - i, "publish_in", client="p", msg_id=i, qos=1) for i in range(1, 4)],
        event(day1 + 1000, "deliver", client="s", msg_id=1, qos=1, inflight_len=1),
    ]
    second = [  # the next day: deliveries of messages published before midnight, and their acks
        *[event(86_400_000 + 10 * i, "deliver", client="s", msg_id=i, qos=1, inflight_len=2) for i in (2, 3)],
        *[event(86_400_000 + 100 + i, "ack", client="s", msg_id=i, qos=1) for i in (1, 2, 3)],
        event(86_400_000 + 500, "drop", client="o", msg_id=9, reason="queue_full", mqueue_len=50),
    ]
    data, out, ckpt = tmp_path / "data", tmp_path / "out", tmp_path / "ckpt"
    write_events(data, first, "part-1")
    report.run(spark, data, out, window="1m", incremental=True, checkpoint=ckpt)
    write_events(data, second, "part-2")
    recs = report.run(spark, data, out, window="1m", incremental=True, checkpoint=ckpt)

    got = spark.read.parquet(str(out / "zone_kpis"))
    expected = zone_kpis(report.read_events(spark, data), "60 seconds")
    assertDataFrameEqual(got.select(*expected.columns), expected.collect())  # read back: all nullable
    # the cross-midnight deliveries kept their latencies: msg 2 published 23:59:59.988, delivered 00:00:00.020
    # (32 ms), msg 3 23:59:59.987 -> 00:00:00.030 (43 ms)
    day2 = got.where("date = '2026-01-02'").first()
    assert (day2["latency_p50_ms"], day2["latency_p99_ms"]) == (32.0, 43.0)
    assert {r.setting: r.recommended for r in recs}["max_mqueue_len"] == 75


def test_bad_input_is_refused_before_spark_starts(tmp_path, capsys):
    (tmp_path / "events").mkdir()
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no events under" in capsys.readouterr().err
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "o"), "--window", "0s"]) == 2
    assert "--window" in capsys.readouterr().err
    cfg = tmp_path / "zones.yaml"
    cfg.write_text("zones: {external: {max_inflight: -1}}\n")
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "o"), "--config", str(cfg)]) == 2
    assert "max_inflight" in capsys.readouterr().err


def test_limits_come_from_a_broker_config_or_mqttzone_manifests(tmp_path):
    broker = tmp_path / "broker.yaml"
    broker.write_text("zones: {edge: {max_inflight: 7, max_mqueue_len: 70}}\n")
    assert report.load_limits(broker)["edge"] == (7, 70)
    assert report.load_limits(broker)["internal"] == (128, 10000)  # EMQX's stock zones come along
    zones = tmp_path / "zones.yaml"
    zones.write_text(
        "apiVersion: fleetmq.io/v1alpha1\nkind: MqttZone\nmetadata: {name: a}\nspec: {session: {maxInflight: 3}}\n"
        "---\napiVersion: fleetmq.io/v1alpha1\nkind: MqttZone\nmetadata: {name: b}\n"
        "spec: {session: {maxInflight: 4, maxMqueueLen: 40}}\n"
    )
    assert report.load_limits(zones) == {"a": (3, None), "b": (4, 40)}
    assert report.window_spec("5m") == "300 seconds"
    assert dt.timedelta(seconds=int(report.window_spec("1h").split()[0])) == dt.timedelta(hours=1)


def test_only_zone_configs_make_an_empty_report_not_a_crash(spark, tmp_path):
    write_events(tmp_path / "data", [event(0, "zone_config", max_inflight=4, max_mqueue_len=50, sample=1.0)])
    assert report.run(spark, tmp_path / "data", tmp_path / "out", window="1m") == []
    assert "No events: nothing to report." in (tmp_path / "out" / "report.md").read_text()
    assert "No zone needs a change" in (tmp_path / "out" / "mqttzone-patch.yaml").read_text()
