"""What every node reports to the operator in Redis (`fmq:nodeinfo:{<node>}`): the hash of the config it
applied, its connections and sessions."""

from __future__ import annotations

import json

import pytest
from fleetmq.broker.store import keys

from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBLISH
from tests.support import wait_until

pytestmark = pytest.mark.redis


def nodeinfo(redis_server, node: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in redis_server.hgetall(keys.nodeinfo(node)).items()}


def test_nodes_report_config_hash_connections_and_sessions(fleet, redis_server):
    _, b = fleet(2)
    applied = json.loads(b.http_get("/readyz")[1])["config_hash"]
    wait_until(lambda: nodeinfo(redis_server, "node-1").get("config_hash") == applied, timeout=5)
    clients = [raw_connect(b, uid("info"), 5)[0] for _ in range(3)]
    wait_until(
        lambda: nodeinfo(redis_server, "node-1").get("connections") == "3", timeout=5, msg="3 connections"
    )
    info = nodeinfo(redis_server, "node-1")
    assert info["sessions"] == "3" and int(info["ts_ms"]) > 0
    # running totals, whose rates the operator's autoscaler takes between two reports
    delivered, cpu = int(info["delivered"]), float(info["cpu_seconds"])
    assert cpu > 0
    sub, pub = clients[0], clients[1]
    sub.subscribe([("info/t", 1)])
    for _ in range(5):
        pub.publish("info/t", b"x", qos=1)
        sub.ack(sub.expect(PUBLISH))
    wait_until(lambda: int(nodeinfo(redis_server, "node-1")["delivered"]) == delivered + 5, timeout=10,
               msg="5 more delivered")  # fmt: skip
    assert float(nodeinfo(redis_server, "node-1")["cpu_seconds"]) > cpu
    assert 0 < int(redis_server.command("PTTL", keys.nodeinfo("node-1"))) <= 15000
    for c in clients:
        c.close()
    b.stop()
    assert nodeinfo(redis_server, "node-1") == {}  # a drained node removes its report
    assert nodeinfo(redis_server, "node-0")["connections"] == "0"
