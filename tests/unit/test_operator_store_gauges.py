"""The operator's session-store gauges from a BrokerFleet status, and their removal with the fleet."""

from __future__ import annotations

from fleetmq.operator import metrics


def value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"fleet_namespace": "mq", "fleet": "unit", **labels})


def condition(status: str) -> dict:
    return {"type": "StoreReady", "status": status, "reason": "r", "lastTransitionTime": "t"}


def test_store_ready_and_managed_redis_pods():
    status = {"conditions": [condition("False")], "store": {"managed": True, "readyPods": 3, "wantedPods": 5}}
    metrics.set_fleet("mq", "unit", status, 2)
    assert value("fleetmq_operator_fleet_store_ready") == 0
    assert value("fleetmq_operator_fleet_store_pods", state="wanted") == 5
    assert value("fleetmq_operator_fleet_store_pods", state="ready") == 3
    # the fleet moves to an existing Redis: no managed pods to count any more
    metrics.set_fleet("mq", "unit", {"conditions": [condition("True")], "store": {"managed": False}}, 2)
    assert value("fleetmq_operator_fleet_store_ready") == 1
    assert value("fleetmq_operator_fleet_store_pods", state="wanted") is None
    metrics.forget_fleet("mq", "unit")
    assert value("fleetmq_operator_fleet_store_ready") is None
    assert value("fleetmq_operator_fleet_ready") is None


def test_no_store_ready_series_before_the_condition_exists():
    metrics.set_fleet("mq", "unit", {}, 1)
    assert value("fleetmq_operator_fleet_store_ready") is None
    assert value("fleetmq_operator_fleet_ready") == 0
    metrics.forget_fleet("mq", "unit")
