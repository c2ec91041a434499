"""BrokerFleet spec.metrics.serviceMonitor in a real kube-apiserver: defaults, kubectl explain, and bad
labels or scrape settings refused with the field's path before the operator renders anything."""

from __future__ import annotations

import pytest

from .conftest import fleet, wait_for

SM = "spec.metrics.serviceMonitor"


def test_defaults_and_explain(k):
    k.apply(fleet())
    sm = k.get("brokerfleet", "edge")["spec"]["metrics"]["serviceMonitor"]
    assert sm == {"enabled": True, "interval": "30s", "labels": {}}
    out = wait_for(lambda: (o := k("explain", "brokerfleet.spec.metrics.serviceMonitor.labels", check=False).stdout)
                   and "serviceMonitorSelector" in o and o, msg="kubectl explain")  # fmt: skip
    assert "FIELD: labels <map[string]string>" in out
    out = k("explain", "brokerfleet.spec.metrics.serviceMonitor").stdout
    for field in ("enabled", "interval", "scrapeTimeout", "labels"):
        assert f"  {field}\t" in out, out


def test_good_settings_are_kept(k):
    sm = {"labels": {"release": "kube-prometheus-stack", "example.com/team": "mq-1"}, "interval": "15s",
          "scrapeTimeout": "15s"}  # fmt: skip
    k.apply(fleet(metrics={"serviceMonitor": sm}))
    assert k.get("brokerfleet", "edge")["spec"]["metrics"]["serviceMonitor"] == {"enabled": True, **sm}


@pytest.mark.parametrize(
    ("service_monitor", "message"),
    [
        ({"labels": {"bad key": "x"}}, f"{SM}.labels: Invalid value: \"object\": label keys must be"),
        ({"labels": {"-x": "y"}}, f"{SM}.labels: Invalid value: \"object\": label keys must be"),
        ({"labels": {"a/b/c": "y"}}, f"{SM}.labels: Invalid value: \"object\": label keys must be"),
        ({"labels": {"x" * 64: "y"}}, f"{SM}.labels: Invalid value: \"object\": label keys must be"),
        ({"labels": {"fleetmq.io/fleet": "other"}}, f"{SM}.labels: Invalid value: \"object\": labels cannot replace"),
        ({"labels": {"release": "not ok"}}, f"{SM}.labels.release: Invalid value: \"not ok\""),
        ({"labels": {"release": "x" * 64}}, f"{SM}.labels.release: Too long"),
        ({"labels": {"release": 1}}, f"{SM}.labels.release: Invalid value: \"integer\""),
        ({"interval": "often"}, f"{SM}.interval: Invalid value: \"often\""),
        ({"scrapeTimeout": "1m"}, f"{SM}.scrapeTimeout: Invalid value: \"object\": scrapeTimeout cannot exceed"),
        ({"interval": "1m", "scrapeTimeout": "2m"}, f"{SM}.scrapeTimeout: Invalid value: \"object\": scrapeTimeout"),
        ({"scrapeTimeout": "10"}, f"{SM}.scrapeTimeout: Invalid value: \"10\""),
        (True, f"{SM}: Invalid value: \"boolean\""),
    ],
    ids=["key-space", "key-dash", "key-two-slashes", "key-name-too-long", "own-label", "value-pattern",
         "value-too-long", "value-type", "interval-pattern", "timeout-over-default-interval",
         "timeout-over-interval", "timeout-unit", "former-boolean"],
)  # fmt: skip
def test_bad_settings_are_refused_with_the_fields_path(k, service_monitor, message):
    out = k.apply(fleet(metrics={"serviceMonitor": service_monitor}), check=False)
    assert out.returncode != 0, f"accepted: {service_monitor}"
    assert message in out.stderr, out.stderr
