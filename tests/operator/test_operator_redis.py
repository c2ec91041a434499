"""The managed Redis through the operator (as its ServiceAccount) and a real kube-apiserver, with
kube-controller-manager, kube-scheduler and kwok when built: in each mode the children are accepted and
owned, the Redis pods admitted in a namespace enforcing the restricted Pod Security Standard, the password
Secret is made once and never again, mounted into the brokers and in no ConfigMap, and the fleet's status
says how the store is doing. (kwok runs no containers: redis.sh itself is tested in test_redis_scripts.)"""

from __future__ import annotations

import base64
import json
import time

import pytest
import yaml
from fleetmq.broker.config import BrokerConfig, RedisStoreConfig
from fleetmq.operator import render

from tests import kubeapi

from .conftest import fleet, wait_for, zone
from .support import config_of

EXPECTED = {
    "sentinel": [("statefulset", "edge-redis", 3), ("statefulset", "edge-redis-sentinel", 3),
                 ("service", "edge-redis", None), ("service", "edge-redis-sentinel", None),
                 ("poddisruptionbudget", "edge-redis", None), ("poddisruptionbudget", "edge-redis-sentinel", None)],
    "cluster": [("statefulset", "edge-redis", 6), ("service", "edge-redis", None),
                ("poddisruptionbudget", "edge-redis", None)],
    "standalone": [("statefulset", "edge-redis", 1), ("service", "edge-redis", None),
                   ("poddisruptionbudget", "edge-redis", None)],
}  # fmt: skip


def store(k) -> RedisStoreConfig:
    cm = k.get("configmap", "edge-config")
    cfg = BrokerConfig.model_validate(yaml.safe_load(cm["data"][render.CONFIG_KEY]))
    assert isinstance(cfg.store, RedisStoreConfig)
    return cfg.store


def password(k) -> str:
    return base64.b64decode(k.get("secret", "edge-redis-auth")["data"]["password"]).decode()


def fleet_status(k) -> dict:
    return (k.get("brokerfleet", "edge") or {}).get("status") or {}


def pods(k, component: str) -> list[dict]:
    sel = f"{render.L_INSTANCE}=edge,{render.L_COMPONENT}={component}"
    return json.loads(k("get", "pods", "-l", sel, "-o", "json").stdout)["items"]


@pytest.mark.parametrize("mode", ["sentinel", "cluster", "standalone"])
def test_each_mode_through_the_operator(k, run_operator, control_plane, kube_namespace, mode):
    control_plane.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    run_operator()
    # no volume provisioner in the test cluster: emptyDirs, so the pods can be scheduled
    k.apply(fleet(replicas=1, redis={"managed": True, "mode": mode, "storage": ""}))
    k.apply(zone())
    f = wait_for(lambda: k.get("brokerfleet", "edge"), msg="fleet")
    for kind, name, replicas in EXPECTED[mode]:
        obj = wait_for(lambda kind=kind, name=name: k.get(kind, name), msg=f"{kind} {name}")
        assert obj["metadata"]["ownerReferences"][0]["uid"] == f["metadata"]["uid"]
        if replicas is not None:
            assert obj["spec"]["replicas"] == replicas
    jobs = json.loads(k("get", "jobs", "-o", "json").stdout)["items"]
    assert len(jobs) == (mode == "cluster")

    # the password: a Secret of the fleet, mounted into brokers and Redis alike, in no ConfigMap
    secret = wait_for(lambda: k.get("secret", "edge-redis-auth"), msg="password secret")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == f["metadata"]["uid"]
    pw = password(k)
    assert len(pw) == 48
    configmaps = k("get", "configmaps", "-o", "json").stdout
    assert pw not in configmaps and "edge-redis-scripts" in configmaps
    broker_pod = k.get("statefulset", "edge")["spec"]["template"]["spec"]
    auth = next(v for v in broker_pod["volumes"] if v["name"] == "redis-auth")
    assert auth["secret"]["secretName"] == "edge-redis-auth"
    wait_for(lambda: store(k), msg="config")
    s = store(k)
    assert s.topology == mode and s.password_file == "/etc/fleetmq/redis/password"
    assert s.wait_replicas == (0 if mode == "standalone" else 1)

    # applied without error; the status says what the store is and how far it got
    st = wait_for(lambda: (st := fleet_status(k)).get("store") and st, msg="store status")
    wanted = sum(r for _, _, r in EXPECTED[mode] if r)
    assert st["store"]["mode"] == mode and st["store"]["managed"] is True
    assert st["store"]["wantedPods"] == wanted
    cond = next(c for c in st["conditions"] if c["type"] == "StoreReady")
    assert cond["reason"] in ("PodsNotReady", "ClusterForming", "Ready"), cond
    assert next(c for c in st["conditions"] if c["type"] == "Degraded")["reason"] != "ApplyFailed"
    if control_plane.controllers:  # kwok: the pods are admitted (restricted), scheduled and Running
        for component, n in (
            ("redis", EXPECTED[mode][0][2]),
            ("redis-sentinel", 3 if mode == "sentinel" else 0),
        ):
            wait_for(lambda c=component, n=n: len(pods(k, c)) == n, timeout=60, msg=f"{n} {component} pods")
        # kwok marks pods Ready and completes the cluster Job's pod without running anything
        wait_for(lambda: k.condition("brokerfleet", "edge", "StoreReady").get("status") == "True",
                 timeout=90, msg="StoreReady")  # fmt: skip
        st = fleet_status(k)
        assert st["store"]["readyPods"] == wanted
        assert next(c for c in st["conditions"] if c["type"] == "StoreReady")["message"].startswith(
            f"{wanted}/{wanted} Redis pods ready"
        )

        # the NetworkPolicy selects exactly the Redis servers and sentinels, and admits the fleet's pods
        policy = k.get("networkpolicy", "edge-redis")
        assert policy["metadata"]["ownerReferences"][0]["uid"] == f["metadata"]["uid"]
        selected = {p["metadata"]["name"] for p in json.loads(k("get", "pods", "-l", kubeapi.label_selector(policy["spec"]["podSelector"]),
                                                                "-o", "json").stdout)["items"]}  # fmt: skip
        live = {p["metadata"]["name"] for c in ("redis", "redis-sentinel") for p in pods(k, c)}
        assert selected == live and live
        (rule,) = policy["spec"]["ingress"]
        assert {"podSelector": {"matchLabels": render.selector_labels("edge")}} in rule["from"]
        ports = {p["port"] for p in rule["ports"]}
        assert ports == {"sentinel": {6379, 26379}, "cluster": {6379, 16379}, "standalone": {6379}}[mode]


def test_password_is_made_once_and_never_again(k, run_operator):
    first = run_operator()
    k.apply(fleet(redis={"managed": True}))
    secret = wait_for(lambda: k.get("secret", "edge-redis-auth"), msg="password secret")
    before = (secret["metadata"]["resourceVersion"], password(k))
    # reconciles (a change, resyncs each second) and a new operator leave it as it is
    k.patch("brokerfleet", "edge", {"spec": {"image": "fleetmq/broker:next"}})
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["template"]["spec"]["containers"][0]["image"]
             == "fleetmq/broker:next", msg="reconciled")  # fmt: skip
    time.sleep(3)
    first.stop()
    run_operator()
    time.sleep(3)
    secret = k.get("secret", "edge-redis-auth")
    assert (secret["metadata"]["resourceVersion"], password(k)) == before
    # a Secret deleted by hand is made again, with a new password (README: restart the Redis pods then)
    k("delete", "secret", "edge-redis-auth")
    wait_for(lambda: k.get("secret", "edge-redis-auth"), msg="password secret made again")
    assert password(k) != before[1]


def test_default_storage_is_a_claim_per_server(k, run_operator, control_plane):
    """redis.storage defaults to 1Gi: each server has its claim; without a volume provisioner (as here) the
    pods cannot be scheduled, and the fleet says so."""
    run_operator()
    k.apply(fleet(redis={"managed": True}))
    sts = wait_for(lambda: k.get("statefulset", "edge-redis"), msg="redis statefulset")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    if not control_plane.controllers:
        return
    wait_for(lambda: k.get("pvc", "data-edge-redis-0"), timeout=60, msg="the claim of pod 0")
    degraded = wait_for(lambda: (c := k.condition("brokerfleet", "edge", "Degraded")).get("reason") == "Unschedulable"
                        and c, timeout=90, msg="unschedulable Redis pods reported")  # fmt: skip
    assert "edge-redis-" in degraded["message"]
    cond = k.condition("brokerfleet", "edge", "StoreReady")
    assert (cond["status"], cond["reason"]) == ("False", "PodsNotReady")


def test_a_single_redis_from_an_earlier_operator_keeps_running(k, run_operator):
    """A fleet whose managed Redis an earlier operator made (one server, no topology label) reads as mode
    sentinel now: nothing is applied (the running fleet stays as it is) and the fleet says why."""
    legacy = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "edge-redis", "labels": {render.L_FLEET: "edge", render.L_COMPONENT: "redis"}},
        "spec": {"replicas": 1, "serviceName": "edge-redis",
                 "selector": {"matchLabels": {"app": "legacy-redis"}},
                 "template": {"metadata": {"labels": {"app": "legacy-redis"}},
                              "spec": {"containers": [{"name": "redis", "image": "redis:7-alpine"}]}}},
    }  # fmt: skip
    k.apply(legacy)
    run_operator()
    k.apply(fleet(redis={"managed": True}))
    cond = wait_for(lambda: (c := k.condition("brokerfleet", "edge", "Degraded")).get("reason") == "ConfigInvalid"
                    and c, msg="the topology mismatch reported")  # fmt: skip
    assert "StatefulSet edge-redis runs a single server" in cond["message"]
    assert "delete the BrokerFleet and create it again" in cond["message"]
    assert k.get("statefulset", "edge-redis-sentinel") is None and k.get("configmap", "edge-config") is None
    assert (
        k.get("statefulset", "edge-redis")["spec"]["template"]["spec"]["containers"][0]["image"]
        == "redis:7-alpine"
    )


def test_redis_choices_and_service_monitor(k, run_operator, control_plane):
    monitor_crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(monitor_crd))
    kubeapi.wait_established(control_plane.kubectl, ["servicemonitors.monitoring.coreos.com"])
    run_operator()
    k.apply(fleet(redis={"managed": True}, metrics={"serviceMonitorLabels": {"release": "kps"}}))
    wait_for(lambda: k.get("statefulset", "edge-redis"), msg="managed redis")
    assert k.get("service", "edge-redis")["spec"]["ports"][0]["port"] == 6379
    mon = wait_for(lambda: k.get("servicemonitor", "edge"), msg="service monitor")
    assert mon["spec"]["endpoints"][0]["port"] == "metrics"
    # what kube-prometheus-stack's serviceMonitorSelector matches, and only the fleet's namespace
    assert mon["metadata"]["labels"]["release"] == "kps"
    assert mon["spec"]["namespaceSelector"] == {"matchNames": [k.ns]}
    k.patch("brokerfleet", "edge", {"spec": {"metrics": {
        "serviceMonitorLabels": {"release": "monitoring"}, "scrapeTimeout": "20s"}}})  # fmt: skip
    mon = wait_for(lambda: (m := k.get("servicemonitor", "edge"))["metadata"]["labels"].get("release")
                   == "monitoring" and m, msg="service monitor relabelled")  # fmt: skip
    assert mon["spec"]["endpoints"][0]["scrapeTimeout"] == "20s"
    assert config_of(k)["store"]["sentinel"]["master"] == "edge"

    # an existing Redis with a password Secret: the password reaches the pods as a file, not the ConfigMap
    k.apply(fleet("ext", redis={"url": "redis://db.example:6379/0", "secretRef": {"name": "redis-pw"}},
                  metrics={"serviceMonitor": False}))  # fmt: skip
    degraded = wait_for(lambda: (c := k.condition("brokerfleet", "ext", "Degraded")).get("reason") == "ConfigInvalid"
                        and c, msg="missing secret reported")  # fmt: skip
    assert "redis-pw" in degraded["message"]
    k("create", "secret", "generic", "redis-pw", "--from-literal=password=s3cret")
    cm = wait_for(lambda: k.get("configmap", "ext-config"), msg="external redis rendered")
    store = yaml.safe_load(cm["data"][render.CONFIG_KEY])["store"]
    assert (
        store["url"] == "redis://db.example:6379/0"
        and store["password_file"] == "/etc/fleetmq/redis/password"
    )
    assert "s3cret" not in json.dumps(cm)
    pod = k.get("statefulset", "ext")["spec"]["template"]["spec"]
    assert {"name": "redis-auth", "secret": {"secretName": "redis-pw", "items": [
        {"key": "password", "path": "password"}], "defaultMode": 420}} in pod["volumes"]  # fmt: skip
    assert k.get("statefulset", "ext-redis") is None and k.get("secret", "ext-redis-auth") is None
    assert k.get("servicemonitor", "ext") is None  # serviceMonitor: false
    wait_for(
        lambda: k.condition("brokerfleet", "ext", "Degraded").get("status") == "False", msg="not degraded"
    )
    k("delete", "brokerfleet", "edge", "--wait=true", "--timeout=30s")
    if control_plane.controllers:  # its children go with it, the managed Redis' included
        wait_for(lambda: k.get("statefulset", "edge-redis") is None, msg="managed redis collected")
        wait_for(lambda: k.get("servicemonitor", "edge") is None, msg="service monitor collected")
