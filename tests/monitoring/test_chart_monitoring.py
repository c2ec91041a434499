"""What the chart installs is exactly what was generated and proven: the PrometheusRule's spec is the rule
file (Helm must not template the alerts' own `{{ $value }}`) with only the runbook links rebased when asked,
each dashboard's ConfigMap holds its JSON, and the operator's ServiceMonitor takes its scrape settings."""

from __future__ import annotations

import copy
import json

import pytest
from fleetmq.operator import monitoring

from tests.chart.conftest import CHART

MONITORING = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
SERVICE_MONITOR = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")


def _kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def test_prometheusrule_carries_the_generated_rules(helm):
    (rule,) = _kind(
        helm.template({"prometheusRule": {"labels": {"release": "kps"}}}, *MONITORING), "PrometheusRule"
    )
    assert rule["spec"] == monitoring.alert_groups()
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == "fleetmq-system"
    assert not _kind(helm.template(None), "PrometheusRule")  # no Prometheus Operator: nothing to apply


def test_dashboard_configmaps_hold_the_generated_json(helm):
    files = {
        rel.rsplit("/", 1)[1]: text for rel, text in monitoring.render().items() if rel.endswith(".json")
    }
    shipped = {}
    for cm in _kind(helm.template(None), "ConfigMap"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1":
            shipped.update(cm["data"])
    assert set(shipped) == set(files)
    for name, text in shipped.items():
        assert json.loads(text) == json.loads(files[name]), name


def test_runbook_urls_follow_the_configured_base(helm):
    (rule,) = _kind(helm.template(None, *MONITORING), "PrometheusRule")
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert urls == {name: monitoring.runbook_url(name) for name in urls}  # docs/runbooks/<alert>.md
    base = "https://git.example/mq/fleetmq/blob/v0.1.0/docs/runbooks"
    (rule,) = _kind(
        helm.template({"prometheusRule": {"runbookBaseUrl": base + "/"}}, *MONITORING), "PrometheusRule"
    )
    moved = copy.deepcopy(monitoring.alert_groups())
    for group in moved["groups"]:
        for r in group["rules"]:
            r["annotations"]["runbook_url"] = f"{base}/{r['alert']}.md"
    assert rule["spec"] == moved  # only the runbook links changed


def test_operator_servicemonitor_scrape_timeout(helm):
    values = {
        "metrics": {
            "serviceMonitor": {"interval": "1m", "scrapeTimeout": "20s", "labels": {"release": "kps"}}
        }
    }
    (sm,) = _kind(helm.template(values, *SERVICE_MONITOR), "ServiceMonitor")
    assert (
        sm["spec"]["endpoints"][0]["interval"] == "1m"
        and sm["spec"]["endpoints"][0]["scrapeTimeout"] == "20s"
    )
    assert sm["metadata"]["labels"]["release"] == "kps"
    (sm,) = _kind(helm.template(None, *SERVICE_MONITOR), "ServiceMonitor")
    assert "scrapeTimeout" not in sm["spec"]["endpoints"][0]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"prometheusRule": {"runbookBaseUrl": "https://x/ runbooks"}}, "/prometheusRule/runbookBaseUrl"),
        ({"prometheusRule": {"runbookBaseUrl": "{{ .Values }}"}}, "/prometheusRule/runbookBaseUrl"),
        ({"metrics": {"serviceMonitor": {"scrapeTimeout": "soon"}}}, "/metrics/serviceMonitor/scrapeTimeout"),
    ],
    ids=["base-with-space", "base-with-template", "timeout-pattern"],
)
def test_values_schema_refuses_bad_monitoring_values(helm, values, where):
    out = helm("template", "fleetmq", str(CHART), *helm.values_file(values), check=False)
    assert out.returncode != 0, out.stdout
    assert "values don't meet the specifications of the schema" in out.stderr + out.stdout
    assert where in out.stderr + out.stdout, out.stderr
