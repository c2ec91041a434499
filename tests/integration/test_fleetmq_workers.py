"""`--workers N`: one broker pod on several cores. N processes share the listening port (SO_REUSEPORT),
each a node of the fleet in Redis, behind one /metrics + /readyz; without Redis the option is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBACK, PUBLISH
from tests.support import wait_until

pytestmark = pytest.mark.redis


def test_workers_need_the_redis_store(tmp_path):
    cmd = [sys.executable, "-m", "fleetmq.broker", "--workers", "2", "--listen", "127.0.0.1:0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 2
    assert "--workers 2 needs the Redis session store" in out.stderr


def readyz(bp) -> dict:
    return json.loads(bp.http_get("/readyz")[1])


def per_worker_connections(bp) -> list[float]:
    return [bp.metric("fleetmq_connections", worker=str(i)) for i in range(2)]


def test_workers_share_the_port_and_behave_as_one_broker(fleet):
    (bp,) = fleet(1, extra_args=("--workers", "2"))
    wait_until(lambda: readyz(bp)["ready"], timeout=10, msg="both workers ready")
    info = readyz(bp)
    assert [w["node_id"] for w in info["workers"]] == ["node-0-0", "node-0-1"]
    assert info["config_hash"] == info["workers"][0]["config_hash"]

    topic = uid("workers/")
    subs = []
    for _ in range(12):
        c, _ack = raw_connect(bp, uid("sub"), 5)
        c.subscribe([(topic, 1)])
        subs.append(c)
    counts = per_worker_connections(bp)
    assert sum(counts) == 12 and min(counts) > 0, counts  # the kernel spread them over both workers
    time.sleep(0.5)  # routes reach the other worker through Redis
    pub, _ = raw_connect(bp, uid("pub"), 5)
    for i in range(10):
        pub.publish(topic, b"%d" % i, qos=1)
    assert len(pub.recv_n(10, timeout=10, ptype=PUBACK)) == 10
    for c in subs:  # subscribers on both workers got everything, in order
        assert [p.payload for p in c.recv_n(10, timeout=10, ptype=PUBLISH)] == [b"%d" % i for i in range(10)]

    # a persistent session moves between workers like between pods
    cid = uid("mover")
    c, _ = raw_connect(bp, cid, 5)
    c.subscribe([(topic + "/q", 1)])
    c.close()
    time.sleep(0.3)
    pub.publish(topic + "/q", b"queued", qos=1)
    assert pub.expect(PUBACK, timeout=5).reason == 0
    for _ in range(4):  # whichever worker each reconnect lands on, the session follows
        c, ack = raw_connect(bp, cid, 5)
        assert ack.session_present
        c.close()
    c, _ = raw_connect(bp, cid, 5)
    assert [p.payload for p in c.recv_n(1, timeout=5, ptype=PUBLISH)] == [b"queued"]

    # a worker that dies is restarted by the supervisor
    victim = info["workers"][0]["pid"]
    os.kill(victim, 9)
    wait_until(
        lambda: readyz(bp)["ready"] and readyz(bp)["workers"][0]["pid"] != victim, timeout=15, msg="restarted"
    )
    pids = [w["pid"] for w in readyz(bp)["workers"]]
    bp.stop()
    assert bp.proc.returncode == 0
    for pid in pids:  # the workers drained and exited with the supervisor
        wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), timeout=5, msg=f"worker {pid} gone")
