"""The metric names fleetmq exports, for the tests that check what the chart's dashboards, alerts and
runbooks query against them."""

from __future__ import annotations

from fleetmq.broker.metrics import Metrics
from prometheus_client.registry import Collector


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


def busy_broker_metrics() -> Metrics:
    """A node's metrics with one zone and a sample in every family, as a busy broker exports them."""
    m = Metrics()
    m.zone("default")
    m.store_ops["commit"].observe(0.001)
    m.event_log = lambda: (0, 0, 0)  # its counters exist while the event log is on
    m.store_topology = lambda: ("sentinel", ["10.0.0.1:6379"], 0, 0)  # those of a Redis store
    m.store_replicas_in_sync = lambda: 2
    m.store_round_trips = lambda: {"10.0.0.1:6379": 1}
    m.config_info = {"default": "abc"}
    m.bridges = lambda: {  # a node with a bridge (bridge.Bridge.report)
        "cloud": {"connected": True, "leader": True, "queue": 0, "queue_limit": 1000, "inflight": 0,
                  "forwarded": 0, "received": 0, "dropped": {}, "reconnects": {}, "leader_changes": 1,
                  "sessions_lost": 0}
    }  # fmt: skip
    m.gauges = lambda: {
        "connections": {"default": 1},
        "sessions": {("default", "online"): 1, ("default", "offline"): 0},
        "inflight": {"default": 0},
        "mqueue": {"default": 0},
        "awaiting_rel": {"default": 0},
        "max_inflight": {"default": 32},
        "max_mqueue_len": {"default": 1000},
    }
    return m


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
