"""How the operator itself is run and watched, against a real kube-apiserver: pausing a fleet or a zone,
peering (one active operator of several), its own metrics, and an operator whose RBAC covers one
namespace."""

from __future__ import annotations

import time

from fleetmq.operator import render

from .conftest import OPERATOR_NS, Operator, bridge, fleet, wait_for, zone
from .support import CHILDREN, cm_hash, config_of, hash_with_zone


def test_pause_stops_reconciliation_of_one_fleet(k, run_operator):
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    before = hash_with_zone(k)
    k("annotate", "brokerfleet", "edge", f"{render.PAUSED}=true")
    time.sleep(1.5)
    k.patch("mqttzone", "external", {"spec": {"session": {"maxInflight": 3}}})
    k.patch("statefulset", "edge", {"spec": {"replicas": 5}})
    time.sleep(4)  # several resync intervals
    assert cm_hash(k) == before
    assert k.get("statefulset", "edge")["spec"]["replicas"] == 5
    k("annotate", "brokerfleet", "edge", f"{render.PAUSED}-")
    wait_for(lambda: cm_hash(k) != before, msg="reconciled after unpause")
    wait_for(
        lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 2, msg="drift corrected after unpause"
    )


def test_paused_zone_keeps_its_applied_version(k, run_operator):
    run_operator()
    k.apply(fleet())
    k.apply(zone(session={"maxInflight": 4}))
    # the config with the zone in it (the fleet alone may have been rendered first)
    before = wait_for(
        lambda: config_of(k)["zones"]["external"]["max_inflight"] == 4 and cm_hash(k), msg="config"
    )
    k("annotate", "mqttzone", "external", f"{render.PAUSED}=true")
    k.patch("mqttzone", "external", {"spec": {"session": {"maxInflight": 9}}})
    time.sleep(3)
    assert cm_hash(k) == before and config_of(k)["zones"]["external"]["max_inflight"] == 4


def test_operator_metrics_count_reconciles(k, run_operator):
    from fleetmq.operator import metrics

    before = metrics.REGISTRY.get_sample_value("fleetmq_operator_reconciles_total", {"result": "ok"}) or 0
    run_operator()
    k.apply(fleet())
    wait_for(lambda: k.get("statefulset", "edge"), msg="statefulset")
    wait_for(lambda: (metrics.REGISTRY.get_sample_value("fleetmq_operator_reconciles_total", {"result": "ok"})
                      or 0) > before, msg="reconciles counted")  # fmt: skip
    assert (
        metrics.REGISTRY.get_sample_value("fleetmq_operator_child_changes_total", {"kind": "StatefulSet"})
        >= 1
    )
    assert metrics.REGISTRY.get_sample_value("fleetmq_operator_reconcile_duration_seconds_count") >= 1


def test_operator_metrics_report_fleet_readiness(k, run_operator, kube_namespace):
    """fleetmq_operator_fleet_ready / _replicas follow the fleet's status and go with the fleet; the labelled
    counters exist at 0 before anything happened."""
    from fleetmq.operator import metrics

    def value(name: str, **labels: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(name, labels)

    for result in ("ok", "error", "paused", "gone"):
        assert value("fleetmq_operator_reconciles_total", result=result) is not None, result
    for step in ("render", "apply", "prune", "status", "nodeinfo", "pods"):
        assert value("fleetmq_operator_reconcile_errors_total", step=step) is not None, step
    for kind in ("ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget"):
        assert value("fleetmq_operator_child_changes_total", kind=kind) is not None, kind
        assert value("fleetmq_operator_child_deletes_total", kind=kind) is not None, kind

    edge = {"fleet_namespace": kube_namespace, "fleet": "edge"}
    run_operator()
    k.apply(fleet(replicas=2))
    wait_for(lambda: value("fleetmq_operator_fleet_ready", **edge) is not None, msg="fleet_ready exported")
    assert k.condition("brokerfleet", "edge", "Ready")["status"] == "False"  # no pod reports its config
    assert value("fleetmq_operator_fleet_ready", **edge) == 0
    assert value("fleetmq_operator_fleet_replicas", **edge, state="desired") == 2
    wait_for(  # 0 without kube-controller-manager; kwok's fake pods get ready
        lambda: (
            value("fleetmq_operator_fleet_replicas", **edge, state="ready")
            == k.get("brokerfleet", "edge")["status"]["readyReplicas"]
        ),
        msg="ready replicas as in the status",
    )
    k("scale", "brokerfleet", "edge", "--replicas=3")
    wait_for(lambda: value("fleetmq_operator_fleet_replicas", **edge, state="desired") == 3, msg="scaled")
    k("delete", "brokerfleet", "edge", "--wait=false")
    wait_for(lambda: value("fleetmq_operator_fleet_ready", **edge) is None, msg="fleet_ready removed")
    assert value("fleetmq_operator_fleet_replicas", **edge, state="desired") is None
    assert value("fleetmq_operator_fleet_replicas", **edge, state="ready") is None


def test_peering_keeps_one_operator_active(k, run_operator, caplog):
    """HA: replicas of the operator with kopf peering; the highest priority one acts, the others wait."""
    k.apply({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "fleetmq"}})
    low = run_operator(peering=("fleetmq", 10))
    k.apply(fleet())
    wait_for(lambda: k.get("statefulset", "edge"), msg="reconciled by the only operator")

    def peers() -> int:
        return len((k.get("kopfpeering", "fleetmq") or {}).get("status") or {})

    wait_for(lambda: peers() == 1, msg="first operator announced")
    high = run_operator(peering=("fleetmq", 20))
    wait_for(lambda: peers() == 2, msg="both operators announced")
    k("scale", "brokerfleet", "edge", "--replicas=3")
    wait_for(
        lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 3, msg="reconciled by the active one"
    )
    high.stop()
    wait_for(lambda: peers() == 1, msg="the active operator left")
    k("scale", "brokerfleet", "edge", "--replicas=4")
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 4, msg="the standby took over")
    low.stop()
    paused = [r.getMessage() for r in caplog.records if "Pausing operations in favour of" in r.getMessage()]
    assert paused and all("priority=20" in m for m in paused)  # only the low one ever stood back


def test_an_operator_watching_one_namespace_needs_no_cluster_wide_secret_read(
    k, control_plane, kube_namespace, namespaced_operator_kubeconfig, monkeypatch
):
    """With the RBAC of `--watch <ns>` (a Role in the namespace, a ClusterRole reading CRDs and namespaces)
    the operator reconciles a fleet with a zone and a bridge whose password is a Secret, writes statuses
    and events, and is refused nothing (Operator.stop checks its log for Forbidden); Secrets elsewhere
    are out of its reach."""
    monkeypatch.setenv("KUBECONFIG", str(namespaced_operator_kubeconfig))
    monkeypatch.setenv("FLEETMQ_RESYNC_SECONDS", "1")
    sa = f"system:serviceaccount:{OPERATOR_NS}:fleetmq-ns-{kube_namespace[-6:]}"

    def can(verb: str, what: str, ns: str) -> bool:
        out = control_plane.kubectl("auth", "can-i", verb, what, "-n", ns, "--as", sa, check=False)
        return out.stdout.strip() == "yes"

    assert can("get", "secrets", kube_namespace) and can("patch", "statefulsets", kube_namespace)
    assert not can("get", "secrets", "default") and not can("list", "pods", "kube-system")
    assert not can("get", "secrets", OPERATOR_NS)
    op = Operator(kube_namespace)
    try:
        k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloud-pw"},
                 "stringData": {"password": "s3cret"}})  # fmt: skip
        k.apply(fleet())
        k.apply(zone())
        k.apply(bridge("cloud", remote={"host": "h", "passwordSecretRef": {"name": "cloud-pw"}}))
        for kind, name in CHILDREN:
            wait_for(lambda kind=kind, name=name: k.get(kind, name), msg=f"{kind} {name}")
        wait_for(lambda: [b["name"] for b in config_of(k).get("bridges", [])] == ["cloud"], msg="the bridge")
        wait_for(lambda: (k.get("secret", "edge-bridge-secrets") or {}).get("data", {}).get("cloud.password"),
                 msg="the bridge's password copied")  # fmt: skip
        wait_for(
            lambda: k.condition("mqttbridge", "cloud", "Accepted").get("status") == "True", msg="accepted"
        )
        wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("status") == "True", msg="zone")
        wait_for(lambda: k.condition("brokerfleet", "edge", "Ready").get("reason"), msg="fleet status")
    finally:
        op.stop()
