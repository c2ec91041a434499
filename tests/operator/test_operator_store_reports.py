"""The fleet's status reads the brokers' reports from its Redis connected the way a broker is, whatever the
topology: through Sentinel (a real broker on the rendered config, real redis-server and redis-sentinel
processes; a failover shows in status.store), and from a Redis Cluster with a password (formed by
operator/redis.sh on loopback; the reports written as brokers write them)."""

from __future__ import annotations

import pytest
import yaml
from fleetmq.broker.store import keys
from fleetmq.operator import render
from redis.cluster import ClusterNode, RedisCluster

from tests.support import HOST, free_port

from .conftest import fleet, wait_for, zone
from .support import PASSWORD, ScriptedRedis, config_with_zone, free_cluster_port, run_script, start_pod

pytestmark = pytest.mark.redis


def store_status(k) -> dict:
    return ((k.get("brokerfleet", "edge") or {}).get("status") or {}).get("store") or {}


def test_status_follows_the_primary_through_sentinel(k, run_operator, replicated_redis, tmp_path):
    rr = replicated_redis
    mqtt_port, metrics_port = free_port(), free_port()
    run_operator()
    sentinel = {"nodes": [s.address for s in rr.sentinels], "master": rr.master}
    k.apply(
        fleet(replicas=1, redis={"sentinel": sentinel, "waitReplicas": 1}, metrics={"port": metrics_port})
    )
    k.apply(zone(listeners=[{"name": "mqtt", "port": mqtt_port}]))
    config_path = tmp_path / "broker.yaml"
    config_path.write_text(config_with_zone(k))
    assert yaml.safe_load(config_path.read_text())["store"] == {"kind": "redis", "sentinel": sentinel,
                                                                 "wait_replicas": 1}  # fmt: skip
    bp = start_pod(config_path, "edge-0", mqtt_port, metrics_port, tmp_path)
    try:
        old = rr.primary()
        st = wait_for(lambda: (s := store_status(k)).get("primary") == f"{HOST}:{old.port}"
                      and s.get("replicasInSync") == 2 and s, timeout=30, msg="the primary in status")  # fmt: skip
        assert (st["mode"], st["managed"], st["failovers"]) == ("sentinel", False, 0)
        cond = k.condition("brokerfleet", "edge", "StoreReady")
        assert (cond["status"], cond["reason"]) == ("True", "Reachable") and f"{HOST}:{old.port}" in cond[
            "message"
        ]

        old.kill()
        new = rr.wait_failover(old)
        st = wait_for(lambda: (s := store_status(k)).get("primary") == f"{HOST}:{new.port}" and s,
                      timeout=60, msg="the new primary in status")  # fmt: skip
        assert st["failovers"] == 1 and bp.alive()
        # one replica left: acks still have the one replica they wait for
        wait_for(lambda: store_status(k).get("replicasInSync") == 1, timeout=30, msg="1 replica in sync")
        assert k.condition("brokerfleet", "edge", "StoreReady")["status"] == "True"
    finally:
        bp.stop()


def test_status_reads_reports_from_a_redis_cluster_with_a_password(k, run_operator, tmp_path):
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    ports = [free_cluster_port() for _ in range(6)]
    nodes = [f"{HOST}:{p}" for p in ports]
    common = {"REDIS_PASSWORD_FILE": str(password_file), "REDIS_MODE": "cluster", "REDIS_BIND": HOST,
              "REDIS_NODES": " ".join(nodes), "CLUSTER_REPLICAS": "1"}  # fmt: skip
    servers = [
        ScriptedRedis(tmp_path / f"redis-{i}", port, "server", common | {
            "REDIS_SELF": nodes[i], "REDIS_PORT": str(port), "REDIS_CONF_DIR": str(tmp_path / f"conf-{i}"),
            "REDIS_DATA_DIR": str(tmp_path / f"redis-{i}")})
        for i, port in enumerate(ports)
    ]  # fmt: skip
    try:
        for s in servers:
            s.start()
        out = run_script("cluster-create", common, timeout=120)
        assert out.returncode == 0, out.stderr
        k("create", "secret", "generic", "redis-pw", f"--from-literal=password={PASSWORD}")
        run_operator()
        k.apply(fleet(replicas=2, redis={"cluster": {"nodes": nodes[:2]}, "secretRef": {"name": "redis-pw"}}))
        k.apply(zone())
        config_with_zone(k)
        config_hash = k.get("configmap", "edge-config")["metadata"]["annotations"][render.A_CONFIG_HASH]
        # what two brokers write in their heartbeat (keys in different slots: the reader follows the cluster)
        client = RedisCluster(startup_nodes=[ClusterNode(HOST, p) for p in ports], password=PASSWORD)
        try:
            for pod, in_sync in (("edge-0", 1), ("edge-1", 0)):
                client.hset(keys.nodeinfo(pod), mapping={
                    "config_hash": config_hash, "connections": 3, "sessions": 2, "store_primary": nodes[0],
                    "store_failovers": 0, "store_replicas_in_sync": in_sync})  # fmt: skip
        finally:
            client.close()
        st = wait_for(lambda: (s := k.get("brokerfleet", "edge")["status"]).get("connections") == 6 and s,
                      timeout=30, msg="both reports read")  # fmt: skip
        assert [p["name"] for p in st["pods"]] == ["edge-0", "edge-1"]
        assert (st["store"]["mode"], st["store"]["managed"]) == ("cluster", False)
        assert (st["store"]["primary"], st["store"]["replicasInSync"]) == (nodes[0], 0)
        assert k.condition("brokerfleet", "edge", "ConfigApplied")["status"] == "True"
        cond = k.condition("brokerfleet", "edge", "StoreReady")
        assert (cond["status"], cond["reason"]) == ("True", "Reachable")  # waitReplicas 0: nothing waits
    finally:
        for s in servers:
            s.stop()
