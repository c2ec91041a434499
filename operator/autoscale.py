"""The operator's own autoscaler (BrokerFleet spec.autoscaling), from what the broker pods report.

Each pod reports its connections and, as running totals, the messages it delivered and the CPU seconds
it used (fleetmq.broker.node, keys.nodeinfo); rates come from two reports some seconds apart (`Rates`).
The recommendation is Kubernetes' HorizontalPodAutoscaler's: per target, ceil(replicas x average per Ready
pod / target), ignored within 10% of the target; the largest wins, within [minReplicas, maxReplicas]. The
stabilisation windows and step limits are the HPA's behaviour: up, the lowest recommendation of the
window, at most scaleUp.maxStep pods more per scaleUp.periodSeconds; down, the highest of the window, at
most scaleDown.maxStep fewer per scaleDown.periodSeconds. Pure: the operator keeps the history and applies the decision to spec.replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .crds.fleet import AutoscalingSpec, millicores

#: a target within this share of the load recommends no change (the HPA's default tolerance)
TOLERANCE = 0.1
#: two reports closer than this give no rate (the brokers report every few seconds)
MIN_INTERVAL = 5.0


@dataclass(frozen=True)
class Load:
    """The fleet's load, averaged over its Ready pods (None: not known yet)."""

    pods: int
    connections: float
    messages_per_second: float | None = None
    cpu_millicores: float | None = None


@dataclass
class Rates:
    """Per pod, the last report's totals and when it came (monotonic): rates between two reports."""

    last: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)  # pod -> (messages/s, millicores)

    def update(self, reports: Mapping[str, Mapping[str, str]], now: float) -> None:
        for pod, info in reports.items():
            try:
                delivered, cpu = float(info["delivered"]), float(info["cpu_seconds"])
            except (KeyError, ValueError):  # (a broker from before these fields)
                continue
            prev = self.last.get(pod)
            if prev is not None and now - prev[0] < MIN_INTERVAL:
                continue
            self.last[pod] = (now, delivered, cpu)
            if prev is not None and delivered >= prev[1] and cpu >= prev[2]:  # (not a restarted pod)
                dt = now - prev[0]
                self.rates[pod] = ((delivered - prev[1]) / dt, (cpu - prev[2]) / dt * 1000)
        for pod in set(self.last) - set(reports):
            self.last.pop(pod, None)
            self.rates.pop(pod, None)

    def load(self, reports: Mapping[str, Mapping[str, str]], ready: set[str]) -> Load:
        pods = [p for p in reports if p in ready]
        n = max(len(pods), 1)
        connections = sum(float(reports[p].get("connections") or 0) for p in pods) / n
        rated = [self.rates[p] for p in pods if p in self.rates]
        if pods and len(rated) == len(pods):
            return Load(len(pods), connections, sum(r[0] for r in rated) / n, sum(r[1] for r in rated) / n)
        return Load(len(pods), connections)


def recommend(spec: AutoscalingSpec, replicas: int, load: Load) -> int | None:
    """The replicas the load asks for, within the limits; None while a target's metric is not known."""
    t = spec.targets
    wanted: list[int] = []
    for value, target in (
        (load.connections, t.connections),
        (load.messages_per_second, t.messagesPerSecond),
        (load.cpu_millicores, millicores(t.cpu) if t.cpu is not None else None),
    ):
        if target is None:
            continue
        if value is None:
            return None
        ratio = value / target
        wanted.append(replicas if abs(ratio - 1) <= TOLERANCE else math.ceil(replicas * ratio))
    return min(max(max(wanted, default=replicas), spec.minReplicas), spec.maxReplicas)


@dataclass(frozen=True)
class Decision:
    replicas: int
    desired: int  # the latest recommendation
    reason: str  # ScaledUp, ScaledDown, Stable, Stabilizing, Limited


def decide(
    spec: AutoscalingSpec,
    replicas: int,
    history: list[tuple[float, int]],
    recommendation: int,
    now: float,
    changes: list[tuple[float, int]] | None = None,
) -> Decision:
    """Add `recommendation` (made at `now`) to `history` (kept to the longer window) and decide; `changes`
    holds the changes made lately, (when, pods added or removed), for the step limits (the caller adds
    the one it makes)."""
    history.append((now, recommendation))
    changes = changes if changes is not None else []
    up_rules, down_rules = spec.scaleUp, spec.scaleDown
    keep = max(up_rules.stabilizationWindowSeconds, down_rules.stabilizationWindowSeconds)
    history[:] = [(t, r) for t, r in history if now - t <= keep]
    changes[:] = [
        (t, d) for t, d in changes if now - t < max(up_rules.periodSeconds, down_rules.periodSeconds)
    ]
    up = min(r for t, r in history if now - t <= up_rules.stabilizationWindowSeconds)
    down = max(r for t, r in history if now - t <= down_rules.stabilizationWindowSeconds)
    bounded = min(max(replicas, spec.minReplicas), spec.maxReplicas)  # (limits changed, or a hand scale)
    if bounded != replicas:
        return Decision(bounded, recommendation, "Limited")
    if up > replicas:
        room = up_rules.maxStep - sum(d for t, d in changes if d > 0 and now - t < up_rules.periodSeconds)
        if room > 0:
            return Decision(min(up, replicas + room), recommendation, "ScaledUp")
        return Decision(replicas, recommendation, "Stabilizing")
    if down < replicas:
        room = down_rules.maxStep + sum(d for t, d in changes if d < 0 and now - t < down_rules.periodSeconds)
        if room > 0:
            return Decision(max(down, replicas - room), recommendation, "ScaledDown")
        return Decision(replicas, recommendation, "Stabilizing")
    return Decision(replicas, recommendation, "Stable" if recommendation == replicas else "Stabilizing")


def describe(spec: AutoscalingSpec, load: Load) -> str:
    """The load against the targets, for an event: "connections 175/100, cpu 430m/500m per pod"."""
    t, parts = spec.targets, []
    if t.connections is not None:
        parts.append(f"connections {load.connections:g}/{t.connections}")
    if t.messagesPerSecond is not None and load.messages_per_second is not None:
        parts.append(f"messages/s {load.messages_per_second:.4g}/{t.messagesPerSecond:g}")
    if t.cpu is not None and load.cpu_millicores is not None:
        parts.append(f"cpu {load.cpu_millicores:.0f}m/{millicores(t.cpu):.0f}m")
    return ", ".join(parts) + f" per pod over {load.pods} Ready pods"
