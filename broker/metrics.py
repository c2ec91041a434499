"""Prometheus metrics (prefix fleetmq_), cheap on the hot path.

The data path bumps plain integers on a per-zone object (no locks, no label lookups); a custom collector
turns them into metric families only when Prometheus scrapes. Labels: zone, qos, reason, never a client id.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import __version__
from .eventschema import BridgeCloseReason, BridgeDropReason, DropReason

#: every drop reason starts at 0, so a rate over it exists before the first drop
DROP_REASONS = tuple(DropReason)
BRIDGE_DROP_REASONS = tuple(BridgeDropReason)
BRIDGE_CLOSE_REASONS = tuple(BridgeCloseReason)
SESSION_EVENTS: tuple[str, ...] = ("created", "resumed", "takenover", "discarded", "expired")


def per_message_path() -> str:
    """ "compiled" when the per-message path runs as mypyc's extension modules (the image, `make run`:
    scripts/compiled.py), "interpreted" where they could not be built (the same code, more CPU per message)."""
    spec = importlib.util.find_spec(f"{__package__}.channel")
    origin = spec.origin if spec is not None else None
    return "interpreted" if origin is None or origin.endswith(".py") else "compiled"


LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
STORE_BUCKETS: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    """A lock-free histogram of plain ints; observe() is a scan of a dozen bounds and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = 0
        for bound in self.bounds:  # (bisect_left, as a loop: compiled, cheaper than the call)
            if value <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(bound), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


class ZoneMetrics:
    """Every counter of one zone. Attributes are bumped directly by the channel."""

    __slots__ = (
        "acked",
        "authentications",
        "authorizations",
        "delivered",
        "disconnects",
        "dropped",
        "inflight_full",
        "keepalive_timeouts",
        "latency",
        "quota_refusals",
        "received",
        "retransmitted",
        "session_events",
    )

    def __init__(self) -> None:
        self.received = [0, 0, 0]  # by QoS
        self.delivered = [0, 0, 0]
        self.acked = [0, 0, 0]
        self.retransmitted = 0
        self.inflight_full = 0
        self.keepalive_timeouts = 0
        self.dropped: dict[str, int] = defaultdict(int)
        self.disconnects: dict[str, int] = defaultdict(int)
        self.session_events: dict[str, int] = defaultdict(int)
        self.latency = Histogram(LATENCY_BUCKETS)
        #: what a quota refused that no other counter counts, by quota (subscriptions, connections)
        self.quota_refusals: dict[str, int] = defaultdict(int)
        #: decisions of the zone's authentication chain by (mechanism, result: allow, deny, unavailable)
        self.authentications: dict[tuple[str, str], int] = defaultdict(int)
        #: answers of clients' authorization services (acl_url) by (action, result: allow, deny, ignore,
        #: unavailable)
        self.authorizations: dict[tuple[str, str], int] = defaultdict(int)


class Metrics:
    """The node's metrics; gauges are read from the live broker state at scrape time."""

    def __init__(self) -> None:
        self.zones: dict[str, ZoneMetrics] = defaultdict(ZoneMetrics)
        self.store_errors = 0
        self.store_reconnects = 0
        self.config_reload_errors = 0
        self.store_round_trips: Callable[[], dict[str, int]] = dict  # per shard (its primary's address)
        # the store's topology, its primary as this node knows it, failovers seen, operations retried
        self.store_topology: Callable[[], tuple[str, list[str], int, int]] | None = None
        self.store_replicas_in_sync: Callable[[], int] | None = None  # -1: not known yet
        # the event log's records by outcome (written, dropped) and failed sends; None while it is off
        self.event_log: Callable[[], tuple[int, int, int]] | None = None
        self.store_ops: dict[str, Histogram] = defaultdict(lambda: Histogram(STORE_BUCKETS))
        self.takeover = Histogram(LATENCY_BUCKETS)
        self.gauges: Callable[[], dict[str, Any]] | None = None
        # each bridge's report (bridge.Bridge.report) by name
        self.bridges: Callable[[], dict[str, dict[str, Any]]] | None = None
        self.config_info: dict[str, str] = {}
        #: connections closed for a missing or invalid PROXY protocol header, by listener
        self.proxy_refused: dict[str, int] = defaultdict(int)
        self.path = per_message_path()
        self.banned_refusals = 0  # CONNECTs refused by a ban (flapping's included)
        self.flapping_bans = 0  # bans this node made for flapping client ids

    def zone(self, name: str) -> ZoneMetrics:
        return self.zones[name]

    def drop(self, zone: str, reason: str, n: int = 1) -> None:
        self.zones[zone].dropped[reason] += n

    def collector(self) -> Collector:
        return _Collector(self)


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        zones = sorted(m.zones.items())
        g = m.gauges() if m.gauges else {}

        def gauge(name: str, doc: str, key: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(f"fleetmq_{name}", doc, labels=["zone", *extra])
            for labels, value in sorted(g.get(key, {}).items()):
                fam.add_metric(list(labels) if isinstance(labels, tuple) else [labels], value)
            return fam

        yield gauge("connections", "Open client connections.", "connections")
        yield gauge("sessions", "Sessions by state.", "sessions", ("state",))
        yield gauge("inflight_messages", "Deliveries in Inflight Windows.", "inflight")
        yield gauge("mqueue_messages", "Deliveries in Message Queues.", "mqueue")
        yield gauge("awaiting_rel_messages", "Incoming QoS2 messages awaiting PUBREL.", "awaiting_rel")
        yield gauge(
            "zone_max_inflight",
            "The zone's Inflight Window length per session (0 = no limit).",
            "max_inflight",
        )
        yield gauge(
            "zone_max_mqueue_len",
            "The zone's Message Queue length per session (0 = no limit).",
            "max_mqueue_len",
        )

        build = GaugeMetricFamily(
            "fleetmq_build_info",
            "This node's version and how its per-message path runs: compiled or interpreted (value 1).",
            labels=["version", "path"],
        )
        build.add_metric([__version__, m.path], 1)
        yield build
        info = GaugeMetricFamily(
            "fleetmq_zone_config_info",
            "Applied config of each zone (value 1).",
            labels=["zone", "config_hash"],
        )
        for zone, digest in sorted(m.config_info.items()):
            info.add_metric([zone, digest], 1)
        yield info

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(f"fleetmq_{name}", doc, labels=labels)

        ev = counter("session_events", "Session lifecycle events.", ["zone", "event"])
        disc = counter("disconnects", "Closed connections by reason.", ["zone", "reason"])
        recv = counter("messages_received", "PUBLISH packets received from clients.", ["zone", "qos"])
        dlv = counter("messages_delivered", "PUBLISH packets delivered to clients.", ["zone", "qos"])
        ack = counter("messages_acked", "Deliveries acknowledged by clients.", ["zone", "qos"])
        rtx = counter("messages_retransmitted", "PUBLISH/PUBREL resent.", ["zone"])
        drop = counter("messages_dropped", "Messages dropped by reason.", ["zone", "reason"])
        full = counter("inflight_full", "Deliveries queued because the Inflight Window was full.", ["zone"])
        ka = counter("keepalive_timeouts", "Connections closed for keep-alive timeout.", ["zone"])
        quota = counter(
            "quota_refusals",
            "Requests refused by a quota of the zone that no other counter counts (subscriptions: "
            "SUBSCRIBE filters beyond max_subscriptions; connections: CONNECTs beyond "
            "max_connections_per_user; refused publishes are messages_dropped).",
            ["zone", "quota"],
        )
        authn = counter(
            "authentications",
            "Decisions of the zone's authentication chain (unavailable: its source could not answer; denied).",
            ["zone", "mechanism", "result"],
        )
        authz = counter(
            "authorizations",
            "Answers of clients' authorization services (an http authenticator's acl_url) by action and "
            "result (ignore: the ACL rules decided; unavailable: it could not answer, denied).",
            ["zone", "action", "result"],
        )
        lat = HistogramMetricFamily(
            "fleetmq_delivery_latency_seconds",
            "Publish to the subscriber's acknowledgement (PUBACK or PUBCOMP) of QoS 1/2 deliveries.",
            labels=["zone"],
        )
        for zone, z in zones:
            for event in SESSION_EVENTS:
                ev.add_metric([zone, event], z.session_events.get(event, 0))
            for reason, n in sorted(z.disconnects.items()):
                disc.add_metric([zone, reason], n)
            for (mechanism, result), n in sorted(z.authentications.items()):
                authn.add_metric([zone, mechanism, result], n)
            for (action, result), n in sorted(z.authorizations.items()):
                authz.add_metric([zone, action, result], n)
            for kind, n in sorted(z.quota_refusals.items()):
                quota.add_metric([zone, kind], n)
            for qos in range(3):
                recv.add_metric([zone, str(qos)], z.received[qos])
                dlv.add_metric([zone, str(qos)], z.delivered[qos])
                ack.add_metric([zone, str(qos)], z.acked[qos])
            rtx.add_metric([zone], z.retransmitted)
            for reason in sorted(set(DROP_REASONS) | set(z.dropped)):
                drop.add_metric([zone, reason], z.dropped.get(reason, 0))
            full.add_metric([zone], z.inflight_full)
            ka.add_metric([zone], z.keepalive_timeouts)
            lat.add_metric([zone], z.latency.buckets(), z.latency.sum)
        yield from (ev, disc, recv, dlv, ack, rtx, drop, full, ka, authn, authz, quota, lat)

        err = counter("store_errors", "Failed session-store operations.", [])
        err.add_metric([], m.store_errors)
        yield err
        cre = counter("config_reload_errors", "Config files (or listeners) refused at a live reload.", [])
        cre.add_metric([], m.config_reload_errors)
        yield cre
        rt = counter(
            "store_round_trips",
            "Round trips to the session store, by shard (a group commit is one per shard it touches).",
            ["shard"],
        )
        for shard, n in sorted(m.store_round_trips().items()):
            rt.add_metric([shard], n)
        yield rt
        if m.event_log is not None:
            written, dropped, errors = m.event_log()
            evl = counter("event_log_records", "Event log records by outcome.", ["outcome"])
            evl.add_metric(["written"], written)
            evl.add_metric(["dropped"], dropped)
            yield evl
            eve = counter(
                "event_log_errors", "Failed event log sends (their records retried or dropped).", []
            )
            eve.add_metric([], errors)
            yield eve
        rec = counter("store_reconnects", "Times the node resynchronised with the store after an outage.", [])
        rec.add_metric([], m.store_reconnects)
        yield rec
        proxy = counter(
            "proxy_protocol_refused",
            "Connections closed for a missing or invalid PROXY protocol header, by listener.",
            ["listener"],
        )
        for listener, n in sorted(m.proxy_refused.items()):
            proxy.add_metric([listener], n)
        yield proxy
        banned = counter(
            "banned_refusals", "CONNECTs refused with 0x8A: a ban matched (flapping included).", []
        )
        banned.add_metric([], m.banned_refusals)
        yield banned
        flapping = counter(
            "flapping_bans", "Client ids this node banned for connecting too often (flapping).", []
        )
        flapping.add_metric([], m.flapping_bans)
        yield flapping
        if m.store_topology is not None:
            topology, primaries, failovers, retries = m.store_topology()
            info = GaugeMetricFamily(
                "fleetmq_store_info",
                "The session store's topology and each primary this node writes to (1).",
                labels=["topology", "primary"],
            )
            for primary in primaries:
                info.add_metric([topology, primary], 1)
            yield info
            fo = counter("store_failovers", "Times this node saw the store's primary move elsewhere.", [])
            fo.add_metric([], failovers)
            yield fo
            rty = counter(
                "store_retries", "Store operations run again (a fresh connection, scripts reloaded).", []
            )
            rty.add_metric([], retries)
            yield rty
        if m.store_replicas_in_sync is not None and (n := m.store_replicas_in_sync()) >= 0:
            rs = GaugeMetricFamily(
                "fleetmq_store_replicas_in_sync",
                "Replicas of the store's primary online and at most 1 s behind (as of the last heartbeat).",
            )
            rs.add_metric([], n)
            yield rs
        st = HistogramMetricFamily(
            "fleetmq_store_op_duration_seconds", "Session-store operation time.", labels=["op"]
        )
        for op, h in sorted(m.store_ops.items()):
            st.add_metric([op], h.buckets(), h.sum)
        yield st
        if m.bridges is not None:
            yield from _bridge_families(m.bridges())
        tk = HistogramMetricFamily(
            "fleetmq_takeover_duration_seconds", "CONNECT to session resumed.", labels=[]
        )
        tk.add_metric([], m.takeover.buckets(), m.takeover.sum)
        yield tk


def _bridge_families(reports: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """fleetmq_bridge_* from this node's view of each bridge (docs/design.md "Bridges")."""

    def family(kind: type, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return kind(f"fleetmq_bridge_{name}", doc, labels=["bridge", *extra])

    connected = family(GaugeMetricFamily, "connected", "1 while this node's link to the remote is up.")
    leader = family(GaugeMetricFamily, "leader", "1 while this node forwards the bridge (holds its lease).")
    queue = family(
        GaugeMetricFamily, "queue_messages", "Messages queued for the remote (in this node's copy)."
    )
    limit = family(GaugeMetricFamily, "queue_limit_messages", "The bridge's queue.maxLength.")
    inflight = family(
        GaugeMetricFamily, "inflight_messages", "Messages sent to the remote, not yet acknowledged."
    )
    fwd = family(CounterMetricFamily, "messages_forwarded", "Messages the remote acknowledged (QoS 0: sent).")
    rcv = family(CounterMetricFamily, "messages_received", "Messages from the remote published here.")
    drop = family(CounterMetricFamily, "messages_dropped", "Messages not passed on, by reason.", ("reason",))
    rec = family(CounterMetricFamily, "reconnects", "Ended or failed connections to the remote.", ("reason",))
    lead = family(CounterMetricFamily, "leader_changes", "Times this node became the bridge's leader.")
    lost = family(CounterMetricFamily, "session_lost", "Connections finding the remote had lost the session.")
    latency = family(
        HistogramMetricFamily,
        "forward_latency_seconds",
        "Local publish to the remote's acknowledgement (PUBACK or PUBCOMP) of QoS 1/2 messages forwarded.",
    )
    for name, r in sorted(reports.items()):
        connected.add_metric([name], int(r["connected"]))
        leader.add_metric([name], int(r["leader"]))
        queue.add_metric([name], r["queue"])
        limit.add_metric([name], r["queue_limit"])
        inflight.add_metric([name], r["inflight"])
        fwd.add_metric([name], r["forwarded"])
        rcv.add_metric([name], r["received"])
        for reason in sorted(set(BRIDGE_DROP_REASONS) | set(r["dropped"])):
            drop.add_metric([name, reason], r["dropped"].get(reason, 0))
        for reason in sorted(set(BRIDGE_CLOSE_REASONS) | set(r["reconnects"])):
            rec.add_metric([name, reason], r["reconnects"].get(reason, 0))
        lead.add_metric([name], r["leader_changes"])
        lost.add_metric([name], r["sessions_lost"])
        if (hist := r.get("latency")) is not None:
            latency.add_metric([name], hist.buckets(), hist.sum)
    yield from (connected, leader, queue, limit, inflight, fwd, rcv, drop, rec, lead, lost, latency)
