"""Builders of the operator's unit tests: BrokerFleet and MqttZone objects as the API server hands them
over, and what rendering makes of them."""

from __future__ import annotations

from fleetmq.operator import render


def fleet(**spec) -> dict:
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "BrokerFleet",
        "metadata": {"name": "edge", "namespace": "mq", "uid": "uid-1", "generation": 1},
        "spec": {"replicas": 2, **spec},
    }


def zone(name: str, gen: int = 1, created: str = "2024-01-01T00:00:00Z", **spec) -> dict:
    spec.setdefault("listeners", [{"name": "mqtt", "port": 1883}])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttZone",
        "metadata": {"name": name, "namespace": "mq", "generation": gen, "creationTimestamp": created},
        "spec": {"fleetRef": {"name": "edge"}, **spec},
    }


def user(name: str, created: str = "2024-01-01T00:00:00Z", gen: int = 1, **spec) -> dict:
    spec.setdefault("zones", ["external"])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttUser",
        "metadata": {"name": name, "namespace": "mq", "uid": f"uid-{name}", "generation": gen,
                     "creationTimestamp": created},
        "spec": {"fleetRef": {"name": "edge"}, **spec},
    }  # fmt: skip


def rendered(f: dict, *zones: dict, **kw) -> render.Rendered:
    """What the operator renders for fleet `f` serving `zones` (all accepted)."""
    parsed = render.Fleet.parse(f)
    accepted, rejected = render.select_zones(parsed, list(zones))
    assert not rejected, rejected
    return render.render(parsed, accepted, **kw)


def by_kind(r: render.Rendered, kind: str) -> list[dict]:
    return [m for m in r.manifests if m["kind"] == kind]


def broker_sts(r: render.Rendered) -> dict:
    return next(m for m in by_kind(r, "StatefulSet") if m["metadata"]["name"] == "edge")
