"""Grafana building blocks: panels, their targets, the template variables, and a dashboard that lays
its panels out in rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .queries import FLEET, RATE

DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass
class Target:
    expr: str
    legend: str = ""
    fmt: str = "time_series"


def _targets(targets: list[Target]) -> list[dict[str, Any]]:
    return [
        {
            "datasource": DS,
            "refId": chr(ord("A") + i),
            "expr": t.expr,
            "legendFormat": t.legend or "__auto",
            "format": t.fmt,
            "range": True,
            "instant": False,
        }
        for i, t in enumerate(targets)
    ]


def timeseries(
    title: str,
    description: str,
    targets: list[Target],
    unit: str = "short",
    *,
    stack: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
    no_value: str | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if no_value is not None:
        defaults["noValue"] = no_value  # what the panel says instead of "No data"
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["mean", "max", "lastNotNull"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": _targets(targets),
    }


def stat(
    title: str,
    description: str,
    target: Target,
    unit: str = "short",
    thresholds: tuple[tuple[str, float | None], ...] = (),
) -> dict[str, Any]:
    steps = [{"color": color, "value": value} for color, value in (thresholds or [("green", None)])]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
        "targets": _targets([target]),
    }


def heatmap(title: str, description: str, bucket_expr: str, unit: str = "s") -> dict[str, Any]:
    """A histogram's buckets over time; `bucket_expr` is summed by `le` per step."""
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Spectral",
                "steps": 64,
                "exponent": 0.5,
                "fill": "dark-orange",
            },
            "yAxis": {"axisPlacement": "left", "unit": unit},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": True},
            "legend": {"show": True},
            "filterValues": {"le": 1e-9},
        },
        "targets": _targets([Target(f"sum by (le) ({bucket_expr})", "{{le}}", "heatmap")]),
    }


def quantiles(title: str, description: str, bucket: str, selector: str, by: str = "") -> dict[str, Any]:
    """p50 / p95 / p99 of a histogram, summed across pods (and split by `by` when given)."""
    group = f"{by}, le" if by else "le"
    prefix = f"{{{{{by}}}}} " if by else ""
    return timeseries(
        title,
        description,
        [
            Target(
                f"histogram_quantile({q}, sum by ({group}) (rate({bucket}{{{selector}}}[{RATE}])))",
                f"{prefix}p{round(q * 100)}",
            )
            for q in (0.5, 0.95, 0.99)
        ],
        "s",
    )


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[dict[str, Any]]
    panels: list[dict[str, Any]] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _h: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, panel: dict[str, Any], w: int = 12, h: int = 8) -> None:
        if self._x + w > 24:
            self._newline()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        self.panels.append(panel)
        self._x += w
        self._h = max(self._h, h)

    def _newline(self) -> None:
        if self._x:
            self._y += self._h
        self._x, self._h = 0, 0

    def json(self) -> dict[str, Any]:
        for i, panel in enumerate(self.panels, start=1):
            panel["id"] = i
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["fleetmq", "mqtt"],
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"},
            "timepicker": {},
            "timezone": "",
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "weekStart": "",
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "links": [
                {
                    "title": "fleetmq dashboards",
                    "type": "dashboards",
                    "tags": ["fleetmq"],
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                    "icon": "external link",
                    "targetBlank": False,
                    "tooltip": "",
                    "url": "",
                }
            ],
            "templating": {"list": self.variables},
            "panels": self.panels,
        }


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value label variable whose "All" is `.*`, so it also matches samples without the label."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": query,
        "definition": query,
        "current": {},
        "hide": 0,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 1,
    }


def broker_variables() -> list[dict[str, Any]]:
    return [
        datasource_variable(),
        query_variable("namespace", "Namespace", "label_values(fleetmq_connections, namespace)"),
        query_variable(
            "job", "Fleet (job)", 'label_values(fleetmq_connections{namespace=~"$namespace"}, job)'
        ),
        query_variable(
            "pod", "Pod", 'label_values(fleetmq_connections{namespace=~"$namespace", job=~"$job"}, pod)'
        ),
        query_variable("zone", "Zone", f"label_values(fleetmq_connections{{{FLEET}}}, zone)"),
    ]


def operator_variables() -> list[dict[str, Any]]:
    return [
        datasource_variable(),
        query_variable("namespace", "Namespace", "label_values(fleetmq_operator_fleets, namespace)"),
        query_variable("pod", "Pod", 'label_values(fleetmq_operator_fleets{namespace=~"$namespace"}, pod)'),
    ]
