"""The operator's own Prometheus metrics (prefix fleetmq_operator_), served by `fleetmq-operator --metrics`."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .rollout import FAILURES as ROLLOUT_FAILURES

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "fleetmq_operator_reconciles_total",
    "Reconciliations of a BrokerFleet (with its MqttZones), by result: ok, error, paused, gone.",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "fleetmq_operator_reconcile_errors_total",
    "Failed reconciliation steps, by step: render, apply, prune, status, nodeinfo, pods.",
    ["step"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "fleetmq_operator_reconcile_duration_seconds",
    "Time one BrokerFleet reconciliation takes.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
CHILD_CHANGES = Counter(
    "fleetmq_operator_child_changes_total",
    "Server-side applies that changed a child object (created, updated or drift corrected), by kind.",
    ["kind"],
    registry=REGISTRY,
)
CHILD_DELETES = Counter(
    "fleetmq_operator_child_deletes_total",
    "Children deleted because the rendered fleet no longer has them, by kind.",
    ["kind"],
    registry=REGISTRY,
)
ZONES = Gauge(
    "fleetmq_operator_zones",
    "MqttZones seen at the last reconciliations, by state: accepted, rejected.",
    ["state"],
    registry=REGISTRY,
)
FLEETS = Gauge("fleetmq_operator_fleets", "BrokerFleets reconciled by this operator.", registry=REGISTRY)
# Per fleet. Not `namespace`: Prometheus gives every sample of the operator's target the operator's own
# namespace, and a scraped `namespace` label would be renamed exported_namespace.
FLEET_READY = Gauge(
    "fleetmq_operator_fleet_ready",
    "1 while the BrokerFleet's Ready condition is True, else 0 (as of its last reconciliation).",
    ["fleet_namespace", "fleet"],
    registry=REGISTRY,
)
FLEET_REPLICAS = Gauge(
    "fleetmq_operator_fleet_replicas",
    "Broker pods of a BrokerFleet, by state: desired (spec.replicas), ready (status.readyReplicas).",
    ["fleet_namespace", "fleet", "state"],
    registry=REGISTRY,
)
# The session store as the BrokerFleet status sees it: what the alerts on an unreachable or incomplete Redis
# read, since an idle broker counts no store errors while its Redis is away.
FLEET_STORE_READY = Gauge(
    "fleetmq_operator_fleet_store_ready",
    "1 while the BrokerFleet's StoreReady condition is True, else 0 (its reason: status.conditions).",
    ["fleet_namespace", "fleet"],
    registry=REGISTRY,
)
FLEET_ROLLOUT_STOPPED = Gauge(
    "fleetmq_operator_fleet_rollout_stopped",
    "1 while the BrokerFleet's rollout is stopped on a pod it added (reason: ImagePullFailed, CrashLoop, "
    "ReadinessTimeout); the old pods keep serving.",
    ["fleet_namespace", "fleet", "reason"],
    registry=REGISTRY,
)
FLEET_STORE_PODS = Gauge(
    "fleetmq_operator_fleet_store_pods",
    "Pods of a BrokerFleet's managed Redis (servers and sentinels), by state: wanted, ready.",
    ["fleet_namespace", "fleet", "state"],
    registry=REGISTRY,
)

# Every label value a counter can take starts at 0, so rates and panels have data before the first event.
RESULTS = ("ok", "error", "paused", "gone")
STEPS = ("render", "apply", "prune", "status", "nodeinfo", "pods")
CHILD_KINDS = (
    "ConfigMap",
    "Service",
    "StatefulSet",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "ServiceMonitor",
)
for _result in RESULTS:
    RECONCILES.labels(_result)
for _step in STEPS:
    RECONCILE_ERRORS.labels(_step)
for _kind in CHILD_KINDS:
    CHILD_CHANGES.labels(_kind)
    CHILD_DELETES.labels(_kind)


def set_fleet(namespace: str, name: str, status: dict[str, Any], desired: int) -> None:
    """The fleet gauges from the BrokerFleet status the operator patched (or found, for a paused fleet)."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    FLEET_READY.labels(namespace, name).set(1 if ready else 0)
    FLEET_REPLICAS.labels(namespace, name, "desired").set(desired)
    FLEET_REPLICAS.labels(namespace, name, "ready").set(int(status.get("readyReplicas") or 0))
    store_ready = next((c for c in status.get("conditions") or [] if c.get("type") == "StoreReady"), None)
    if store_ready is not None:
        FLEET_STORE_READY.labels(namespace, name).set(1 if store_ready.get("status") == "True" else 0)
    stopped = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), None)
    reason = str((stopped or {}).get("reason") or "")
    for r in ROLLOUT_FAILURES:
        FLEET_ROLLOUT_STOPPED.labels(namespace, name, r).set(
            1 if r == reason and (stopped or {}).get("status") == "False" else 0
        )
    store = status.get("store") or {}
    if store.get("wantedPods") is not None:  # a managed Redis
        FLEET_STORE_PODS.labels(namespace, name, "wanted").set(int(store["wantedPods"]))
        FLEET_STORE_PODS.labels(namespace, name, "ready").set(int(store.get("readyPods") or 0))
    else:
        _remove(FLEET_STORE_PODS, (namespace, name, "wanted"), (namespace, name, "ready"))


def forget_fleet(namespace: str, name: str) -> None:
    """Drop a fleet's series (deleted, or no longer handled by this operator process)."""
    _remove(FLEET_READY, (namespace, name))
    _remove(FLEET_REPLICAS, (namespace, name, "desired"), (namespace, name, "ready"))
    _remove(FLEET_STORE_READY, (namespace, name))
    _remove(FLEET_ROLLOUT_STOPPED, *((namespace, name, r) for r in ROLLOUT_FAILURES))
    _remove(FLEET_STORE_PODS, (namespace, name, "wanted"), (namespace, name, "ready"))


def _remove(gauge: Gauge, *label_sets: tuple[str, ...]) -> None:
    for labels in label_sets:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)


def serve(bind: str) -> None:
    """Serve /metrics on HOST:PORT from a background thread."""
    host, _, port = bind.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=REGISTRY)
