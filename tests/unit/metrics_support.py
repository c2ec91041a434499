"""The metric names fleetmq exports, for the tests that check what the chart's dashboards, alerts and
runbooks query against them."""

from __future__ import annotations

from prometheus_client.registry import Collector

from scripts.docsgen import busy_broker_metrics


def exported(collector: Collector) -> set[str]:
    """Sample names a collector exports, whether or not it has samples yet."""
    out: set[str] = set()
    for fam in collector.collect():
        out |= {s.name for s in fam.samples}
        if fam.type == "counter":
            out.add(f"{fam.name}_total")
        elif fam.type == "histogram":
            out |= {f"{fam.name}_bucket", f"{fam.name}_count", f"{fam.name}_sum"}
        else:
            out.add(fam.name)
    return out


def broker_names() -> set[str]:
    return exported(busy_broker_metrics().collector())


def zoned_names() -> set[str]:
    """Samples that carry a zone label (the $zone variable must narrow them)."""
    return {
        s.name
        for fam in busy_broker_metrics().collector().collect()
        for s in fam.samples
        if "zone" in s.labels
    }
