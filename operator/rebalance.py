"""Rebalancing a fleet's connections (BrokerFleet spec.rebalance), decided from what the pods report.

Pods added by a scale-up start empty: clients stay on the pod they connected to. A rebalance asks each
pod with more than its share (a donor; EMQX's thresholds: above the average by a factor and by a count)
to let go of what it has above the average, at a paced rate, through an order in Redis that the pod
reads with its heartbeat (fleetmq.broker.rebalance). While it runs, donors are not serving (rollout.py's
label), so the clients they let go reconnect to the other pods; it ends when every donor reports its
order done, at the timeout, or (Interrupted) when the fleet stops being steady: a pod not Ready, a
rollout, a scale.

Everything here is pure: `step` takes what the operator observed and returns what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleetmq.broker.rebalance import Order, Progress

from .crds import RebalanceSpec
from .timestamps import epoch

#: a new value starts a rebalance (as `kubectl rollout restart` does with its annotation)
ANNOTATION = "fleetmq.io/rebalance"


def plan(connections: dict[str, int], threshold: float, minimum: int) -> dict[str, int]:
    """pod -> connections it should let go: what a donor has above the average (rounded up)."""
    if not connections:
        return {}
    average = sum(connections.values()) / len(connections)
    keep = math.ceil(average)
    return {
        pod: n - keep
        for pod, n in sorted(connections.items())
        if n > average * threshold and n - average > minimum and n > keep
    }


@dataclass
class Step:
    """What the operator does about rebalancing in one reconcile."""

    status: dict[str, Any] | None  # status.rebalance as it is now (None: nothing to record yet)
    orders: dict[str, Order | None] = field(default_factory=dict)  # pod -> order to write (None: delete)
    donors: set[str] = field(default_factory=set)  # pods that take no new connections now
    event: tuple[str, str] | None = None  # (reason, message)
    recheck: float | None = None  # seconds until the operator should look again


def step(
    spec: RebalanceSpec,
    previous: dict[str, Any] | None,
    requested: str | None,
    steady: bool,
    nodeinfo: dict[str, dict[str, str]],
    now: float,
    timestamp: str,
    new_id: str,
) -> Step:
    """The next step, given status.rebalance as it was (`previous`), the annotation's value, whether the
    fleet is steady (every pod Ready and reporting, no rollout), and each pod's report."""
    prev = dict(previous or {})
    if prev.get("phase") == "Running":
        return _running(spec, prev, steady, nodeinfo, now, timestamp)
    if not steady:  # (a request waits until it is)
        return Step(previous)
    pods = sorted(nodeinfo)
    out = {**prev, "replicas": len(pods)}
    if requested is not None and requested != prev.get("requested"):
        reason = "Requested"
        out["requested"] = requested
    elif spec.afterScaleUp and "replicas" in prev and len(pods) > int(prev["replicas"]):
        reason = "ScaleUp"
    else:
        return Step(out)
    connections = {pod: int(nodeinfo[pod].get("connections") or 0) for pod in pods}
    moves = plan(connections, spec.threshold, spec.minConnections)
    counts = ", ".join(f"{pod} {n}" for pod, n in connections.items())
    out |= {"reason": reason, "id": new_id, "startedAt": timestamp, "moved": 0}
    if not moves:
        out |= {"phase": "Balanced", "finishedAt": timestamp, "pods": {}}
        return Step(
            out, event=("RebalanceSkipped", f"Connections per pod are within the thresholds: {counts}")
        )
    until = now + spec.timeoutSeconds
    out |= {
        "phase": "Running",
        "finishedAt": None,
        "pods": {pod: {"asked": n, "moved": 0} for pod, n in moves.items()},
    }
    message = (
        f"Moving {sum(moves.values())} connections from {', '.join(moves)} to the other pods, "
        f"{spec.evictionRate:g} a second from each ({reason}; connections per pod: {counts})"
    )
    return Step(
        out,
        orders={pod: Order(new_id, n, spec.evictionRate, until) for pod, n in moves.items()},
        donors=set(moves),
        event=("RebalanceStarted", message),
        recheck=max(moves.values()) / spec.evictionRate + 2.0,
    )


def _running(
    spec: RebalanceSpec,
    prev: dict[str, Any],
    steady: bool,
    nodeinfo: dict[str, dict[str, str]],
    now: float,
    timestamp: str,
) -> Step:
    pods: dict[str, dict[str, int]] = {p: dict(v) for p, v in (prev.get("pods") or {}).items()}
    done = True
    for pod, entry in pods.items():
        raw = (nodeinfo.get(pod) or {}).get("rebalance")
        progress = Progress.parse(raw) if raw else None
        if progress is not None and progress.id == prev.get("id"):
            entry["moved"] = progress.evicted
            done = done and progress.done
        else:
            done = False
    moved = sum(e["moved"] for e in pods.values())
    out = {**prev, "pods": pods, "moved": moved}
    started = epoch(prev.get("startedAt"))
    if not steady:
        phase, reason = "Interrupted", "RebalanceInterrupted"
    elif done:
        phase, reason = "Completed", "RebalanceCompleted"
    elif started is not None and now >= started + spec.timeoutSeconds:
        phase, reason = "TimedOut", "RebalanceTimedOut"
    else:
        return Step(out, donors=set(pods), recheck=2.0)
    out |= {"phase": phase, "finishedAt": timestamp}
    if steady:
        out["replicas"] = len(nodeinfo)
    message = f"{moved} of {sum(e['asked'] for e in pods.values())} connections moved"
    return Step(out, orders=dict.fromkeys(pods), event=(reason, message))
