"""Generate the chart's Grafana dashboards and Prometheus alert rules (`python -m fleetmq.operator.grafana`).

One source of truth for every PromQL expression the chart ships: the dashboards in
charts/fleetmq/dashboards/*.json (shipped as ConfigMaps for the Grafana sidecar) and the alert rules in
charts/fleetmq/files/alerts.yaml (wrapped in a PrometheusRule). Never edit those files by hand: a test fails
when they differ from this output, and tests/monitoring evaluates every expression against a real
Prometheus scraping real brokers, so a renamed metric breaks a test rather than a panel.

Metric names are those of broker/metrics.py and operator/metrics.py. Selectors follow what a
prometheus-operator ServiceMonitor attaches to each sample (namespace, job = the fleet's headless Service,
pod); outside Kubernetes those labels are missing and the template variables' "All" (`.*`) still matches.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fleetmq.broker.eventschema import BRIDGE_LOST, DropReason

#: the drop reasons that lose a message the broker had accepted (the loss panels and alerts)
LOST = [r.value for r in DropReason if r.lost]

CHART_DIR = Path(__file__).resolve().parent.parent / "charts" / "fleetmq"
DASHBOARD_DIR = "dashboards"
ALERTS_FILE = "files/alerts.yaml"

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"

# Label selectors shared by every broker panel: the template variables, then the zone where samples have one.
FLEET = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
ZONE = f'{FLEET}, zone=~"$zone"'
OPERATOR = 'namespace=~"$namespace", pod=~"$pod"'


def fleet_ready(selector: str = "") -> str:
    """1/0 per BrokerFleet, one value even while two operator pods report it (a peering handover);
    `selector` picks operator pods (the dashboard's variables; none for the alert)."""
    return f"max by (fleet_namespace, fleet) (fleetmq_operator_fleet_ready{'{' + selector + '}' if selector else ''})"


def fleet_store(what: str, state: str = "") -> str:
    """fleetmq_operator_fleet_store_<what> per BrokerFleet (one value across an operator handover), with the
    fleet's namespace as `namespace`, as on the broker alerts."""
    sel = f'{{state="{state}"}}' if state else ""
    return (
        f"label_replace(max by (fleet_namespace, fleet) (fleetmq_operator_fleet_store_{what}{sel}), "
        '"namespace", "$1", "fleet_namespace", "(.*)")'
    )


# ------------------------------------------------------------------------------------------ panels
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


# ------------------------------------------------------------------------------------------ variables
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


def rate(metric: str, selector: str = ZONE, by: str = "") -> str:
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{{{selector}}}[{RATE}]))"


# ------------------------------------------------------------------------------------------ dashboards
def fleet_overview() -> Dashboard:
    d = Dashboard(
        "fleetmq-overview",
        "fleetmq / Fleet overview",
        "Connections, sessions and their lifecycle across a fleet of fleetmq brokers.",
        broker_variables(),
    )
    d.row("Now")
    # the scrape jobs of fleets: those whose pods exported broker metrics within the hour, even if none does now
    fleet_jobs = f"group by (namespace, job) (last_over_time(fleetmq_zone_config_info{{{ZONE}}}[1h]))"
    d.add(
        stat(
            "Broker pods up",
            "Broker pods whose /metrics answered Prometheus's last scrape.",
            Target(f"sum(up{{{FLEET}}} and on (namespace, job) {fleet_jobs})"),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Broker pods down",
            "Pods of a fleet whose /metrics did not answer the last scrape: crashed, hung or not scheduled "
            "(alert FleetmqBrokerDown).",
            Target(f"count(up{{{FLEET}}} == 0 and on (namespace, job) {fleet_jobs}) or on () vector(0)"),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat("Connections", "Open MQTT connections.", Target(f"sum(fleetmq_connections{{{ZONE}}})")), w=4, h=4
    )
    d.add(
        stat(
            "Sessions online",
            "Sessions with a connected client.",
            Target(f'sum(fleetmq_sessions{{{ZONE}, state="online"}})'),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Sessions offline",
            "Persistent sessions kept for a disconnected client (they queue messages until they expire).",
            Target(f'sum(fleetmq_sessions{{{ZONE}, state="offline"}})'),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Messages in",
            "PUBLISH packets received from clients per second.",
            Target(rate("fleetmq_messages_received_total")),
            "ops",
        ),
        w=4,
        h=4,
    )
    d.row("Connections and sessions")
    d.add(
        timeseries(
            "Connections by zone",
            "Open MQTT connections per zone (a zone is a set of listeners sharing session settings).",
            [Target(f"sum by (zone) (fleetmq_connections{{{ZONE}}})", "{{zone}}")],
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Connections by pod",
            "Open MQTT connections per broker pod: an uneven spread points at the load balancer.",
            [Target(f"sum by (pod) (fleetmq_connections{{{ZONE}}})", "{{pod}}")],
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Sessions by zone and state",
            "Online sessions have a connection; offline ones are persistent sessions waiting for their "
            "client (in Redis, so any pod can resume them).",
            [Target(f"sum by (zone, state) (fleetmq_sessions{{{ZONE}}})", "{{zone}} {{state}}")],
        )
    )
    d.add(
        timeseries(
            "Session events",
            "Sessions created, resumed, taken over (the client id connected again, here or on another "
            "pod), discarded (Clean Start) and expired, per second.",
            [Target(rate("fleetmq_session_events_total", by="event"), "{{event}}")],
            "ops",
        )
    )
    d.row("Takeovers and disconnects")
    d.add(
        timeseries(
            "Takeovers by zone",
            "Connections that took over a live session. A steady high rate means clients share a client id "
            "or reconnect before the old connection died (alert FleetmqTakeoverStorm).",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_session_events_total{{{ZONE}, event="takenover"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        quantiles(
            "Session resume latency",
            "CONNECT to session resumed (including a takeover from another pod through Redis).",
            "fleetmq_takeover_duration_seconds_bucket",
            FLEET,
        )
    )
    d.add(
        timeseries(
            "Disconnects by reason",
            "Closed connections per second by reason: client DISCONNECT (normal), socket closed, "
            "keep-alive timeout, takeover, protocol errors, server shutdown...",
            [Target(rate("fleetmq_disconnects_total", by="reason"), "{{reason}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Keep-alive timeouts by zone",
            "Connections closed because nothing arrived within keep alive x backoff x 2: clients that lost "
            "their network (alert FleetmqKeepaliveTimeoutsSpiking).",
            [Target(rate("fleetmq_keepalive_timeouts_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    d.row("Configuration")
    d.add(
        timeseries(
            "Pods per applied zone config",
            "Broker pods running each config hash of a zone. Two hashes for one zone for long means a pod "
            "did not apply a change (alert FleetmqZoneConfigDiverged).",
            [
                Target(
                    "count by (zone, config_hash) (group by (namespace, job, pod, zone, config_hash) "
                    f"(fleetmq_zone_config_info{{{ZONE}}}))",
                    "{{zone}} {{config_hash}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Config reload errors",
            "Config files (or listeners) refused at a live reload, per pod; the pod keeps its previous config.",
            [Target(rate("fleetmq_config_reload_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    return d


def message_flow() -> Dashboard:
    d = Dashboard(
        "fleetmq-messages",
        "fleetmq / Message flow",
        "Messages in, delivered and acknowledged by QoS, delivery latency, drops and retransmissions.",
        broker_variables(),
    )
    d.row("Throughput")
    for metric, what, why, selector in (
        ("received", "Received", "PUBLISH packets received from clients", ZONE),
        ("delivered", "Delivered", "PUBLISH packets written to subscribers (one per subscription)", ZONE),
        ("acked", "Acknowledged", "QoS 1/2 deliveries acknowledged (PUBACK, PUBCOMP)", f'{ZONE}, qos!="0"'),
    ):
        d.add(
            timeseries(
                f"{what} by QoS",
                f"{why}, per second, by QoS.",
                [Target(rate(f"fleetmq_messages_{metric}_total", selector, "qos"), "QoS {{qos}}")],
                "ops",
                stack=True,
            ),
            w=8,
        )
    d.add(
        timeseries(
            "Received and delivered by zone",
            "Messages in and out per zone. Delivered counts each subscriber, so fan-out shows as the gap.",
            [
                Target(rate("fleetmq_messages_received_total", by="zone"), "{{zone}} in"),
                Target(rate("fleetmq_messages_delivered_total", by="zone"), "{{zone}} delivered"),
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Unacknowledged QoS 1/2 deliveries",
            "QoS 1/2 deliveries per second minus acknowledgements: positive while subscribers fall behind.",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_messages_delivered_total{{{ZONE}, qos!="0"}}[{RATE}])) '
                    f'- sum by (zone) (rate(fleetmq_messages_acked_total{{{ZONE}, qos!="0"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
            minimum=None,
        )
    )
    d.row("Latency")
    d.add(
        quantiles(
            "Delivery latency",
            "Publish to the subscriber's acknowledgement of QoS 1/2 deliveries (PUBACK / PUBCOMP), all zones; "
            "it includes time spent queued behind a full Inflight Window.",
            "fleetmq_delivery_latency_seconds_bucket",
            ZONE,
        )
    )
    d.add(
        quantiles(
            "Delivery latency by zone",
            "The same quantiles per zone: a slow zone is usually slow subscribers or a full window.",
            "fleetmq_delivery_latency_seconds_bucket",
            ZONE,
            by="zone",
        )
    )
    d.add(
        heatmap(
            "Delivery latency distribution",
            "Deliveries per latency bucket over time; a second band means a group of slow subscribers.",
            f"rate(fleetmq_delivery_latency_seconds_bucket{{{ZONE}}}[{RATE}])",
        ),
        w=24,
    )
    d.row("Losses and resends")
    d.add(
        timeseries(
            "Drops by reason",
            "Messages dropped per second: " + "; ".join(f"{r} ({r.description})" for r in DropReason) + ".",
            [Target(rate("fleetmq_messages_dropped_total", by="reason"), "{{reason}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Drops by zone",
            f"Drops that lose a message the broker had accepted ({', '.join(LOST)}), per zone; refused "
            "publishes and messages nobody (allowed to read them) subscribed to are not counted here.",
            [
                Target(
                    f"sum by (zone) (rate(fleetmq_messages_dropped_total{{{ZONE}, "
                    f'reason=~"{"|".join(LOST)}"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Retransmit ratio",
            "PUBLISH/PUBREL resent (after retry_interval for MQTT 3.1.1 sessions, or on reconnect) per QoS 1/2 "
            "delivery, per zone. Above a few percent subscribers do not ack in time.",
            [
                Target(
                    f"sum by (zone) (rate(fleetmq_messages_retransmitted_total{{{ZONE}}}[{RATE}])) "
                    f'/ sum by (zone) (rate(fleetmq_messages_delivered_total{{{ZONE}, qos!="0"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "percentunit",
        )
    )
    d.add(
        timeseries(
            "Retransmissions",
            "PUBLISH (DUP) and PUBREL packets resent per second, per zone.",
            [Target(rate("fleetmq_messages_retransmitted_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    _bridges_row(d)
    return d


def _bridges_row(d: Dashboard) -> None:
    """Bridges to remote brokers: each pod reports its own view, so the leader's is the max (connected,
    queue) and counters sum over pods."""
    d.row("Bridges")
    d.add(
        timeseries(
            "Bridges connected",
            "1 while a pod of the fleet has the bridge connected to its remote (alert FleetmqBridgeDown).",
            [Target(f"max by (bridge) (fleetmq_bridge_connected{{{FLEET}}})", "{{bridge}}")],
            "short",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge queues",
            "Messages waiting for the remote, against each bridge's queue.maxLength (alert "
            "FleetmqBridgeQueueFilling at 80%).",
            [
                Target(f"max by (bridge) (fleetmq_bridge_queue_messages{{{FLEET}}})", "{{bridge}}"),
                Target(
                    f"max by (bridge) (fleetmq_bridge_queue_limit_messages{{{FLEET}}})", "{{bridge}} limit"
                ),
            ],
            "short",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge traffic",
            "Messages the remotes acknowledged (forwarded) and messages from them published here (received).",
            [
                Target(
                    rate("fleetmq_bridge_messages_forwarded_total", FLEET, "bridge"), "{{bridge}} forwarded"
                ),
                Target(
                    rate("fleetmq_bridge_messages_received_total", FLEET, "bridge"), "{{bridge}} received"
                ),
            ],
            "ops",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge drops",
            "Messages a bridge did not pass on, by reason (loop and excluded are by design; alert "
            "FleetmqBridgeDrops on the others).",
            [
                Target(
                    rate("fleetmq_bridge_messages_dropped_total", FLEET, "bridge, reason"),
                    "{{bridge}} {{reason}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Bridge reconnects",
            "Connections to the remote that ended or failed, by reason, and leader changes (a pod taking the "
            "bridge over).",
            [
                Target(
                    rate("fleetmq_bridge_reconnects_total", FLEET, "bridge, reason"), "{{bridge}} {{reason}}"
                ),
                Target(
                    rate("fleetmq_bridge_leader_changes_total", FLEET, "bridge"), "{{bridge}} leader change"
                ),
            ],
            "ops",
        )
    )
    d.add(
        quantiles(
            "Bridge forward latency",
            "Local publish to the remote's acknowledgement (PUBACK / PUBCOMP) of QoS 1/2 messages a bridge "
            "forwarded: time queued while the remote was away included.",
            "fleetmq_bridge_forward_latency_seconds_bucket",
            FLEET,
            by="bridge",
        )
    )


def windows_and_queues() -> Dashboard:
    d = Dashboard(
        "fleetmq-windows",
        "fleetmq / Windows and queues",
        "Inflight Windows, Message Queues and incoming QoS 2 state (EMQX semantics, per zone).",
        broker_variables(),
    )
    d.row("Inflight Window")
    d.add(
        timeseries(
            "Inflight messages by zone",
            "Unacknowledged QoS 1/2 deliveries in Inflight Windows (at most max_inflight per client).",
            [Target(f"sum by (zone) (fleetmq_inflight_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Inflight per online session",
            "Average Inflight Window fill per connected session; compare with the zone's max_inflight.",
            [
                Target(
                    f"sum by (zone) (fleetmq_inflight_messages{{{ZONE}}}) "
                    f'/ sum by (zone) (fleetmq_sessions{{{ZONE}, state="online"}})',
                    "{{zone}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Inflight Window utilisation",
            "Average Inflight Window fill of a connected session as a share of the zone's max_inflight, per "
            "fleet and zone (zones without a limit, max_inflight 0, are left out). Near 1: windows are full "
            "and further deliveries queue. MQTT 5 clients may allow fewer (Receive Maximum).",
            [_utilisation("fleetmq_inflight_messages", 'state="online"', "fleetmq_zone_max_inflight")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Inflight Window full (share of QoS 1/2 deliveries)",
            "Of the QoS 1/2 deliveries, the share that found the client's window full and had to queue: "
            "near 1 means subscribers ack slower than messages arrive (alert FleetmqInflightWindowFull).",
            [Target(_window_full_share(ZONE, "zone", RATE), "{{zone}}")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Inflight Window full rate",
            "Deliveries per second that went to the Message Queue because the Inflight Window was full.",
            [Target(rate("fleetmq_inflight_full_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Zone limits",
            "Each zone's max_inflight and max_mqueue_len as its pods run it now (0 = no limit); a live zone "
            "change shows here once the pods applied it.",
            [
                Target(
                    f"max by (namespace, job, zone) (fleetmq_zone_max_inflight{{{ZONE}}})",
                    "{{job}} {{zone}} max_inflight",
                ),
                Target(
                    f"max by (namespace, job, zone) (fleetmq_zone_max_mqueue_len{{{ZONE}}})",
                    "{{job}} {{zone}} max_mqueue_len",
                ),
            ],
        )
    )
    d.row("Message Queue")
    d.add(
        timeseries(
            "Queued messages by zone",
            "Deliveries waiting in Message Queues (online sessions behind a full window, and offline "
            "persistent sessions), at most max_mqueue_len per session.",
            [Target(f"sum by (zone) (fleetmq_mqueue_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Queued messages by pod",
            "Message Queue depth per pod (offline sessions count on the pod that holds them in memory).",
            [Target(f"sum by (pod) (fleetmq_mqueue_messages{{{ZONE}}})", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Message Queue fill",
            "Average Message Queue depth of a session (online and offline) as a share of the zone's "
            "max_mqueue_len, per fleet and zone (zones without a limit are left out). Sessions at 1 drop "
            "their oldest message for each new one (Queue-full drops).",
            [_utilisation("fleetmq_mqueue_messages", "", "fleetmq_zone_max_mqueue_len")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Queue-full drops by zone",
            "Messages dropped because a Message Queue was full (the oldest goes; alert FleetmqQueueDrops).",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_messages_dropped_total{{{ZONE}, reason="{DropReason.QUEUE_FULL}"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Offline sessions by zone",
            "Persistent sessions without a client: each one queues what its subscriptions match.",
            [Target(f'sum by (zone) (fleetmq_sessions{{{ZONE}, state="offline"}})', "{{zone}}")],
        )
    )
    d.row("Incoming QoS 2")
    d.add(
        timeseries(
            "Awaiting PUBREL by zone",
            "Incoming QoS 2 messages received (PUBREC sent) whose PUBREL has not arrived yet, at most "
            "max_awaiting_rel per client.",
            [Target(f"sum by (zone) (fleetmq_awaiting_rel_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Awaiting PUBREL timeouts and refusals",
            "Incoming QoS 2 entries discarded after await_rel_timeout, and QoS 2 publishes refused because "
            "max_awaiting_rel was reached.",
            [
                Target(
                    f"sum by (zone, reason) (rate(fleetmq_messages_dropped_total{{{ZONE}, "
                    f'reason=~"{DropReason.AWAITING_REL_TIMEOUT}|{DropReason.AWAITING_REL_FULL}"}}[{RATE}]))',
                    "{{zone}} {{reason}}",
                )
            ],
            "ops",
        )
    )
    return d


def _utilisation(depth: str, sessions: str, limit: str) -> Target:
    """Per fleet and zone: `depth` per session (of the `sessions` state) / the zone's `limit`, where both are
    non-zero. The limit is the largest any pod runs (pods differ only while a zone change rolls out)."""
    keys = "namespace, job, zone"
    state = f"{ZONE}, {sessions}" if sessions else ZONE
    return Target(
        f"sum by ({keys}) ({depth}{{{ZONE}}}) / (sum by ({keys}) (fleetmq_sessions{{{state}}}) > 0) "
        f"/ (max by ({keys}) ({limit}{{{ZONE}}}) > 0)",
        "{{job}} {{zone}}",
    )


def _window_full_share(selector: str, by: str, window: str) -> str:
    """Inflight-full events / (those + QoS 1/2 deliveries): 0..1, and NaN (no series) without QoS 1/2 traffic."""
    full = f"sum by ({by}) (rate(fleetmq_inflight_full_total{'{' + selector + '}' if selector else ''}[{window}]))"
    qos12 = f'{selector}, qos!="0"' if selector else 'qos!="0"'
    sent = f"sum by ({by}) (rate(fleetmq_messages_delivered_total{{{qos12}}}[{window}]))"
    return f"{full} / ({full} + {sent})"


def store() -> Dashboard:
    d = Dashboard(
        "fleetmq-store",
        "fleetmq / Redis session store",
        "The shared Redis every broker keeps its sessions in: latency, round trips, errors, reconnects.",
        broker_variables(),
    )
    d.row("Latency")
    d.add(
        quantiles(
            "Store operation latency",
            "Time of one session-store operation (a group commit carries every write of an event-loop turn). "
            "Publisher acks (PUBACK/PUBREC) wait for it.",
            "fleetmq_store_op_duration_seconds_bucket",
            FLEET,
            by="op",
        )
    )
    d.add(
        timeseries(
            "Store operations",
            "Session-store operations per second, by operation.",
            [Target(rate("fleetmq_store_op_duration_seconds_count", FLEET, "op"), "{{op}}")],
            "ops",
        )
    )
    d.add(
        heatmap(
            "Store operation latency distribution",
            "Store operations per latency bucket over time.",
            f"rate(fleetmq_store_op_duration_seconds_bucket{{{FLEET}}}[{RATE}])",
        ),
        w=24,
    )
    d.row("Round trips")
    d.add(
        timeseries(
            "Round trips by pod",
            "Round trips to Redis per second (a group commit or a pipelined batch is one).",
            [Target(rate("fleetmq_store_round_trips_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Round trips per received message",
            "Group-commit efficiency: below 1 means several publishes share one Redis round trip.",
            [
                Target(
                    f"sum by (pod) (rate(fleetmq_store_round_trips_total{{{FLEET}}}[{RATE}])) "
                    f"/ sum by (pod) (rate(fleetmq_messages_received_total{{{ZONE}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
        )
    )
    d.row("Failures")
    d.add(
        timeseries(
            "Store errors",
            "Failed session-store operations per pod. Publishes are not acked while Redis fails, and new "
            "persistent sessions are refused (alert FleetmqStoreErrors).",
            [Target(rate("fleetmq_store_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Store reconnects",
            "Times a pod resynchronised with Redis after losing it, in each interval.",
            [
                Target(
                    f"sum by (pod) (increase(fleetmq_store_reconnects_total{{{FLEET}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
        )
    )
    d.row("Topology: primaries, replicas, failovers")
    d.add(
        timeseries(
            "Primaries written to",
            "The store's primaries (legend: topology and address) and how many pods write to each. A Sentinel "
            "failover or a cluster shard's promoted replica shows as a new primary.",
            [
                Target(
                    f"count by (topology, primary) (fleetmq_store_info{{{FLEET}}})",
                    "{{topology}} {{primary}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Replicas in sync",
            "Replicas of the store's primary online and at most 1 s behind, as each pod last saw them (the "
            "fewest over a cluster's shards). 0 on a replicated store: a failover now loses the writes only "
            "the primary has, and with wait_replicas 1 writes are refused (alert FleetmqStoreNoReplicaInSync).",
            [Target(f"min by (pod) (fleetmq_store_replicas_in_sync{{{FLEET}}})", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Failovers seen",
            "Times each pod found the store's primary moved (Sentinel) or a shard's slots served by another "
            "primary (Cluster), in each interval (alert FleetmqStoreFailoverStorm).",
            [Target(f"sum by (pod) (increase(fleetmq_store_failovers_total{{{FLEET}}}[{RATE}]))", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Retries and round trips by shard",
            "Store operations run again on a fresh connection (retries, per pod), and round trips per second "
            "to each shard: on a Redis Cluster the shards should carry about equal shares.",
            [
                Target(rate("fleetmq_store_retries_total", FLEET, "pod"), "retries {{pod}}"),
                Target(rate("fleetmq_store_round_trips_total", FLEET, "shard"), "{{shard}}"),
            ],
            "ops",
        )
    )
    d.row("Event log (the pipeline's input)")
    off = "event log disabled"
    d.add(
        timeseries(
            "Event log records",
            "Events appended to the fleet's Redis Streams per second (written), and those dropped rather than "
            "slowing delivery down when sends fail or fall behind. Exported while event_log is enabled.",
            [Target(rate("fleetmq_event_log_records_total", FLEET, "outcome"), "{{outcome}}")],
            "ops",
            stack=True,
            no_value=off,
        )
    )
    d.add(
        timeseries(
            "Event log dropped share",
            "Share of event records dropped, per pod: the pipeline's KPIs miss what is dropped.",
            [
                Target(
                    f'sum by (pod) (rate(fleetmq_event_log_records_total{{{FLEET}, outcome="dropped"}}[{RATE}])) '
                    f"/ sum by (pod) (rate(fleetmq_event_log_records_total{{{FLEET}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
            "percentunit",
            no_value=off,
        ),
        w=6,
    )
    d.add(
        timeseries(
            "Event log send errors",
            "Failed sends of event batches to Redis per second, per pod (their records are retried or dropped).",
            [Target(rate("fleetmq_event_log_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
            no_value=off,
        ),
        w=6,
    )
    return d


def operator() -> Dashboard:
    d = Dashboard(
        "fleetmq-operator",
        "fleetmq / Operator",
        "The fleetmq-operator's reconciliations of BrokerFleets and MqttZones.",
        operator_variables(),
    )
    d.row("Now")
    d.add(
        stat(
            "Fleets",
            "BrokerFleets this operator reconciles.",
            Target(f"sum(fleetmq_operator_fleets{{{OPERATOR}}})"),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Fleets not Ready",
            "BrokerFleets whose Ready condition is False: not every pod is ready or runs the rendered config "
            "(alert FleetmqFleetNotReady).",
            Target(f"count({fleet_ready(OPERATOR)} == 0) or on () vector(0)"),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Zones accepted",
            "MqttZones accepted into their fleet's config at the last reconciliations.",
            Target(f'sum(fleetmq_operator_zones{{{OPERATOR}, state="accepted"}})'),
        ),
        w=5,
        h=4,
    )
    d.add(
        stat(
            "Zones rejected",
            "MqttZones refused (invalid, conflicting ports, unknown fleet): see their status conditions.",
            Target(f'sum(fleetmq_operator_zones{{{OPERATOR}, state="rejected"}})'),
            thresholds=(("green", None), ("orange", 1)),
        ),
        w=5,
        h=4,
    )
    d.add(
        stat(
            "Reconcile errors (1h)",
            "Failed reconciliations in the last hour.",
            Target(
                f'sum(increase(fleetmq_operator_reconciles_total{{{OPERATOR}, result="error"}}[1h])) '
                "or on () vector(0)"
            ),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=6,
        h=4,
    )
    d.row("Fleets")
    d.add(
        timeseries(
            "Fleet readiness",
            "1 while a BrokerFleet's Ready condition is True (all pods ready and on the rendered config), "
            "0 while it is not; see its Progressing and Degraded conditions for why.",
            [Target(fleet_ready(OPERATOR), "{{fleet_namespace}}/{{fleet}}")],
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Fleet pods desired and ready",
            "Broker pods each BrokerFleet asks for (spec.replicas) and those ready (status.readyReplicas).",
            [
                Target(
                    f"max by (fleet_namespace, fleet, state) (fleetmq_operator_fleet_replicas{{{OPERATOR}}})",
                    "{{fleet_namespace}}/{{fleet}} {{state}}",
                )
            ],
        )
    )
    d.row("Reconciliations")
    d.add(
        timeseries(
            "Reconciliations by result",
            "BrokerFleet reconciliations per second: ok, error, paused (annotation), gone (deleted).",
            [Target(rate("fleetmq_operator_reconciles_total", OPERATOR, "result"), "{{result}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        quantiles(
            "Reconcile duration",
            "Time one BrokerFleet reconciliation takes (render, server-side apply, prune, status).",
            "fleetmq_operator_reconcile_duration_seconds_bucket",
            OPERATOR,
        )
    )
    d.add(
        timeseries(
            "Reconcile errors by step",
            "Failed steps per second: render, apply, prune, status, nodeinfo, pods.",
            [Target(rate("fleetmq_operator_reconcile_errors_total", OPERATOR, "step"), "{{step}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Child objects changed and deleted",
            "Server-side applies that changed a child (created, updated, drift corrected) and children "
            "pruned, per second by kind. Steady changes mean something fights the operator.",
            [
                Target(rate("fleetmq_operator_child_changes_total", OPERATOR, "kind"), "changed {{kind}}"),
                Target(rate("fleetmq_operator_child_deletes_total", OPERATOR, "kind"), "deleted {{kind}}"),
            ],
            "ops",
        )
    )
    return d


DASHBOARDS = (fleet_overview, message_flow, windows_and_queues, store, operator)


# ------------------------------------------------------------------------------------------ alerts
#: Each alert's runbook, docs/runbooks/<alert>.md in the repository (a test fails when one is missing). The
#: generated runbook_url is that path; the chart's prometheusRule.runbookBaseUrl replaces the base with
#: wherever a cluster's users can open them (a Git host, a wiki).
RUNBOOK_DIR = Path(__file__).resolve().parent.parent / "docs" / "runbooks"
RUNBOOK_BASE_URL = "docs/runbooks"


def runbook_url(name: str, base: str = RUNBOOK_BASE_URL) -> str:
    return f"{base.rstrip('/')}/{name}.md"


def alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description, "runbook_url": runbook_url(name)},
    }


ZONE_KEYS = "namespace, job, zone"
POD_KEYS = "namespace, job, pod"
BRIDGE_KEYS = "namespace, job, bridge"


def alert_groups() -> dict[str, Any]:
    """The PrometheusRule `spec` (a Prometheus rule file): alerts on what breaks MQTT delivery."""
    where = "zone {{ $labels.zone }} of {{ $labels.namespace }}/{{ $labels.job }}"
    broker = [
        alert(
            "FleetmqQueueDrops",
            f'sum by ({ZONE_KEYS}) (rate(fleetmq_messages_dropped_total{{reason="{DropReason.QUEUE_FULL}"}}[5m])) > 0',
            "5m",
            "warning",
            "Message Queues are full and drop messages",
            f"{{{{ $value | humanize }}}} messages/s dropped (oldest first) in {where}: subscribers are slower "
            "than publishers or offline too long for max_mqueue_len.",
        ),
        alert(
            "FleetmqInflightWindowFull",
            f"{_window_full_share('', ZONE_KEYS, '5m')} > 0.5",
            "10m",
            "warning",
            "Most QoS 1/2 deliveries wait for a full Inflight Window",
            f"{{{{ $value | humanizePercentage }}}} of QoS 1/2 deliveries in {where} found the client's "
            "Inflight Window full: subscribers ack too slowly for max_inflight (or Receive Maximum).",
        ),
        alert(
            "FleetmqKeepaliveTimeoutsSpiking",
            f"sum by ({ZONE_KEYS}) (increase(fleetmq_keepalive_timeouts_total[5m])) > 10 "
            f"and sum by ({ZONE_KEYS}) (rate(fleetmq_keepalive_timeouts_total[5m])) "
            f"> 3 * sum by ({ZONE_KEYS}) (rate(fleetmq_keepalive_timeouts_total[1h]))",
            "2m",
            "warning",
            "Keep-alive timeouts are spiking",
            f"{{{{ $value | humanize }}}} connections closed for keep-alive timeout in 5 minutes in {where}, "
            "over 3 times the hour's rate: clients are losing their network (or a load balancer drops idle "
            "connections).",
        ),
        alert(
            "FleetmqStoreErrors",
            f"sum by ({POD_KEYS}) (increase(fleetmq_store_errors_total[5m])) > 0",
            "1m",
            "critical",
            "A broker fails to reach its Redis session store",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} had {{ $value | humanize }} failed "
            "session-store operations in 5 minutes: publishes are not acked and new persistent sessions are "
            "refused while Redis fails.",
        ),
        alert(
            "FleetmqStoreNoReplicaInSync",
            f"min by ({POD_KEYS}) (fleetmq_store_replicas_in_sync) == 0 and on ({POD_KEYS}) "
            f'group by ({POD_KEYS}) (fleetmq_store_info{{topology!="standalone"}})',
            "2m",
            "critical",
            "The session store's primary has no replica in sync",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} sees no replica of its store's "
            "primary online and in sync: a failover now loses what only the primary holds, and with "
            "wait_replicas 1 publishes are not acked. Check the Redis pods (a replica down, or lagging).",
        ),
        alert(
            "FleetmqStoreFailoverStorm",
            "max by (namespace, job) (increase(fleetmq_store_failovers_total[15m])) > 3",
            "0m",
            "warning",
            "The session store fails over again and again",
            "Pods of {{ $labels.namespace }}/{{ $labels.job }} saw the store's primary move "
            "{{ $value | humanize }} times in 15 minutes: each failover refuses writes for seconds. Check the "
            "Redis pods' restarts, their nodes, and Sentinel's down-after setting.",
        ),
        alert(
            "FleetmqStoreCommitSlow",
            f"histogram_quantile(0.99, sum by ({POD_KEYS}, le) "
            f'(rate(fleetmq_store_op_duration_seconds_bucket{{op="commit"}}[5m]))) > 0.25',
            "10m",
            "warning",
            "Session-store commits are slow",
            "The 99th percentile of session-store commits on {{ $labels.pod }} of {{ $labels.namespace }}/"
            "{{ $labels.job }} is {{ $value | humanizeDuration }}: QoS 1/2 publishes are acked only after "
            "their commit, so publishers wait as long. Check the Redis' latency and load, its fsync "
            "(appendfsync), and waitReplicas.",
        ),
        alert(
            "FleetmqEventLogDropping",
            f'sum by ({POD_KEYS}) (increase(fleetmq_event_log_records_total{{outcome="dropped"}}[10m])) > 0',
            "15m",
            "warning",
            "The event log keeps dropping records",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} dropped {{ $value | humanize }} "
            "event-log records in 10 minutes, again and again for 15: the pipeline's reports undercount. "
            "Its buffer overflows or Redis refuses the writes (fleetmq_event_log_errors_total).",
        ),
        alert(
            "FleetmqTakeoverStorm",
            f'sum by ({ZONE_KEYS}) (increase(fleetmq_session_events_total{{event="takenover"}}[5m])) > 50 '
            f'and sum by ({ZONE_KEYS}) (rate(fleetmq_session_events_total{{event="takenover"}}[5m])) '
            f'> 0.5 * sum by ({ZONE_KEYS}) (rate(fleetmq_session_events_total{{event=~"created|resumed"}}[5m]))',
            "5m",
            "warning",
            "Sessions are taken over again and again",
            f"{{{{ $value | humanize }}}} takeovers in 5 minutes in {where}, over half of all connects: clients "
            "share a client id or reconnect in a loop.",
        ),
        alert(
            "FleetmqZoneConfigDiverged",
            f"count by ({ZONE_KEYS}) (group by ({ZONE_KEYS}, config_hash) (fleetmq_zone_config_info)) > 1",
            "15m",
            "warning",
            "Pods of a fleet run different configs of a zone",
            f"{{{{ $value }}}} different configs of {where} are applied across its pods: a pod refused or "
            "missed a config change (see fleetmq_config_reload_errors_total and the MqttZone status).",
        ),
        alert(
            "FleetmqConfigReloadFailed",
            f"sum by ({POD_KEYS}) (increase(fleetmq_config_reload_errors_total[10m])) > 0",
            "0m",
            "warning",
            "A broker refused a config reload",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} refused its changed config file "
            "and keeps running the previous one: see its log for the field path.",
        ),
    ]
    lost = "|".join(sorted(BRIDGE_LOST))
    bridge_where = "bridge {{ $labels.bridge }} of {{ $labels.namespace }}/{{ $labels.job }}"
    bridges = [
        alert(
            "FleetmqBridgeDown",
            f"max by ({BRIDGE_KEYS}) (fleetmq_bridge_connected) == 0",
            "5m",
            "critical",
            "A bridge is not connected to its remote broker",
            f"No pod of the fleet has {bridge_where} connected for 5 minutes: what it forwards queues in "
            "Redis (up to queue.maxLength). Its MqttBridge status says why (Connected condition, the "
            "leader's last error).",
        ),
        alert(
            "FleetmqBridgeQueueFilling",
            f"max by ({BRIDGE_KEYS}) (fleetmq_bridge_queue_messages) "
            f"> 0.8 * max by ({BRIDGE_KEYS}) (fleetmq_bridge_queue_limit_messages)",
            "5m",
            "warning",
            "A bridge's queue is over 80% full",
            f"{{{{ $value | humanize }}}} messages wait for the remote of {bridge_where}: when its queue "
            "is full, its overflow policy drops messages (counted as queue_full).",
        ),
        alert(
            "FleetmqBridgeDrops",
            f'sum by ({BRIDGE_KEYS}, reason) (increase(fleetmq_bridge_messages_dropped_total{{reason=~"{lost}"}}[5m])) > 0',
            "0m",
            "warning",
            "A bridge drops messages",
            f"{{{{ $value | humanize }}}} messages of {bridge_where} were not passed on in 5 minutes "
            "({{ $labels.reason }}); loop and excluded drops are by design and not counted here.",
        ),
    ]
    fleet = [
        alert(
            "FleetmqBrokerDown",
            "up == 0 and on (namespace, job) group by (namespace, job) (last_over_time(fleetmq_zone_config_info[1h]))",
            "5m",
            "critical",
            "A broker pod of a fleet is down",
            "{{ $labels.pod }} ({{ $labels.instance }}) of {{ $labels.namespace }}/{{ $labels.job }} does not "
            "answer /metrics: the fleet is not Ready; its clients reconnect to the other pods and resume their "
            "sessions from Redis.",
        ),
        alert(
            "FleetmqFleetNotReady",
            # the fleet's namespace as `namespace`, as on the broker alerts (the operator's own is dropped)
            f'label_replace({fleet_ready()}, "namespace", "$1", "fleet_namespace", "(.*)") == 0',
            "10m",
            "warning",
            "A BrokerFleet is not Ready",
            "BrokerFleet {{ $labels.fleet }} in {{ $labels.fleet_namespace }} has not been Ready for 10 "
            "minutes: not all of its pods are ready, or not all run the rendered config. Its Progressing and "
            "Degraded conditions (kubectl describe brokerfleet) say why.",
        ),
        alert(
            "FleetmqStoreNotReady",
            f"{fleet_store('ready')} == 0 unless on (fleet_namespace, fleet) "
            f"({fleet_store('pods', 'ready')} < {fleet_store('pods', 'wanted')})",
            "5m",
            "critical",
            "A BrokerFleet's session store is not ready",
            "The StoreReady condition of BrokerFleet {{ $labels.fleet }} in {{ $labels.fleet_namespace }} has "
            "been False for 5 minutes: its Redis does not answer, a Redis Cluster is not formed, or acks wait "
            "for replicas not in sync. Brokers withhold acks and refuse persistent sessions while they cannot "
            "write; the condition's reason and message say which.",
        ),
        alert(
            "FleetmqStoreRedisPodsMissing",
            f"{fleet_store('pods', 'ready')} < {fleet_store('pods', 'wanted')}",
            "10m",
            "warning",
            "The managed Redis of a BrokerFleet misses pods",
            "{{ $value }} of the managed Redis' pods (servers and sentinels) of BrokerFleet {{ $labels.fleet }} "
            "in {{ $labels.fleet_namespace }} are ready, fewer than it wants, for 10 minutes: the store has "
            "less redundancy (a replica or sentinel down), or none (a shard's primary down).",
        ),
        alert(
            "FleetmqOperatorReconcileErrors",
            'sum by (namespace, pod) (increase(fleetmq_operator_reconciles_total{result="error"}[10m])) > 0',
            "15m",
            "warning",
            "The fleetmq operator fails to reconcile fleets",
            "{{ $labels.namespace }}/{{ $labels.pod }} failed {{ $value | humanize }} BrokerFleet "
            "reconciliations in 10 minutes: fleets do not get their changes (see the operator log and the "
            "BrokerFleet Degraded condition).",
        ),
    ]
    return {
        "groups": [
            {"name": "fleetmq.broker", "rules": broker},
            {"name": "fleetmq.bridges", "rules": bridges},
            {"name": "fleetmq.fleet", "rules": fleet},
        ]
    }


# ------------------------------------------------------------------------------------------ files
def render() -> dict[str, str]:
    """Every generated file, path relative to the chart -> content."""
    out = {
        f"{DASHBOARD_DIR}/{d.uid}.json": json.dumps(d.json(), indent=2) + "\n"
        for d in (make() for make in DASHBOARDS)
    }
    out[ALERTS_FILE] = (
        "# Generated by `python -m fleetmq.operator.grafana` (operator/grafana.py); do not edit.\n"
        + yaml.safe_dump(alert_groups(), sort_keys=False, width=1000)
    )
    return out


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every panel target and every template variable query."""
    out = []
    for make in DASHBOARDS:
        d = make().json()
        for var in d["templating"]["list"]:
            if var["type"] == "query":
                out.append((d["uid"], f"variable {var['name']}", var["definition"]))
        for panel in d["panels"]:
            for t in panel.get("targets", []):
                out.append((d["uid"], panel["title"], t["expr"]))
    return out


def stale(chart: Path = CHART_DIR) -> list[str]:
    """Generated files missing from `chart` or different there, and dashboards there that are not generated."""
    files = render()
    out = [p for p, text in files.items() if not (chart / p).is_file() or (chart / p).read_text() != text]
    extra = sorted(
        f"{DASHBOARD_DIR}/{p.name}"
        for p in (chart / DASHBOARD_DIR).glob("*.json")
        if f"{DASHBOARD_DIR}/{p.name}" not in files
    )
    return out + extra


def write(chart: Path = CHART_DIR) -> list[str]:
    files = render()
    for rel, text in files.items():
        path = chart / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for p in (chart / DASHBOARD_DIR).glob("*.json"):
        if f"{DASHBOARD_DIR}/{p.name}" not in files:
            p.unlink()
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fleetmq.operator.grafana", description=__doc__.splitlines()[0]
    )
    p.add_argument("chart", nargs="?", type=Path, default=CHART_DIR, help="the chart directory")
    p.add_argument("--check", action="store_true", help="exit 1 if the chart's generated files are stale")
    args = p.parse_args(argv)
    if args.check:
        bad = stale(args.chart)
        for rel in bad:
            print(f"stale: {args.chart / rel}", file=sys.stderr)
        return 1 if bad else 0
    for rel in write(args.chart):
        print(args.chart / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
