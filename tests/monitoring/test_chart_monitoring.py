"""What the chart installs is exactly what was generated and proven: the PrometheusRule's spec is the rule
file (Helm must not template the alerts' own `{{ $value }}`), each dashboard's ConfigMap holds its JSON."""

from __future__ import annotations

import json

from fleetmq.operator import grafana

MONITORING = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule")


def _kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def test_prometheusrule_carries_the_generated_rules(helm):
    (rule,) = _kind(
        helm.template({"prometheusRule": {"labels": {"release": "kps"}}}, *MONITORING), "PrometheusRule"
    )
    assert rule["spec"] == grafana.alert_groups()
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == "fleetmq-system"
    assert not _kind(helm.template(None), "PrometheusRule")  # no Prometheus Operator: nothing to apply


def test_dashboard_configmaps_hold_the_generated_json(helm):
    files = {rel.rsplit("/", 1)[1]: text for rel, text in grafana.render().items() if rel.endswith(".json")}
    shipped = {}
    for cm in _kind(helm.template(None), "ConfigMap"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1":
            shipped.update(cm["data"])
    assert set(shipped) == set(files)
    for name, text in shipped.items():
        assert json.loads(text) == json.loads(files[name]), name
