"""Rendering the fleet's Redis: the managed one in each mode (servers, sentinels, the cluster's Job, their
Services, budgets, placement, resources, probes), its password, and the store section of the broker config
for managed and existing Redis alike (validated by the broker's own model)."""

from __future__ import annotations

import json

import pytest
import yaml
from fleetmq.broker.config import BrokerConfig, RedisStoreConfig
from fleetmq.operator import render
from fleetmq.operator.crds import BrokerFleetSpec, RedisSpec
from fleetmq.operator.status import Observed, fleet_status

from .operator_support import broker_sts, by_kind, fleet, rendered, zone


def named(r: render.Rendered, kind: str, name: str) -> dict:
    (obj,) = [m for m in by_kind(r, kind) if m["metadata"]["name"] == name]
    return obj


def store_of(r: render.Rendered) -> RedisStoreConfig:
    """The store the brokers read, through the broker's own model (as the config file reaches them)."""
    text = by_kind(r, "ConfigMap")[0]["data"][render.CONFIG_KEY]
    store = BrokerConfig.model_validate(yaml.safe_load(text)).store
    assert isinstance(store, RedisStoreConfig)
    return store


def container(sts: dict) -> dict:
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c["env"]}


def test_managed_redis_is_sentinel_by_default_and_brokers_get_its_contract():
    r = rendered(fleet(), zone("external"))
    store = store_of(r)
    assert store.topology == "sentinel" and store.wait_replicas == 1
    assert store.sentinel is not None and store.sentinel.master == "edge"
    assert store.sentinel.nodes == [
        f"edge-redis-sentinel-{i}.edge-redis-sentinel.mq.svc:26379" for i in range(3)
    ]
    assert store.password_file == store.sentinel.password_file == "/etc/fleetmq/redis/password"
    pod = broker_sts(r)["spec"]["template"]["spec"]
    assert {"name": "redis-auth", "secret": {"secretName": "edge-redis-auth", "items": [
        {"key": "password", "path": "password"}]}} in pod["volumes"]  # fmt: skip
    assert {"name": "redis-auth", "mountPath": "/etc/fleetmq/redis", "readOnly": True} in container(
        broker_sts(r)
    )["volumeMounts"]
    # the password Secret is created once by the operator, never rendered (so never re-applied); the one
    # Secret rendered is the bridges' (empty here)
    assert [(s["metadata"]["name"], s["data"]) for s in by_kind(r, "Secret")] == [
        ("edge-bridge-secrets", {}),
        ("edge-mqttusers", {}),
    ]


def test_sentinel_mode_servers_and_sentinels():
    r = rendered(fleet(), zone("external"))
    servers, sentinels = named(r, "StatefulSet", "edge-redis"), named(r, "StatefulSet", "edge-redis-sentinel")
    assert servers["spec"]["replicas"] == 3 and sentinels["spec"]["replicas"] == 3  # a primary, 2 replicas
    assert servers["spec"]["podManagementPolicy"] == "Parallel"
    assert servers["spec"]["serviceName"] == "edge-redis"
    c = container(servers)
    assert c["command"] == ["sh", "/scripts/redis.sh", "server"]
    e = env(c)
    assert e["REDIS_MODE"] == "sentinel" and e["REDIS_SELF"] == "$(POD_NAME).edge-redis.mq.svc:6379"
    assert c["env"][0]["name"] == "POD_NAME"  # defined before what expands it
    assert e["REDIS_NODES"].split() == [f"edge-redis-{i}.edge-redis.mq.svc:6379" for i in range(3)]
    assert e["SENTINEL_NODES"].split() == [
        f"edge-redis-sentinel-{i}.edge-redis-sentinel.mq.svc:26379" for i in range(3)
    ]
    assert e["SENTINEL_MASTER"] == "edge" and e["REDIS_APPENDFSYNC"] == "everysec"
    assert e["REDIS_PASSWORD_FILE"] == "/etc/redis-auth/password"
    assert e["REDIS_MAXMEMORY"] == str(int(256 * 2**20 * 0.7))
    assert c["readinessProbe"]["exec"]["command"] == ["sh", "/scripts/redis.sh", "ready"]
    assert c["livenessProbe"]["exec"]["command"][-1] == "live"
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "prestop"
    (claim,) = servers["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    retention = servers["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": "Delete", "whenScaled": "Retain"}  # the data goes with the fleet
    s = container(sentinels)
    assert s["command"][-1] == "sentinel" and env(s)["SENTINEL_SELF"] == (
        "$(POD_NAME).edge-redis-sentinel.mq.svc:26379"
    )
    assert s["readinessProbe"]["exec"]["command"][-1] == "sentinel-ready"
    assert s["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "50m", "memory": "64Mi"},
    }
    for name, port in (("edge-redis", 6379), ("edge-redis-sentinel", 26379)):
        svc = named(r, "Service", name)
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert svc["spec"]["ports"][0]["port"] == port


@pytest.mark.parametrize("mode", ["sentinel", "cluster", "standalone"])
def test_every_redis_pod_is_guaranteed_spread_budgeted_and_has_the_script_and_password(mode):
    r = rendered(fleet(redis={"managed": True, "mode": mode}), zone("external"))
    workloads = render.store_workloads(r.manifests)
    assert workloads
    scripts = named(r, "ConfigMap", "edge-redis-scripts")
    assert scripts["data"] == {"redis.sh": render.SCRIPT_TEXT}
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        component = w["spec"]["template"]["metadata"]["labels"][render.L_COMPONENT]
        for c in pod["containers"]:
            res = c["resources"]
            assert res["requests"] == res["limits"] and set(res["limits"]) == {"cpu", "memory"}, c["name"]
            assert c["securityContext"] == render.RESTRICTED_CONTAINER
            assert {"name": "auth", "mountPath": "/etc/redis-auth", "readOnly": True} in c["volumeMounts"]
        assert {"name": "auth", "secret": {"secretName": "edge-redis-auth", "defaultMode": 0o440}} in pod[
            "volumes"
        ]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        if w["kind"] == "StatefulSet":
            (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            assert term["podAffinityTerm"]["labelSelector"]["matchLabels"][render.L_COMPONENT] == component
            budget = named(r, "PodDisruptionBudget", w["metadata"]["name"])
            assert budget["spec"]["maxUnavailable"] == 1
            assert budget["spec"]["selector"]["matchLabels"] == w["spec"]["selector"]["matchLabels"]
    # the password reaches Redis only as the mounted Secret: no config map or variable carries one
    assert "secretKeyRef" not in json.dumps(r.manifests)
    assert [s["metadata"]["name"] for s in by_kind(r, "Secret")] == ["edge-bridge-secrets", "edge-mqttusers"]


def test_cluster_mode():
    r = rendered(fleet(redis={"managed": True, "mode": "cluster"}), zone("external"))
    servers = named(r, "StatefulSet", "edge-redis")
    assert servers["spec"]["replicas"] == 6  # 3 shards, a replica each
    store = store_of(r)
    assert store.topology == "cluster" and store.wait_replicas == 1
    assert store.cluster is not None and store.cluster.nodes == [
        f"edge-redis-{i}.edge-redis.mq.svc:6379" for i in range(6)
    ]
    assert store.password_file == "/etc/fleetmq/redis/password"
    c = container(servers)
    assert env(c)["REDIS_MODE"] == "cluster" and "SENTINEL_NODES" not in env(c)
    assert {p["containerPort"] for p in c["ports"]} == {6379, 16379}
    assert "lifecycle" not in c and c["readinessProbe"]["timeoutSeconds"] >= 10
    assert not [m for m in r.manifests if "sentinel" in m["metadata"]["name"]]
    (job,) = by_kind(r, "Job")
    assert job["metadata"]["name"].startswith("edge-redis-cluster-")
    jc = job["spec"]["template"]["spec"]["containers"][0]
    assert jc["command"][-1] == "cluster-create" and env(jc)["CLUSTER_REPLICAS"] == "1"
    assert env(jc)["REDIS_NODES"] == env(c)["REDIS_NODES"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    # the same fleet renders the same Job (nothing to re-run); a new image is a new Job
    again = rendered(fleet(redis={"managed": True, "mode": "cluster"}), zone("external"))
    assert by_kind(again, "Job")[0]["metadata"]["name"] == job["metadata"]["name"]
    other = rendered(
        fleet(redis={"managed": True, "mode": "cluster", "image": "redis:7.2"}), zone("external")
    )
    assert by_kind(other, "Job")[0]["metadata"]["name"] != job["metadata"]["name"]
    bigger = rendered(fleet(redis={"managed": True, "mode": "cluster", "shards": 4, "replicas": 2}))
    assert named(bigger, "StatefulSet", "edge-redis")["spec"]["replicas"] == 12
    assert (
        store_of(rendered(fleet(redis={"managed": True, "mode": "cluster", "replicas": 0}))).wait_replicas
        == 0
    )


def test_standalone_mode_for_development():
    r = rendered(fleet(redis={"managed": True, "mode": "standalone"}), zone("external"))
    servers = named(r, "StatefulSet", "edge-redis")
    assert servers["spec"]["replicas"] == 1 and "podManagementPolicy" not in servers["spec"]
    store = store_of(r)
    assert (store.url, store.password_file, store.wait_replicas) == (
        "redis://edge-redis.mq.svc:6379/0", "/etc/fleetmq/redis/password", 0,
    )  # fmt: skip
    assert (
        "clusterIP" not in named(r, "Service", "edge-redis")["spec"]
    )  # a ClusterIP Service, as the url says
    assert servers["spec"]["volumeClaimTemplates"]  # persistent by default
    assert not by_kind(r, "Job") and len(by_kind(r, "StatefulSet")) == 2
    dev = rendered(fleet(redis={"managed": True, "mode": "standalone", "storage": ""}))
    pod = named(dev, "StatefulSet", "edge-redis")
    assert "volumeClaimTemplates" not in pod["spec"]
    assert {"name": "data", "emptyDir": {}} in pod["spec"]["template"]["spec"]["volumes"]


def test_settings_of_the_managed_redis():
    spec = {"managed": True, "replicas": 1, "sentinels": 5, "storage": "20Gi", "storageClassName": "fast",
            "appendfsync": "always", "resources": {"cpu": "1", "memory": "2Gi"}, "image": "redis:7.2",
            "waitReplicas": 0, "scheduling": {"antiAffinity": "required", "nodeSelector": {"disk": "ssd"}}}  # fmt: skip
    r = rendered(fleet(redis=spec), zone("external"))
    servers, sentinels = named(r, "StatefulSet", "edge-redis"), named(r, "StatefulSet", "edge-redis-sentinel")
    assert (servers["spec"]["replicas"], sentinels["spec"]["replicas"]) == (2, 5)
    assert store_of(r).wait_replicas == 0  # as set
    assert len(store_of(r).sentinel.nodes) == 5
    (claim,) = servers["spec"]["volumeClaimTemplates"]
    assert (
        claim["spec"]["storageClassName"] == "fast"
        and claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    )
    c = container(servers)
    assert c["image"] == "redis:7.2" and env(c)["REDIS_APPENDFSYNC"] == "always"
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"} == c["resources"]["requests"]
    assert env(c)["REDIS_MAXMEMORY"] == str(int(2 * 2**30 * 0.7))
    for sts in (servers, sentinels):
        pod = sts["spec"]["template"]["spec"]
        assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert pod["nodeSelector"] == {"disk": "ssd"}


def test_redis_defaults_follow_the_mode():
    assert [RedisSpec(managed=True, mode=m).replicas_per_primary for m in ("sentinel", "cluster", "standalone")] == [
        2, 1, 0,
    ]  # fmt: skip
    assert [RedisSpec(managed=True, mode=m).wait_replicas for m in ("sentinel", "cluster", "standalone")] == [
        1,
        1,
        0,
    ]
    assert RedisSpec(managed=True, waitReplicas=2).wait_replicas == 2
    assert RedisSpec(url="redis://x:6379/0").wait_replicas == 0


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("256Mi", 256 * 2**20), ("1Gi", 2**30), ("1G", 10**9), ("500k", 500_000), (1024, 1024), ("1e3", 1000),
     ("bad", None)],
)  # fmt: skip
def test_memory_quantities(quantity, expected):
    assert render.quantity_bytes(quantity) == expected


def test_password_secret_is_owned_by_the_fleet():
    secret = render.redis_auth_secret(render.Fleet.parse(fleet()), "pw")
    assert secret["metadata"]["name"] == "edge-redis-auth" and secret["stringData"] == {"password": "pw"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_existing_sentinel_and_cluster_stores():
    sentinel = {"nodes": ["s1.example:26379", "s2.example:26379"], "master": "mymaster",
                "secretRef": {"name": "sentinel-pw"}}  # fmt: skip
    r = rendered(fleet(redis={"sentinel": sentinel, "secretRef": {"name": "redis-pw"}, "waitReplicas": 1}))
    store = store_of(r)
    assert store.sentinel is not None and store.sentinel.nodes == ["s1.example:26379", "s2.example:26379"]
    assert (
        store.sentinel.master == "mymaster"
        and store.sentinel.password_file == "/etc/fleetmq/redis-sentinel/password"
    )
    assert store.password_file == "/etc/fleetmq/redis/password" and store.wait_replicas == 1
    volumes = {v["name"]: v["secret"]["secretName"] for v in broker_sts(r)["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}  # fmt: skip
    assert volumes == {"redis-auth": "redis-pw", "redis-sentinel-auth": "sentinel-pw",
                       "bridge-secrets": "edge-bridge-secrets", "fleet-users": "edge-mqttusers"}  # fmt: skip
    assert not render.store_workloads(r.manifests) and not [
        m for m in r.manifests if "redis" in m["metadata"]["name"]
    ]

    r = rendered(fleet(redis={"cluster": {"nodes": ["c1.example:6379"]}}))
    store = store_of(r)
    assert (
        store.cluster is not None
        and store.cluster.nodes == ["c1.example:6379"]
        and store.password_file is None
    )
    secrets = [v["name"] for v in broker_sts(r)["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert secrets == ["bridge-secrets", "fleet-users"]  # (no Redis password)


def _sts(ready: int) -> dict:
    return {"status": {"readyReplicas": ready}}


def test_store_status_from_the_redis_pods_and_the_brokers_reports():
    f = fleet()
    r = rendered(f, zone("external"))
    report = {"config_hash": r.config_hash, "store_primary": "edge-redis-1.edge-redis.mq.svc:6379",
              "store_failovers": "1", "store_replicas_in_sync": "2"}  # fmt: skip
    observed = Observed(
        nodeinfo={
            "edge-0": report,
            "edge-1": report | {"store_replicas_in_sync": "1", "store_failovers": "0"},
        },
        store_children={"StatefulSet/edge-redis": _sts(3), "StatefulSet/edge-redis-sentinel": _sts(3)},
    )
    st = fleet_status(render.Fleet.parse(f), r, "", observed)
    assert st["store"] == {"mode": "sentinel", "managed": True, "readyPods": 6, "wantedPods": 6,
                           "primary": "edge-redis-1.edge-redis.mq.svc:6379", "failovers": 1,
                           "replicasInSync": 1}  # fmt: skip
    cond = next(c for c in st["conditions"] if c["type"] == "StoreReady")
    assert cond["status"] == "True" and "6/6 Redis pods ready" in cond["message"]
    assert "edge-redis-1.edge-redis.mq.svc:6379" in cond["message"]

    observed.store_children["StatefulSet/edge-redis-sentinel"] = _sts(1)
    cond = next(
        c
        for c in fleet_status(render.Fleet.parse(f), r, "", observed)["conditions"]
        if c["type"] == "StoreReady"
    )
    assert (cond["status"], cond["reason"]) == ("False", "PodsNotReady") and "4/6" in cond["message"]

    # acks wait for one replica: none in sync means publishes are not acknowledged
    observed.store_children["StatefulSet/edge-redis-sentinel"] = _sts(3)
    observed.nodeinfo = {"edge-0": report | {"store_replicas_in_sync": "0"}}
    st = fleet_status(render.Fleet.parse(f), r, "", observed)
    cond = next(c for c in st["conditions"] if c["type"] == "StoreReady")
    assert (cond["status"], cond["reason"]) == ("False", "ReplicasNotInSync")
    assert st["store"]["replicasInSync"] == 0


def test_store_status_of_a_cluster_waits_for_its_job_and_of_an_existing_redis_for_an_answer():
    f = fleet(redis={"managed": True, "mode": "cluster"})
    r = rendered(f, zone("external"))
    job = f"Job/{by_kind(r, 'Job')[0]['metadata']['name']}"
    observed = Observed(store_children={"StatefulSet/edge-redis": _sts(6), job: {"status": {"active": 1}}})
    st = fleet_status(render.Fleet.parse(f), r, "", observed)
    cond = next(c for c in st["conditions"] if c["type"] == "StoreReady")
    assert (cond["reason"], st["store"]["wantedPods"]) == ("ClusterForming", 6)
    observed.store_children[job] = {"status": {"succeeded": 1}}
    cond = next(
        c
        for c in fleet_status(render.Fleet.parse(f), r, "", observed)["conditions"]
        if c["type"] == "StoreReady"
    )
    assert cond["status"] == "True"

    f = fleet(redis={"sentinel": {"nodes": ["s:26379"], "master": "m"}})
    r = rendered(f, zone("external"))
    st = fleet_status(
        render.Fleet.parse(f), r, "", Observed(nodeinfo=None, nodeinfo_error="connection refused")
    )
    cond = next(c for c in st["conditions"] if c["type"] == "StoreReady")
    assert (cond["status"], cond["reason"]) == ("False", "Unreachable") and "connection refused" in cond[
        "message"
    ]
    assert st["store"]["mode"] == "sentinel" and st["store"]["managed"] is False
    assert st["store"]["wantedPods"] is None
    st = fleet_status(render.Fleet.parse(f), r, "", Observed(nodeinfo={}))
    assert next(c for c in st["conditions"] if c["type"] == "StoreReady")["status"] == "True"


def test_a_redis_of_another_topology_is_left_running_and_said():
    r = rendered(fleet(), zone("external"))
    ours = named(r, "StatefulSet", "edge-redis")
    assert ours["metadata"]["labels"][render.L_REDIS_MODE] == "sentinel"
    spec = BrokerFleetSpec.model_validate(fleet()["spec"])
    render.check_redis_topology(spec, None)
    render.check_redis_topology(spec, ours)
    legacy = {"metadata": {"name": "edge-redis", "labels": {render.L_COMPONENT: "redis"}}}
    with pytest.raises(render.RenderError, match=r"runs a single server \(made before redis\.mode existed\)"):
        render.check_redis_topology(spec, legacy)
    standalone = named(
        rendered(fleet(redis={"managed": True, "mode": "standalone"})), "StatefulSet", "edge-redis"
    )
    with pytest.raises(render.RenderError, match="runs mode standalone, not mode sentinel"):
        render.check_redis_topology(spec, standalone)
