"""The Spark KPIs on hand-built events whose answers are worked out by hand (windows of one minute)."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from fleetmq.pipeline.kpis import pct, zone_kpis
from fleetmq.pipeline.tuning import PERCENTILES, percentile
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from .conftest import T0, event, events_df

pytestmark = pytest.mark.timeout(600)  # a busy machine can take minutes to start the JVM

W1, W2 = T0, T0 + dt.timedelta(minutes=1)
D1 = dt.date(2026, 1, 1)


def scenario() -> list[dict]:
    e = event
    rows = [
        e(0, "zone_config", max_inflight=10, max_mqueue_len=100, sample=1.0),
        e(100, "connect", client="c1", reason="new", mqueue_len=0),
        e(200, "connect", client="off", reason="resumed", mqueue_len=7),
        # msg 1 -> c1: latency 10, ack round trip 20
        e(1000, "publish_in", client="p", msg_id=1, qos=1),
        e(1010, "deliver", client="c1", msg_id=1, qos=1, inflight_len=1, mqueue_len=0),
        e(1030, "ack", client="c1", msg_id=1, qos=1),
        # msg 2 -> c1: latency 20, resent once, acked 30010 ms after the first delivery
        e(2000, "publish_in", client="p", msg_id=2, qos=1),
        e(2020, "deliver", client="c1", msg_id=2, qos=1, inflight_len=2, mqueue_len=0),
        e(32020, "retransmit", client="c1", msg_id=2, qos=1),
        e(32030, "ack", client="c1", msg_id=2, qos=1),
        # msg 3 -> c1 (latency 30, rtt 10) and c2 (latency 40, rtt 20)
        e(3000, "publish_in", client="p", msg_id=3, qos=1),
        e(3030, "deliver", client="c1", msg_id=3, qos=1, inflight_len=3, mqueue_len=1),
        e(3040, "deliver", client="c2", msg_id=3, qos=1, inflight_len=1, mqueue_len=0),
        e(3040, "ack", client="c1", msg_id=3, qos=1),
        e(3060, "ack", client="c2", msg_id=3, qos=1),
        # msg 4 -> c2 at QoS 0: latency 50, no ack
        e(4000, "publish_in", client="p", msg_id=4, qos=0),
        e(4050, "deliver", client="c2", msg_id=4, qos=0, inflight_len=2, mqueue_len=2),
        e(5000, "inflight_full", client="c1", msg_id=5, inflight_len=10, mqueue_len=4),
        e(6000, "drop", client="off", msg_id=6, reason="queue_full", mqueue_len=100),
        e(7000, "drop", client="p", msg_id=7, reason="no_subscribers"),
        e(7990, "takeover", node="n2", client="c1", reason="handover"),  # the old node's side of it
        e(8000, "takeover", client="c1", reason="remote"),
        e(9000, "keepalive_timeout", client="c2"),
        e(9001, "keepalive_timeout", client="c3"),
        e(9500, "disconnect", client="c3", reason="keepalive_timeout"),
        # the next minute: one timeout, nothing delivered
        e(61000, "keepalive_timeout", client="c4"),
        # zone b: limits from --config, one message nobody received
        e(500, "publish_in", zone="b", client="p", msg_id=9, qos=1),
        # zone s logs a quarter of its messages: 6 deliveries seen stand for 24
        e(0, "zone_config", zone="s", max_inflight=8, max_mqueue_len=80, sample=0.25),
        *[e(1000 + i, "deliver", zone="s", client="c1", msg_id=100 + i, qos=1) for i in range(6)],
        # zone v: node n1 logs everything, then (overloaded) half; node n2 a quarter all along
        e(0, "zone_config", zone="v", max_inflight=8, max_mqueue_len=80, sample=1.0),
        *[e(1000 + i, "deliver", zone="v", client="c1", msg_id=200 + i, qos=1) for i in range(4)],
        e(2000, "zone_config", zone="v", max_inflight=8, max_mqueue_len=80, sample=0.5),
        *[e(3000 + i, "deliver", zone="v", client="c1", msg_id=300 + i, qos=1) for i in range(3)],
        e(0, "zone_config", zone="v", node="n2", max_inflight=8, max_mqueue_len=80, sample=0.25),
        e(4000, "deliver", zone="v", node="n2", client="c2", msg_id=400, qos=1),
    ]
    dup = dict(rows[16])  # msg 4's delivery exported twice (same eid): counted once
    dup["stream_id"] = "1-1"
    return [*rows, dup]


@pytest.fixture(scope="module")
def kpis(spark):
    df = zone_kpis(events_df(spark, scenario()), "60 seconds", {"b": (5, 50)}).cache()
    yield df
    df.unpersist()


def test_latency_round_trip_duplicates_and_rates(spark, kpis):
    """Zones s and v: counts and session rates undo sampling, per node and as its fraction changes."""
    cols = [
        "zone",
        "window_start",
        "deliveries",
        "retransmits",
        "duplicate_ratio",
        "latency_p50_ms",
        "latency_p95_ms",
        "latency_p99_ms",
        "ack_rtt_p95_ms",
        "sessions",
        "session_rate_p95",
    ]
    expected = spark.createDataFrame(
        [
            ("a", W1, 5, 1, 0.2, 30.0, 50.0, 50.0, 30010.0, 2, 3 / 60),
            ("a", W2, 0, 0, None, None, None, None, None, 0, None),
            ("b", W1, 0, 0, None, None, None, None, None, 0, None),
            ("s", W1, 24, 0, 0.0, None, None, None, None, 1, 24 / 60),
            ("v", W1, 14, 0, 0.0, None, None, None, None, 2, (4 + 3 * 2) / 60),  # c1: 4 + 3 x 2; c2: 1 x 4
        ],
        "zone string, window_start timestamp, deliveries bigint, retransmits bigint, duplicate_ratio double, "
        "latency_p50_ms double, latency_p95_ms double, latency_p99_ms double, ack_rtt_p95_ms double, "
        "sessions bigint, session_rate_p95 double",
    )
    assertDataFrameEqual(kpis.select(*cols), expected)


def test_window_queue_and_drops(spark, kpis):
    cols = [
        "zone",
        "window_start",
        "inflight_p95",
        "max_inflight",
        "inflight_utilisation_p95",
        "inflight_full",
        "inflight_full_ratio",
        "queue_depth_p50",
        "queue_depth_p95",
        "queue_depth_p99",
        "offline_backlog_p50",
        "offline_backlog_p99",
        "max_mqueue_len",
        "drops_total",
        "drops",
    ]
    expected = spark.createDataFrame(
        [
            (
                "a",
                W1,
                3,
                10,
                0.3,
                1,
                0.2,
                1,
                100,
                100,
                7,
                100,
                100,
                2,
                {"no_subscribers": 1, "queue_full": 1},
            ),
            ("a", W2, None, 10, None, 0, None, None, None, None, None, None, 100, 0, {}),
            ("b", W1, None, 5, None, 0, None, None, None, None, None, None, 50, 0, {}),
            ("s", W1, None, 8, None, 0, 0.0, None, None, None, None, None, 80, 0, {}),
            ("v", W1, None, 8, None, 0, 0.0, None, None, None, None, None, 80, 0, {}),
        ],
        "zone string, window_start timestamp, inflight_p95 bigint, max_inflight bigint, "
        "inflight_utilisation_p95 double, inflight_full bigint, inflight_full_ratio double, queue_depth_p50 bigint, "
        "queue_depth_p95 bigint, queue_depth_p99 bigint, offline_backlog_p50 bigint, offline_backlog_p99 bigint, "
        "max_mqueue_len bigint, drops_total bigint, drops map<string,bigint>",
    )
    assertDataFrameEqual(kpis.select(*cols), expected)


def test_sessions_events(spark, kpis):
    cols = [
        "zone",
        "window_start",
        "date",
        "publishes",
        "takeovers",
        "keepalive_timeouts",
        "connects",
        "disconnects",
        "sample",
    ]
    expected = spark.createDataFrame(
        [
            ("a", W1, D1, 4, 1, 2, 2, 1, 1.0),
            ("a", W2, D1, 0, 0, 1, 0, 0, 1.0),
            ("b", W1, D1, 1, 0, 0, 0, 0, 1.0),
            ("s", W1, D1, 0, 0, 0, 0, 0, 0.25),
            ("v", W1, D1, 0, 0, 0, 0, 0, 0.25),  # the lowest fraction in force in the window
        ],
        "zone string, window_start timestamp, date date, publishes bigint, takeovers bigint, "
        "keepalive_timeouts bigint, connects bigint, disconnects bigint, sample double",
    )
    assertDataFrameEqual(kpis.select(*cols), expected)


def test_spark_percentiles_are_the_formula_module_s(spark):
    """One source of truth: Spark's percentile_approx at our accuracy is tuning.percentile (nearest rank)."""
    rnd = random.Random(7)
    groups = {
        g: [rnd.expovariate(0.1) for _ in range(n)] for g, n in (("a", 1), ("b", 7), ("c", 20), ("d", 999))
    }
    df = spark.createDataFrame([(g, v) for g, vs in groups.items() for v in vs], "g string, v double")
    got = df.groupBy("g").agg(*[pct("v", p).alias(n) for n, p in PERCENTILES.items()])
    expected = [(g, *[percentile(vs, p) for p in PERCENTILES.values()]) for g, vs in groups.items()]
    assertDataFrameEqual(got, spark.createDataFrame(expected, got.schema))
    assert (
        got.where(F.col("g") == "d").first()["p99"] == sorted(groups["d"])[989]
    )  # rank ceil(0.99 * 999) = 990


def test_a_bridge_reports_what_it_forwarded_dropped_and_why_it_reconnected(spark):
    """A bridge's session is zone $bridge:<name>: its acks are what the remote acknowledged, its drops
    those of its queue and of the bridge itself, and bridge_reconnect events why its link ended."""
    from fleetmq.pipeline.render import markdown

    z = "$bridge:cloud"
    rows = [
        event(0, "zone_config", zone=z, max_inflight=32, max_mqueue_len=1000, sample=1.0),
        *[event(1000 + i, "ack", zone=z, client="b", msg_id=500 + i, qos=1) for i in range(5)],
        event(2000, "drop", zone=z, client="b", reason="loop"),
        event(2001, "drop", zone=z, client="b", reason="loop"),
        event(2002, "drop", zone=z, client="b", reason="unmapped"),
        event(3000, "bridge_reconnect", zone=z, client="b", reason="remote_closed"),
        event(9000, "bridge_reconnect", zone=z, client="b", reason="connect_error"),
        event(12000, "bridge_reconnect", zone=z, client="b", reason="connect_error"),
    ]
    got = zone_kpis(events_df(spark, rows), "60 seconds").collect()
    [r] = [r.asDict() for r in got]
    assert (r["zone"], r["acks"], r["drops"]) == (z, 5, {"loop": 2, "unmapped": 1})
    assert r["bridge_reconnects"] == {"connect_error": 2, "remote_closed": 1}
    text = markdown([r], [], window="60 seconds")
    assert "| cloud | 5 | loop 2, unmapped 1 | connect_error 2, remote_closed 1 |" in text
