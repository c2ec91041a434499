"""The chart's dashboards and alert rules: generated, in step with the chart, and built on real metric names.

Whether each expression returns data is proven against a real Prometheus in tests/monitoring; these checks
are the cheap ones: staleness, layout, variables, and names that the exporters really have.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fleetmq.operator import metrics as operator_metrics
from fleetmq.operator import monitoring

from .metrics_support import broker_names, exported, zoned_names

DASHBOARDS = {make().uid: make().json() for make in monitoring.DASHBOARDS}
BROKER = [uid for uid in DASHBOARDS if uid != "fleetmq-operator"]
SELECTOR = re.compile(r"\b((?:fleetmq_|up\b)\w*)(\{[^}]*\})?")


def _exprs(dashboard: dict) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [
        (f"variable {v['name']}", v["definition"])
        for v in dashboard["templating"]["list"]
        if "definition" in v
    ]
    return out


def test_chart_files_are_up_to_date():
    stale = monitoring.stale()
    assert not stale, f"charts/fleetmq is stale ({stale}): run `make dashboards`"


def test_committed_json_is_what_grafana_loads():
    for rel, text in monitoring.render().items():
        if rel.endswith(".json"):
            d = json.loads(text)
            assert d["uid"] == rel.rsplit("/", 1)[1].removesuffix(".json") and len(d["uid"]) <= 40
            assert d["schemaVersion"] >= 36 and "fleetmq" in d["tags"]


@pytest.mark.parametrize("uid", list(DASHBOARDS))
def test_panels_are_laid_out_described_and_bound_to_the_datasource_variable(uid: str):
    d = DASHBOARDS[uid]
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["description"] and p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        if p["type"] != "heatmap":
            assert p["fieldConfig"]["defaults"]["unit"], p["title"]
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[0] == "datasource"
    want = ["namespace", "job", "pod", "zone"] if uid in BROKER else ["namespace", "pod"]
    assert names[1:] == want
    for v in d["templating"]["list"][1:]:
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"


@pytest.mark.parametrize("uid", BROKER)
def test_every_broker_selector_follows_the_template_variables(uid: str):
    """Picking a namespace, fleet, pod or zone narrows every panel, not just some."""
    zoned = zoned_names()
    assert "fleetmq_connections" in zoned and "fleetmq_store_errors_total" not in zoned
    for title, expr in _exprs(DASHBOARDS[uid]):
        if title.startswith("variable"):
            continue
        for name, sel in SELECTOR.findall(expr):
            assert sel, f"{title}: {name} without a selector"
            for label in ("namespace", "job", "pod"):
                assert f'{label}=~"${label}"' in sel, f"{title}: {name}{sel} ignores ${label}"
            if name in zoned:
                assert 'zone=~"$zone"' in sel, f"{title}: {name}{sel} ignores $zone"


def test_every_metric_the_chart_queries_is_exported():
    """A renamed or removed metric fails here, naming the panel or alert that still reads it."""
    broker, operator = broker_names(), exported(operator_metrics.REGISTRY)
    uses = [(f"{uid}: {title}", expr) for uid, d in DASHBOARDS.items() for title, expr in _exprs(d)]
    uses += [
        (f"alert {r['alert']}", r["expr"]) for g in monitoring.alert_groups()["groups"] for r in g["rules"]
    ]
    for where, expr in uses:
        for name in re.findall(r"\bfleetmq_\w+", expr):
            known = operator if name.startswith("fleetmq_operator_") else broker
            assert name in known, f"{where}: {name} is not exported"


def test_alerts_are_labelled_and_annotated():
    rules = [r for g in monitoring.alert_groups()["groups"] for r in g["rules"]]
    assert len({r["alert"] for r in rules}) == len(rules)
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert re.fullmatch(r"\d+[smh]", r["for"])


def test_drop_reasons_are_one_list_for_metrics_events_pipeline_and_dashboards():
    """Every place that names drop reasons takes them from eventschema.DropReason: the metrics export all
    of them, the dashboards' drop panels list and query exactly them, the pipeline counts the lost ones,
    and no broker module spells one out by hand."""
    import ast

    from fleetmq.broker.eventschema import DropReason
    from fleetmq.broker.metrics import DROP_REASONS
    from fleetmq.pipeline.kpis import LOST_REASONS

    every = {r.value for r in DropReason}
    lost = {r.value for r in DropReason if r.lost}
    assert set(DROP_REASONS) == every
    assert set(LOST_REASONS) == lost
    panels = {p["title"]: p for p in DASHBOARDS["fleetmq-messages"]["panels"] if "title" in p}
    described = panels["Drops by reason"]["description"]
    assert all(f"{r} (" in described for r in every), described
    [loss] = panels["Drops by zone"]["targets"]
    queried = set(loss["expr"].split('reason=~"')[1].split('"')[0].split("|"))
    assert queried == lost
    root = Path(__file__).resolve().parents[2] / "broker"

    def by_hand(node: ast.AST) -> bool:
        """counters.dropped["..."] or telemetry.dropped*("...", ...)"""
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            return node.value.attr == "dropped" and isinstance(node.slice, ast.Constant)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            first = node.args[0]
            return node.func.attr.startswith("dropped") and isinstance(first, ast.Constant)
        return False

    spelled = [
        f"{path.name}:{node.lineno}"
        for path in sorted(root.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if by_hand(node)
    ]
    assert not spelled, f"drop reasons spelled out instead of DropReason: {spelled}"
