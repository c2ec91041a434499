"""BrokerFleet spec.metrics' ServiceMonitor settings in a real kube-apiserver: defaults, kubectl explain, and
bad labels or scrape settings refused with the field's path before the operator renders anything."""

from __future__ import annotations

import pytest

from .conftest import fleet, wait_for

M = "spec.metrics"


def test_defaults_and_explain(k):
    k.apply(fleet())
    metrics = k.get("brokerfleet", "edge")["spec"]["metrics"]
    assert metrics == {"port": 9100, "serviceMonitor": True, "interval": "30s", "serviceMonitorLabels": {}}
    out = wait_for(lambda: (o := k("explain", "brokerfleet.spec.metrics.serviceMonitorLabels", check=False).stdout)
                   and "serviceMonitorSelector" in o and o, msg="kubectl explain")  # fmt: skip
    assert "FIELD: serviceMonitorLabels <map[string]string>" in out
    out = k("explain", "brokerfleet.spec.metrics.scrapeTimeout").stdout
    assert "at most the interval" in out


def test_good_settings_are_kept(k):
    metrics = {"serviceMonitorLabels": {"release": "kube-prometheus-stack", "example.com/team": "mq-1"},
               "interval": "15s", "scrapeTimeout": "15s"}  # fmt: skip
    k.apply(fleet(metrics=metrics))
    got = k.get("brokerfleet", "edge")["spec"]["metrics"]
    assert got == {"port": 9100, "serviceMonitor": True, **metrics}


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"serviceMonitorLabels": {"bad key": "x"}}, f"{M}.serviceMonitorLabels: Invalid value: \"object\": label keys must be"),
        ({"serviceMonitorLabels": {"-x": "y"}}, f"{M}.serviceMonitorLabels: Invalid value: \"object\": label keys must be"),
        ({"serviceMonitorLabels": {"a/b/c": "y"}}, f"{M}.serviceMonitorLabels: Invalid value: \"object\": label keys must be"),
        ({"serviceMonitorLabels": {"x" * 64: "y"}}, f"{M}.serviceMonitorLabels: Invalid value: \"object\": label keys must be"),
        ({"serviceMonitorLabels": {"fleetmq.io/fleet": "other"}}, f"{M}.serviceMonitorLabels: Invalid value: \"object\": labels cannot replace"),
        ({"serviceMonitorLabels": {"release": "not ok"}}, f"{M}.serviceMonitorLabels.release: Invalid value: \"not ok\""),
        ({"serviceMonitorLabels": {"release": "x" * 64}}, f"{M}.serviceMonitorLabels.release: Too long"),
        ({"serviceMonitorLabels": {"release": 1}}, f"{M}.serviceMonitorLabels.release: Invalid value: \"integer\""),
        ({"interval": "often"}, f"{M}.interval: Invalid value: \"often\""),
        ({"scrapeTimeout": "1m"}, f"{M}.scrapeTimeout: Invalid value: \"object\": scrapeTimeout cannot exceed"),
        ({"interval": "1m", "scrapeTimeout": "2m"}, f"{M}.scrapeTimeout: Invalid value: \"object\": scrapeTimeout"),
        ({"scrapeTimeout": "10"}, f"{M}.scrapeTimeout: Invalid value: \"10\""),
    ],
    ids=["key-space", "key-dash", "key-two-slashes", "key-name-too-long", "own-label", "value-pattern",
         "value-too-long", "value-type", "interval-pattern", "timeout-over-default-interval",
         "timeout-over-interval", "timeout-unit"],
)  # fmt: skip
def test_bad_settings_are_refused_with_the_fields_path(k, metrics, message):
    out = k.apply(fleet(metrics=metrics), check=False)
    assert out.returncode != 0, f"accepted: {metrics}"
    assert message in out.stderr, out.stderr
