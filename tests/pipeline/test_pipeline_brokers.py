"""Issue 7's proof with real parts: two broker nodes with the event log on (a real redis-server), a
scenario with known drops (a full offline queue), retransmits (a client that stops acking) and a
takeover; then `fleetmq-pipeline export` and `report` as processes, and the report shows exactly that."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBACK, PUBLISH

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]

QUEUE = 10  # the zone's max_mqueue_len
PUBLISHED = 25  # to the offline session: 15 of them push older ones out


def pipeline(*args: str) -> None:
    cmd = [sys.executable, "-m", "fleetmq.pipeline.cli", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]


def test_report_on_real_brokers_shows_drops_retransmits_takeover(fleet, redis_server, spark, tmp_path):
    zone = {"max_mqueue_len": QUEUE, "retry_interval": "1s"}
    a, b = fleet(2, zone, {"event_log": {"enabled": True, "fleet": "edge"}})
    topic = uid("pipeline/")
    # a persistent session, offline, whose queue overflows
    offline_id = uid("offline")
    c, _ = raw_connect(a, offline_id, 5)
    c.subscribe([(topic + "/q", 1)])
    c.close()
    time.sleep(0.3)
    pub, _ = raw_connect(b, uid("pub"), 5)
    for i in range(PUBLISHED):
        pub.publish(topic + "/q", b"%d" % i, qos=1)
    assert len(pub.recv_n(PUBLISHED, timeout=10, ptype=PUBACK)) == PUBLISHED
    # an MQTT 3.1.1 subscriber that stops acking: the broker resends after retry_interval
    lazy_id = uid("lazy")
    lazy, _ = raw_connect(a, lazy_id, 4)
    lazy.subscribe([(topic + "/r", 1)])
    time.sleep(0.3)
    for i in range(3):
        pub.publish(topic + "/r", b"r%d" % i, qos=1)
    first = lazy.recv_n(3, timeout=5, ptype=PUBLISH)
    resent = lazy.recv_n(3, timeout=5, ptype=PUBLISH)
    assert all(p.dup for p in resent) and [p.packet_id for p in resent] == [p.packet_id for p in first]
    # the same client on the other node: a takeover
    _taker, ack = raw_connect(b, lazy_id, 4)
    assert ack.session_present
    c, _ = raw_connect(a, offline_id, 5)  # the offline session comes back to its 10 newest messages
    assert [p.payload for p in c.recv_n(QUEUE, timeout=10, ptype=PUBLISH)] == [
        b"%d" % i for i in range(PUBLISHED - QUEUE, PUBLISHED)
    ]
    for bp in (a, b):  # the logs flush every 100 ms; stopping a node sends what it holds
        bp.stop()

    data, out = tmp_path / "data", tmp_path / "report"
    pipeline("export", "--redis-url", redis_server.url, "--fleet", "edge", "--out", str(data), "--once")
    pipeline("report", "--in", str(data), "--out", str(out), "--window", "1h")

    kpis = spark.read.parquet(str(out / "zone_kpis")).collect()
    default = [r for r in kpis if r["zone"] == "default"]
    assert sum(r["drops"].get("queue_full", 0) for r in default) == PUBLISHED - QUEUE
    assert sum(r["takeovers"] for r in default) == 1
    assert sum(r["retransmits"] for r in default) >= 3
    recs = {r["setting"]: r for r in spark.read.parquet(str(out / "zone_recommendations")).collect()}
    queue = recs["max_mqueue_len"]
    assert queue["current"] == QUEUE and queue["recommended"] > QUEUE, queue
    patch = [d for d in yaml.safe_load_all((out / "mqttzone-patch.yaml").read_text()) if d]
    assert any(p["spec"]["session"].get("maxMqueueLen", 0) > QUEUE for p in patch)
