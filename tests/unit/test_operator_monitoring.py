"""The brokers' ServiceMonitor as kube-prometheus-stack needs it: its selector labels, the fleet's namespace,
the scrape settings; and what the BrokerFleet model refuses before anything is applied."""

from __future__ import annotations

import re

import pytest
from fleetmq.operator import render
from fleetmq.operator.crds import BrokerFleetSpec
from pydantic import ValidationError

from .test_operator_render import by_kind, fleet, rendered, zone


def monitor(**metrics) -> dict:
    (sm,) = by_kind(
        rendered(fleet(metrics=metrics), zone("external"), service_monitor=True), "ServiceMonitor"
    )
    return sm


def test_servicemonitor_carries_the_users_labels_and_selects_the_headless_service_in_its_namespace():
    sm = monitor(serviceMonitor={"labels": {"release": "kube-prometheus-stack", "team": "mq"}})
    labels = sm["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack" and labels["team"] == "mq"
    assert labels[render.L_MANAGED] == render.MANAGER  # pruning still finds it
    assert sm["metadata"]["namespace"] == "mq"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["mq"]}
    r = rendered(fleet(), zone("external"))
    headless = next(s for s in by_kind(r, "Service") if s["metadata"]["name"] == "edge-headless")
    assert sm["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert "metrics" in {p["name"] for p in headless["spec"]["ports"]}


def test_scrape_interval_and_timeout():
    sm = monitor(serviceMonitor={"interval": "15s", "scrapeTimeout": "10s"})
    assert sm["spec"]["endpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "10s",
    }


def test_no_servicemonitor_when_disabled_or_without_the_prometheus_operator():
    r = rendered(
        fleet(metrics={"serviceMonitor": {"enabled": False}}), zone("external"), service_monitor=True
    )
    assert not by_kind(r, "ServiceMonitor")
    assert not by_kind(rendered(fleet(), zone("external"), service_monitor=False), "ServiceMonitor")


def test_a_stored_fleet_with_the_former_boolean_still_reads():
    """Fleets stored while serviceMonitor was a boolean keep working until their next edit."""
    assert (
        BrokerFleetSpec.model_validate({"metrics": {"serviceMonitor": False}}).metrics.serviceMonitor.enabled
        is False
    )
    assert BrokerFleetSpec.model_validate(
        {"metrics": {"serviceMonitor": True}}
    ).metrics.serviceMonitor.enabled


@pytest.mark.parametrize(
    ("service_monitor", "message"),
    [
        ({"labels": {"bad key": "x"}}, "is not [prefix/]name"),
        ({"labels": {"Example.com/x": "y"}}, "is not [prefix/]name"),
        ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "is the operator's own"),
        ({"labels": {"release": "not ok"}}, "String should match pattern"),
        ({"labels": {"release": "x" * 64}}, "at most 63 characters"),
        ({"interval": "soon"}, "String should match pattern"),
        ({"interval": "10s", "scrapeTimeout": "1m"}, "scrapeTimeout cannot exceed interval"),
    ],
)
def test_bad_settings_are_refused_by_the_model(service_monitor, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        BrokerFleetSpec.model_validate({"metrics": {"serviceMonitor": service_monitor}})
