"""The operator's own Prometheus metrics (prefix fleetmq_operator_), served by `fleetmq-operator --metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "fleetmq_operator_reconciles_total",
    "Reconciliations of a BrokerFleet (with its MqttZones), by result: ok, error, paused, gone.",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "fleetmq_operator_reconcile_errors_total",
    "Failed reconciliation steps, by step: render, apply, prune, status, nodeinfo.",
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


def serve(bind: str) -> None:
    """Serve /metrics on HOST:PORT from a background thread."""
    host, _, port = bind.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=REGISTRY)
