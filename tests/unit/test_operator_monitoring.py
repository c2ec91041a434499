"""The brokers' ServiceMonitor as kube-prometheus-stack needs it: its selector labels, the fleet's namespace,
the scrape settings; and what the BrokerFleet model refuses before anything is applied."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from fleetmq.operator import render
from fleetmq.operator.crds import BrokerFleetSpec
from pydantic import ValidationError

from .operator_support import by_kind, fleet, rendered, zone


def monitor(**metrics) -> dict:
    (sm,) = by_kind(
        rendered(fleet(metrics=metrics), zone("external"), service_monitor=True), "ServiceMonitor"
    )
    return sm


def test_servicemonitor_carries_the_users_labels_and_selects_the_headless_service_in_its_namespace():
    sm = monitor(serviceMonitorLabels={"release": "kube-prometheus-stack", "team": "mq"})
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
    sm = monitor(interval="15s", scrapeTimeout="10s")
    assert sm["spec"]["endpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "10s",
    }


def test_no_servicemonitor_when_disabled_or_without_the_prometheus_operator():
    r = rendered(fleet(metrics={"serviceMonitor": False}), zone("external"), service_monitor=True)
    assert not by_kind(r, "ServiceMonitor")
    assert not by_kind(rendered(fleet(), zone("external"), service_monitor=False), "ServiceMonitor")


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"serviceMonitorLabels": {"bad key": "x"}}, "is not [prefix/]name"),
        ({"serviceMonitorLabels": {"Example.com/x": "y"}}, "is not [prefix/]name"),
        ({"serviceMonitorLabels": {"app.kubernetes.io/managed-by": "me"}}, "is the operator's own"),
        ({"serviceMonitorLabels": {"release": "not ok"}}, "String should match pattern"),
        ({"serviceMonitorLabels": {"release": "x" * 64}}, "at most 63 characters"),
        ({"interval": "soon"}, "String should match pattern"),
        ({"interval": "10s", "scrapeTimeout": "1m"}, "scrapeTimeout cannot exceed interval"),
    ],
)
def test_bad_settings_are_refused_by_the_model(metrics, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        BrokerFleetSpec.model_validate({"metrics": metrics})


def test_the_readmes_example_fleet_validates():
    """The README's operator section shows the ServiceMonitor settings as a user writes them."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("kind: BrokerFleet\nmetadata: {name: edge}")
    spec = yaml.safe_load(readme[start : readme.index("---", start)])["spec"]
    metrics = BrokerFleetSpec.model_validate(spec).metrics
    assert metrics.serviceMonitorLabels == {"release": "kube-prometheus-stack"} and metrics.scrapeTimeout
