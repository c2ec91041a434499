"""The fleetmq user flow on a kind cluster, in order: helm install (and helm test), a fleet of 3 brokers with
a managed Redis and two zones, MQTT clients through the Services, a broker pod deleted under QoS 1 load
without losing an acked message, a zone change applied live without a pod restart, helm uninstall.

Clients reach the brokers with `kubectl port-forward`, to a Service (which pins one pod) or to one pod."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from .conftest import APP_NS, CHART, RELEASE, RELEASE_NS, ROOT, Cluster, PortForward, wait_for
from .load import client, close, qos1_load_with_deletions

FLEET = ROOT / "e2e" / "manifests" / "fleet.yaml"
BROKERS = ["edge-0", "edge-1", "edge-2"]
pytestmark = pytest.mark.timeout(1200)


# ----------------------------------------------------------------------------------------------- install
def test_helm_install_runs_the_operator_and_helm_test_passes(cluster: Cluster):
    c = cluster
    c.helm(
        "install",
        RELEASE,
        CHART,
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--wait",
        "--timeout=5m",
        "--set",
        "examples.enabled=true",
        "--set",
        "examples.fleet.spec.replicas=2",
    )
    dep = c.get("deployment", f"{RELEASE}-operator", RELEASE_NS)
    assert dep["status"]["availableReplicas"] == 1
    for crd in ("brokerfleets.fleetmq.io", "mqttzones.fleetmq.io"):
        c.kubectl("get", "crd", crd)
    dashboards = c.kubectl(
        "get", "configmaps", "-A", "-l", "grafana_dashboard=1", "-o", "name"
    ).stdout.split()
    assert len(dashboards) == len(list((CHART / "dashboards").glob("*.json")))
    wait_for(
        lambda: c.condition("brokerfleet", "edge", "Ready", RELEASE_NS).get("status") == "True",
        timeout=300,
        msg="example fleet Ready",
    )
    out = c.helm("test", RELEASE, "--namespace", RELEASE_NS, "--logs", "--timeout=5m")
    assert "Phase:          Succeeded" in out.stdout and "resumed the session and received" in out.stdout


def test_a_fleet_and_two_zones_become_ready(cluster: Cluster):
    c = cluster
    c.kubectl("create", "namespace", APP_NS)
    c.kubectl("apply", "-n", APP_NS, "-f", FLEET)
    wait_for(
        lambda: c.condition("brokerfleet", "edge", "Ready").get("status") == "True",
        timeout=420,
        msg="fleet Ready",
    )
    assert c.condition("brokerfleet", "edge", "ConfigApplied")["status"] == "True"
    for zone in ("external", "internal"):
        wait_for(lambda z=zone: c.condition("mqttzone", z, "Applied").get("status") == "True", msg=f"{zone}")
    pods = c.pods("app.kubernetes.io/instance=edge,app.kubernetes.io/component=broker")
    assert sorted(p["metadata"]["name"] for p in pods) == BROKERS
    want = c.get("configmap", "edge-config")["metadata"]["annotations"]["fleetmq.io/config-hash"]
    for name in BROKERS:
        assert c.readyz(name)["config_hash"] == want
    assert c.pods("app.kubernetes.io/instance=edge,app.kubernetes.io/component=redis")


def test_clients_through_the_services_of_both_zones(cluster: Cluster, forwards):
    c = cluster
    ext = PortForward(c, "svc/edge-external-mqtt", 1883).start()
    ws = PortForward(c, "svc/edge-external-ws", 8083).start()
    internal = PortForward(c, "svc/edge-internal-mqtt", 11883).start()
    forwards += [ext, ws, internal]
    got: dict[str, list[bytes]] = {"tcp": [], "ws": []}
    done = threading.Event()

    def on_message(key):
        def cb(_c, _u, msg):
            got[key].append(msg.payload)
            if all(got.values()):
                done.set()

        return cb

    subs = []
    for key, pf, transport in (("tcp", ext, "tcp"), ("ws", ws, "websockets")):
        s = client(pf.local, f"e2e-sub-{key}", transport=transport, on_message=on_message(key))
        s.subscribe("e2e/zones/#", qos=1)
        subs.append(s)
    time.sleep(1)
    pub = client(internal.local, "e2e-pub")
    pub.publish("e2e/zones/hello", b"across zones", qos=1).wait_for_publish(10)
    assert done.wait(20), got
    assert got == {"tcp": [b"across zones"], "ws": [b"across zones"]}
    for x in (*subs, pub):
        close(x)


def test_no_acked_message_is_lost_when_broker_pods_are_deleted_under_qos1_load(cluster: Cluster, forwards):
    c = cluster
    per_pod = {pod: PortForward(c, f"pod/{pod}", 1883) for pod in BROKERS}  # a Service would pin one pod
    forwards += per_pod.values()

    def delete(pod: str) -> None:  # the StatefulSet recreates it; its port-forward is restarted when needed
        c.kubectl("delete", "pod", pod, "-n", APP_NS, "--wait=false")

    result = qos1_load_with_deletions(per_pod, delete, f"e2e/load/{uuid.uuid4().hex[:6]}")
    print(result)
    assert len(result.deleted) == 2 and result.subscriber_reconnects >= 1 and result.publisher_reconnects >= 1
    assert len(result.acked) == result.total and not result.lost, result
    wait_for(
        lambda: c.condition("brokerfleet", "edge", "Ready").get("status") == "True",
        timeout=300,
        msg="fleet Ready again",
    )


def test_zone_change_is_applied_live_without_pod_restarts(cluster: Cluster):
    c = cluster
    selector = "app.kubernetes.io/instance=edge,app.kubernetes.io/component=broker"

    def pod_state():
        return {
            p["metadata"]["name"]: (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["restartCount"])
            for p in c.pods(selector)
        }

    before = pod_state()
    sts_generation = c.get("statefulset", "edge")["metadata"]["generation"]
    old = {pod: c.readyz(pod)["config_hash"] for pod in BROKERS}
    assert len(set(old.values())) == 1
    generation = c.get("mqttzone", "external")["metadata"]["generation"]
    c.kubectl(
        "patch",
        "mqttzone",
        "external",
        "-n",
        APP_NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"session": {"maxInflight": 8, "maxMqueueLen": 5000}}}),
    )
    new = wait_for(
        lambda: (
            (h := c.get("configmap", "edge-config")["metadata"]["annotations"]["fleetmq.io/config-hash"])
            != next(iter(old.values()))
            and h
        ),
        msg="ConfigMap re-rendered",
    )
    # the kubelet refreshes the mounted ConfigMap, every broker reloads it: /readyz reports the new hash
    wait_for(lambda: all(c.readyz(p)["config_hash"] == new for p in BROKERS), timeout=240, msg="hash on pods")
    wait_for(
        lambda: c.get("mqttzone", "external")["status"].get("appliedGeneration") == generation + 1,
        msg="every pod applied the zone's new generation",
    )
    assert c.condition("mqttzone", "external", "Applied")["status"] == "True"
    assert pod_state() == before, "pods were restarted or replaced"
    assert c.get("statefulset", "edge")["metadata"]["generation"] == sts_generation


def test_helm_uninstall_cleans_up(cluster: Cluster):
    c = cluster
    c.kubectl("delete", "-n", APP_NS, "-f", FLEET, "--wait", "--timeout=180s")  # while the operator runs
    wait_for(lambda: not c.pods("app.kubernetes.io/instance=edge"), msg="fleet pods gone")
    c.helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--timeout=5m")
    # the pre-delete hook deleted the examples (and the operator removed their finalizer) first
    assert c.get("brokerfleet", "edge", RELEASE_NS) is None
    left = c.kubectl(
        "get",
        "all,configmaps,serviceaccounts,brokerfleets,mqttzones,kopfpeerings",
        "-n",
        RELEASE_NS,
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    ).stdout
    assert left.strip() == ""
    assert c.kubectl("get", "clusterrole", f"{RELEASE}-operator", check=False).returncode != 0
    assert c.kubectl("get", "clusterkopfpeering", "fleetmq", check=False).returncode != 0
    wait_for(lambda: not c.pods("app.kubernetes.io/instance=edge", RELEASE_NS), msg="example pods gone")
