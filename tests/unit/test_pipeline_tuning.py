"""The pipeline's formulas and renderings in plain Python: percentiles, BDP, queue sizing, report, patch."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml
from fleetmq.pipeline import render
from fleetmq.pipeline.schema import escape_partition, parse_entry, utc_date
from fleetmq.pipeline.tuning import (
    INFLIGHT_HEADROOM,
    MQUEUE_HEADROOM,
    Recommendation,
    WindowKpi,
    bdp_messages,
    max_inflight_for,
    max_mqueue_len_for,
    percentile,
    recommend_max_inflight,
    recommend_max_mqueue_len,
)

T0 = dt.datetime(2026, 1, 1, 10, 0)


def test_percentile_is_nearest_rank():
    values = [15, 20, 35, 40, 50]
    assert percentile(values, 0.05) == 15
    assert percentile(values, 0.30) == 20
    assert percentile(values, 0.40) == 20
    assert percentile(values, 0.50) == 35
    assert percentile(values, 1.0) == 50
    assert percentile(values, 0.0) == 15
    assert percentile(range(1, 101), 0.95) == 95
    assert percentile(range(1, 101), 0.99) == 99
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError, match="within"):
        percentile(values, 95)


def test_bdp_recommendation_with_headroom_and_clamps():
    assert bdp_messages(200.0, 0.05) == pytest.approx(10.0)
    assert max_inflight_for(200.0, 0.05) == 20  # 10 in flight x 2 headroom
    assert max_inflight_for(200.0, 0.0501) == 21  # rounded up, never down
    assert max_inflight_for(0.0, 0.05) == 1  # an idle zone still needs a window of one
    assert max_inflight_for(1e6, 10.0) == 65535  # MQTT's packet-id space is the ceiling
    with pytest.raises(ValueError, match="negative"):
        bdp_messages(-1.0, 0.1)


def test_queue_recommendation():
    assert max_mqueue_len_for(1000) == 1500
    assert max_mqueue_len_for(7) == 11  # 10.5 rounded up
    assert max_mqueue_len_for(0) == 1  # 0 would mean "no limit"
    assert MQUEUE_HEADROOM == 1.5 and INFLIGHT_HEADROOM == 2.0


def test_max_inflight_is_sized_on_the_busiest_window_and_says_why():
    windows = [
        WindowKpi(T0, 100.0, 10.0, None),  # 1 in flight
        WindowKpi(T0 + dt.timedelta(minutes=5), 400.0, 50.0, None, inflight_full=12),  # 20 in flight
        WindowKpi(T0 + dt.timedelta(minutes=10), None, None, None),
    ]
    rec = recommend_max_inflight("external", windows, 32)
    assert (rec.recommended, rec.current, rec.window_start) == (40, 32, windows[1].window_start)
    assert rec.changes
    assert "400 msg/s" in rec.reason and "50 ms" in rec.reason and "x2 headroom = 40" in rec.reason
    assert "filled 12 times" in rec.reason
    clamped = recommend_max_inflight("z", [WindowKpi(T0, 1e6, 1e4, None)], 32)
    assert clamped.recommended == 65535 and "clamped" in clamped.reason
    none = recommend_max_inflight("z", windows[2:], 32)
    assert none.recommended is None and not none.changes and "no acknowledged" in none.reason


def test_a_full_queue_asks_for_a_larger_one():
    windows = [
        WindowKpi(T0, None, None, 40.0),
        WindowKpi(T0 + dt.timedelta(minutes=5), None, None, 100.0, drops_queue_full=25),
    ]
    rec = recommend_max_mqueue_len("external", windows, 100)
    assert rec.recommended == 150 and rec.recommended > rec.current
    assert "dropped 25 messages (queue_full)" in rec.reason and "current 100" in rec.reason
    # sessions that never came back show no backlog, but their queue_full drops show a full queue
    unseen = recommend_max_mqueue_len("z", [WindowKpi(T0, None, None, None, drops_queue_full=3)], 100)
    assert unseen.recommended == 150 and "dropped 3 messages" in unseen.reason
    quiet = recommend_max_mqueue_len("z", [WindowKpi(T0, None, None, None)], 100)
    assert quiet.recommended is None and "no offline backlog" in quiet.reason


def _row(zone: str, minute: int, **kw):
    base = {
        "zone": zone,
        "window_start": T0 + dt.timedelta(minutes=minute),
        "window_end": T0 + dt.timedelta(minutes=minute + 5),
        "publishes": 10,
        "deliveries": 10,
        "retransmits": 1,
        "latency_p50_ms": 1.0,
        "latency_p95_ms": 2.0,
        "latency_p99_ms": 3.0,
        "ack_rtt_p95_ms": 4.0,
        "duplicate_ratio": 0.1,
        "session_rate_p95": 2.0,
        "inflight_utilisation_p95": 0.5,
        "inflight_full": 0,
        "queue_depth_p50": 0,
        "queue_depth_p95": 1,
        "queue_depth_p99": 2,
        "offline_backlog_p99": None,
        "drops_total": 0,
        "drops": {},
        "takeovers": 0,
        "keepalive_timeouts": 0,
    }
    return {**base, **kw}


def test_markdown_report_sums_counts_and_shows_reasons():
    rows = [
        _row("external", 0, drops_total=3, drops={"queue_full": 2, "expired": 1}, takeovers=1),
        _row("external", 5, latency_p99_ms=9.0, drops_total=1, drops={"queue_full": 1}),
        _row("internal", 0, keepalive_timeouts=2),
    ]
    recs = [Recommendation("external", "max_mqueue_len", 100, 150, "because", T0)]
    md = render.markdown(rows, recs, window="5m", plots={"external": "plots/zone-0.png"})
    summary = next(line for line in md.splitlines() if line.startswith("| external | 2 |"))
    assert "| 20 | 20 | 0.1 | 9 |" in summary  # publishes, deliveries, dup ratio, worst p99 latency
    assert "expired 1, queue_full 3" in summary
    assert "| internal | 1 |" in md and "| 150 **(change)** | because |" in md
    assert "![zone external](plots/zone-0.png)" in md


def test_patch_is_an_mqttzone_per_changed_zone():
    recs = [
        Recommendation("external", "max_inflight", 32, 64, "bdp", T0),
        Recommendation("external", "max_mqueue_len", 1000, 1500, "backlog: 1000", T0),
        Recommendation("internal", "max_inflight", 128, 128, "fits", T0),  # no change: left out
        Recommendation("quiet", "max_mqueue_len", 100, None, "no data"),
    ]
    text = render.mqttzone_patch(recs)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert docs == [
        {
            "apiVersion": "fleetmq.io/v1alpha1",
            "kind": "MqttZone",
            "metadata": {"name": "external"},
            "spec": {"session": {"maxInflight": 64, "maxMqueueLen": 1500}},
        }
    ]
    assert "# backlog: 1000" in text and "kubectl apply --server-side" in text
    assert "No zone needs a change" in render.mqttzone_patch(recs[2:])


def test_stream_entries_become_typed_rows_and_bad_values_are_named():
    row, bad = parse_entry(
        "1-0",
        {"eid": "a-1", "ts_ms": "1767225600000.5", "msg_id": "4611686018427387905", "qos": "x", "new": "y"},
    )
    assert (row["stream_id"], row["eid"], row["ts_ms"], row["msg_id"]) == (
        "1-0",
        "a-1",
        1767225600000.5,
        2**62 + 1,
    )
    assert row["qos"] is None and bad == ["qos"] and "new" not in row
    assert utc_date(1767225600000.5) == "2026-01-01"
    assert escape_partition("a/b=c") == "a%2Fb%3Dc" and escape_partition(None) == "__HIVE_DEFAULT_PARTITION__"
