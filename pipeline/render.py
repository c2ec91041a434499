"""What a person reads: the Markdown report with its PNG plots, and the MqttZone patch to review and apply.

Plain Python over collected rows (one per zone and window), so it needs neither Spark nor a cluster.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fleetmq.broker.eventschema import BRIDGE_ZONE_PREFIX

from .tuning import INFLIGHT_HEADROOM, MQUEUE_HEADROOM, Recommendation

API_VERSION = "fleetmq.io/v1alpha1"
#: broker setting -> its name under an MqttZone's spec.session
CRD_NAMES = {"max_inflight": "maxInflight", "max_mqueue_len": "maxMqueueLen"}
WINDOWS_SHOWN = 24  # per zone, the most recent


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    return str(v)


def _by_zone(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    zones: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        zones[r["zone"]].append(r)
    for rs in zones.values():
        rs.sort(key=lambda r: r["window_start"])
    return dict(sorted(zones.items(), key=lambda kv: str(kv[0])))


def _max(rows: Sequence[dict[str, Any]], col: str) -> Any:
    vals = [r[col] for r in rows if r[col] is not None]
    return max(vals) if vals else None


def zone_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over a zone's windows and, for percentiles, the worst window (percentiles do not add up)."""
    deliveries = sum(r["deliveries"] for r in rows)
    retransmits = sum(r["retransmits"] for r in rows)
    drops: dict[str, int] = defaultdict(int)
    reconnects: dict[str, int] = defaultdict(int)
    for r in rows:
        for reason, n in (r["drops"] or {}).items():
            drops[reason] += n
        for reason, n in (r.get("bridge_reconnects") or {}).items():
            reconnects[reason] += n
    return {
        "windows": len(rows),
        "publishes": sum(r["publishes"] for r in rows),
        "deliveries": deliveries,
        "duplicate_ratio": retransmits / deliveries if deliveries else None,
        "latency_p99_ms": _max(rows, "latency_p99_ms"),
        "ack_rtt_p95_ms": _max(rows, "ack_rtt_p95_ms"),
        "inflight_utilisation_p95": _max(rows, "inflight_utilisation_p95"),
        "inflight_full": sum(r["inflight_full"] for r in rows),
        "queue_depth_p99": _max(rows, "queue_depth_p99"),
        "offline_backlog_p99": _max(rows, "offline_backlog_p99"),
        "drops": dict(sorted(drops.items())),
        "takeovers": sum(r["takeovers"] for r in rows),
        "keepalive_timeouts": sum(r["keepalive_timeouts"] for r in rows),
        "acks": sum(r.get("acks") or 0 for r in rows),
        "bridge_reconnects": dict(sorted(reconnects.items())),
    }


def markdown(
    rows: Sequence[dict[str, Any]],
    recommendations: Sequence[Recommendation],
    *,
    window: str,
    plots: dict[str, str] | None = None,
    generated: dt.datetime | None = None,
) -> str:
    zones = _by_zone(rows)
    generated = generated or dt.datetime.now(dt.UTC)
    out = [
        "# fleetmq delivery report",
        "",
        f"Generated {generated.strftime('%Y-%m-%d %H:%M UTC')} from the brokers' event log; windows of {window}.",
        "Percentiles in the summary are those of the worst window; per-window values follow.",
        "",
    ]
    if not zones:
        out += ["No events: nothing to report.", ""]
    out += [
        "## Summary per zone",
        "",
        "| zone | windows | publishes | deliveries | dup ratio | latency p99 ms | ack rtt p95 ms | inflight util p95 "
        "| inflight full | queue p99 | offline backlog p99 | drops | takeovers | keepalive timeouts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for zone, zrows in zones.items():
        s = zone_summary(zrows)
        drops = ", ".join(f"{k} {v}" for k, v in s["drops"].items()) or "0"
        out.append(
            f"| {zone} | {s['windows']} | {s['publishes']} | {s['deliveries']} | {_fmt(s['duplicate_ratio'])} "
            f"| {_fmt(s['latency_p99_ms'])} | {_fmt(s['ack_rtt_p95_ms'])} | {_fmt(s['inflight_utilisation_p95'])} "
            f"| {s['inflight_full']} | {_fmt(s['queue_depth_p99'])} | {_fmt(s['offline_backlog_p99'])} | {drops} "
            f"| {s['takeovers']} | {s['keepalive_timeouts']} |"
        )
    bridges = {z: zone_summary(zr) for z, zr in zones.items() if z.startswith(BRIDGE_ZONE_PREFIX)}
    if bridges:
        out += [
            "",
            "## Bridges",
            "",
            "A bridge's queue is its session in the fleet (zone `$bridge:<name>`): what the remote acknowledged is"
            " that session's acks; drops are its queue's and the bridge's own (loop and excluded by design).",
            "",
            "| bridge | forwarded | drops | reconnects |",
            "|---|---:|---|---|",
        ]
        for zone, s in bridges.items():
            drops = ", ".join(f"{k} {v}" for k, v in s["drops"].items()) or "0"
            again = ", ".join(f"{k} {v}" for k, v in s["bridge_reconnects"].items()) or "0"
            out.append(f"| {zone.removeprefix(BRIDGE_ZONE_PREFIX)} | {s['acks']} | {drops} | {again} |")
    out += [
        "",
        "## Recommended zone settings",
        "",
        f"max_inflight = bandwidth-delay product (p95 session rate x p95 ack round trip) x {INFLIGHT_HEADROOM:g}, "
        f"clamped to 1..65535; max_mqueue_len = p99 offline backlog x {MQUEUE_HEADROOM:g}. "
        "Both from the zone's worst window. `mqttzone-patch.yaml` holds the changes.",
        "",
        "| zone | setting | current | recommended | why |",
        "|---|---|---:|---:|---|",
    ]
    for rec in recommendations:
        mark = " **(change)**" if rec.changes else ""
        out.append(
            f"| {rec.zone} | {rec.setting} | {_fmt(rec.current)} | {_fmt(rec.recommended)}{mark} | {rec.reason} |"
        )
    for zone, zrows in zones.items():
        out += ["", f"## Zone {zone}", ""]
        if plots and zone in plots:
            out += [f"![zone {zone}]({plots[zone]})", ""]
        shown = zrows[-WINDOWS_SHOWN:]
        if len(shown) < len(zrows):
            out += [f"The last {len(shown)} of {len(zrows)} windows (all of them are in `zone_kpis`).", ""]
        out += [
            "| window (UTC) | deliveries | latency p50/p95/p99 ms | ack rtt p95 ms | dup ratio | session rate p95 "
            "| inflight util p95 | queue p50/p95/p99 | offline backlog p99 | drops | takeovers | ka timeouts |",
            "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        for r in shown:
            lat = "/".join(_fmt(r[f"latency_{p}_ms"]) for p in ("p50", "p95", "p99"))
            q = "/".join(_fmt(r[f"queue_depth_{p}"]) for p in ("p50", "p95", "p99"))
            out.append(
                f"| {_fmt(r['window_start'])} | {r['deliveries']} | {lat} | {_fmt(r['ack_rtt_p95_ms'])} "
                f"| {_fmt(r['duplicate_ratio'])} | {_fmt(r['session_rate_p95'])} "
                f"| {_fmt(r['inflight_utilisation_p95'])} | {q} | {_fmt(r['offline_backlog_p99'])} "
                f"| {r['drops_total']} | {r['takeovers']} | {r['keepalive_timeouts']} |"
            )
    return "\n".join(out) + "\n"


def plot_zones(rows: Sequence[dict[str, Any]], folder: Path) -> dict[str, str]:
    """One PNG per zone (latency, traffic, queue and window use over time); returns zone -> file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    for i, (zone, zrows) in enumerate(_by_zone(rows).items()):
        t = [r["window_start"] for r in zrows]
        fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
        for p in ("p50", "p95", "p99"):
            ax1.plot(t, [r[f"latency_{p}_ms"] for r in zrows], marker=".", label=f"latency {p}")
        ax1.set_ylabel("ms")
        ax1.legend(loc="upper left", fontsize="small")
        ax2.plot(t, [r["deliveries"] for r in zrows], marker=".", label="deliveries")
        ax2.plot(t, [r["retransmits"] for r in zrows], marker=".", label="retransmits")
        ax2.plot(t, [r["drops_total"] for r in zrows], marker=".", label="drops")
        ax2.set_ylabel("per window")
        ax2.legend(loc="upper left", fontsize="small")
        ax3.plot(t, [r["queue_depth_p99"] for r in zrows], marker=".", label="queue depth p99")
        ax3.plot(t, [r["offline_backlog_p99"] for r in zrows], marker=".", label="offline backlog p99")
        ax3.set_ylabel("messages")
        ax3.legend(loc="upper left", fontsize="small")
        util = ax3.twinx()
        util.plot(
            t,
            [r["inflight_utilisation_p95"] for r in zrows],
            color="grey",
            ls="--",
            label="inflight util p95",
        )
        util.set_ylabel("inflight utilisation")
        if len(t) == 1:  # one window: keep the axis a few windows wide, not years
            pad = (zrows[0]["window_end"] - zrows[0]["window_start"]) * 2
            ax1.set_xlim(t[0] - pad, t[0] + pad)
        fig.suptitle(f"zone {zone}")
        fig.autofmt_xdate()
        name = f"zone-{i}.png"
        fig.savefig(folder / name, dpi=80)
        plt.close(fig)
        made[zone] = f"{folder.name}/{name}"
    return made


def mqttzone_patch(recommendations: Sequence[Recommendation]) -> str:
    """A multi-document YAML of MqttZone patches, one per zone with a change, each value with its reason."""
    changes: dict[str, list[Recommendation]] = defaultdict(list)
    for rec in recommendations:
        if rec.changes:
            changes[rec.zone].append(rec)
    head = [
        "# MqttZone settings recommended by `fleetmq-pipeline report`. Review, then apply only these fields:",
        "#   kubectl apply --server-side --field-manager=fleetmq-pipeline --force-conflicts -f mqttzone-patch.yaml",
        "# (a client-side `kubectl apply` of this partial object would remove the fields it leaves out).",
    ]
    if not changes:
        return "\n".join([*head, "# No zone needs a change.", ""])
    docs = []
    for zone in sorted(changes):
        doc = [
            "---",
            f"apiVersion: {API_VERSION}",
            "kind: MqttZone",
            "metadata:",
            f"  name: {_yaml_str(zone)}",
            "spec:",
            "  session:",
        ]
        for rec in sorted(changes[zone], key=lambda r: r.setting):
            doc.append(f"    # {rec.reason}")
            doc.append(f"    {CRD_NAMES[rec.setting]}: {rec.recommended}  # was {_fmt(rec.current)}")
        docs.append("\n".join(doc))
    return "\n".join([*head, *docs, ""])


def _yaml_str(value: str) -> str:
    import json

    return value if value.replace("-", "").replace(".", "").isalnum() else json.dumps(value)
