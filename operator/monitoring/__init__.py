"""The chart's Grafana dashboards and Prometheus alert rules (`python -m fleetmq.operator.monitoring`).

One source of truth for every PromQL expression the chart ships: the dashboards in
charts/fleetmq/dashboards/*.json (shipped as ConfigMaps for the Grafana sidecar) and the alert rules in
charts/fleetmq/files/alerts.yaml (wrapped in a PrometheusRule). Never edit those files by hand: a test fails
when they differ from this output, and tests/monitoring evaluates every expression against a real
Prometheus scraping real brokers, so a renamed metric breaks a test rather than a panel.

Metric names are those of broker/metrics.py and operator/metrics.py. Selectors follow what a
prometheus-operator ServiceMonitor attaches to each sample (namespace, job = the fleet's headless Service,
pod); outside Kubernetes those labels are missing and the template variables' "All" (`.*`) still matches.

A build-time generator, apart from the operator's runtime: nothing there imports it, and the wheel (the
operator's image) leaves it out (pyproject.toml lists the packages it ships).
"""

from .alerts import RUNBOOK_BASE_URL, RUNBOOK_DIR, alert_groups, runbook_url
from .dashboards import DASHBOARDS
from .generate import ALERTS_FILE, CHART_DIR, DASHBOARD_DIR, dashboard_queries, main, render, stale, write

__all__ = [
    "ALERTS_FILE",
    "CHART_DIR",
    "DASHBOARDS",
    "DASHBOARD_DIR",
    "RUNBOOK_BASE_URL",
    "RUNBOOK_DIR",
    "alert_groups",
    "dashboard_queries",
    "main",
    "render",
    "runbook_url",
    "stale",
    "write",
]
