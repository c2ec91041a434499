"""Rebalancing a fleet's connections (BrokerFleet spec.rebalance), decided from what the pods report.

Pods added by a scale-up start empty: clients stay on the pod they connected to. A rebalance asks each
pod with more than its share (a donor; EMQX's thresholds: above the average by a factor and by a count)
to let go of what it has above the average, at a paced rate, through an order in Redis that the pod
reads with its heartbeat (fleetmq.broker.rebalance). The clients let go reconnect through the Services,
and where they land is the Services' random choice among the pods that serve; so that each pod ends
near the average, the pods below it receive one at a time, each in a stage of its own:

1. that pod alone serves (rollout.py's label) and the Services get rollout.STEER_SETTLE seconds to
   follow, so no client let go lands back on a donor or on another receiver;
2. each donor is ordered to let go its part of what that pod is to receive (in proportion to what the
   donor still has to give, so the donors finish together);
3. once every donor reports its order done, the pod keeps serving alone for HOLD seconds, while the
   last clients let go reconnect.

It ends when the last stage does, at the timeout, or (Interrupted) when the fleet stops being steady: a
pod not Ready, a rollout, a scale.

Everything here is pure: `step` takes what the operator observed and returns what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleetmq.broker.rebalance import Order, Progress

from .crds import RebalanceSpec
from .rollout import STEER_SETTLE
from .timestamps import epoch

#: a new value starts a rebalance (as `kubectl rollout restart` does with its annotation)
ANNOTATION = "fleetmq.io/rebalance"
#: seconds a receiving pod keeps serving alone once the donors are done (clients reconnect after a delay)
HOLD = 5.0


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


def _apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """`total` split in proportion to `weights` in whole numbers that add up to it (largest remainder;
    ties go to the first name)."""
    whole = sum(weights.values())
    if total <= 0 or whole <= 0:
        return dict.fromkeys(weights, 0)
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (out[k] - exact[k], k))
    for k in by_remainder[: total - sum(out.values())]:
        out[k] += 1
    return out


def receivers(connections: dict[str, int], moves: dict[str, int]) -> list[tuple[str, int]]:
    """The pods that receive what the donors give, in the order they do (the emptiest first), and how
    many each gets: in proportion to how far below the average it is."""
    average = sum(connections.values()) / max(len(connections), 1)
    below = {p: average - n for p, n in connections.items() if p not in moves and n < average}
    shares = _apportion(sum(moves.values()), below)
    return [(p, shares[p]) for p in sorted(below, key=lambda p: (connections[p], p)) if shares[p] > 0]


def stages(asked: dict[str, int], receiving: list[tuple[str, int]]) -> list[dict[str, int]]:
    """For each receiver in turn, donor -> connections it lets go in that stage: in proportion to what
    it still has to give, so the donors finish together; the last stage takes whatever is left."""
    left = dict(asked)
    out = []
    for i, (_, count) in enumerate(receiving):
        part = (
            dict(left)
            if i == len(receiving) - 1
            else _apportion(count, {d: float(n) for d, n in left.items()})
        )
        for d, n in part.items():
            left[d] -= n
        out.append(part)
    return out


@dataclass
class Step:
    """What the operator does about rebalancing in one reconcile."""

    status: dict[str, Any] | None  # status.rebalance as it is now (None: nothing to record yet)
    orders: dict[str, Order | None] = field(default_factory=dict)  # pod -> order to write (None: delete)
    away: set[str] = field(default_factory=set)  # pods that take no new connections now
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
    settled_for: float = 0.0,
) -> Step:
    """The next step, given status.rebalance as it was (`previous`), the annotation's value, whether the
    fleet is steady (every pod Ready and reporting, no rollout), each pod's report, and for how long the
    pods' serving labels have been as they are (`settled_for`, seconds)."""
    prev = dict(previous or {})
    if prev.get("phase") == "Running":
        return _running(spec, prev, steady, nodeinfo, now, timestamp, settled_for)
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
    out |= {"reason": reason, "id": new_id, "startedAt": timestamp, "moved": 0, "stage": None}
    receiving = receivers(connections, moves)
    if not moves or not receiving:
        out |= {"phase": "Balanced", "finishedAt": timestamp, "pods": {}, "receivers": []}
        return Step(
            out, event=("RebalanceSkipped", f"Connections per pod are within the thresholds: {counts}")
        )
    out |= {
        "phase": "Running",
        "finishedAt": None,
        "pods": {pod: {"asked": n, "moved": 0} for pod, n in moves.items()},
        "receivers": [{"pod": pod, "asked": n} for pod, n in receiving],
    }
    first = _stage(0, receiving[0][0], timestamp, dict.fromkeys(moves, 0))
    message = (
        f"Moving {sum(moves.values())} connections from {', '.join(moves)} to "
        f"{', '.join(f'{pod} ({n})' for pod, n in receiving)}, one receiving pod at a time, "
        f"{spec.evictionRate:g} a second from each pod giving ({reason}; connections per pod: {counts})"
    )
    return Step(
        {**out, "stage": first},
        away=set(pods) - {receiving[0][0]},
        event=("RebalanceStarted", message),
        recheck=STEER_SETTLE,
    )


def _stage(index: int, receiver: str, timestamp: str, moved: dict[str, int]) -> dict[str, Any]:
    return {
        "index": index,
        "receiver": receiver,
        "startedAt": timestamp,
        "orderedAt": None,
        "drainedAt": None,
        "movedBefore": moved,
    }


def _running(
    spec: RebalanceSpec,
    prev: dict[str, Any],
    steady: bool,
    nodeinfo: dict[str, dict[str, str]],
    now: float,
    timestamp: str,
    settled_for: float,
) -> Step:
    pods: dict[str, dict[str, int]] = {p: dict(v) for p, v in (prev.get("pods") or {}).items()}
    receiving = [(r["pod"], int(r["asked"])) for r in prev.get("receivers") or []]
    stage = dict(prev.get("stage") or {})
    index = int(stage.get("index", -1))
    out = {**prev, "pods": pods}
    started = epoch(prev.get("startedAt"))
    ended: tuple[str, str] | None = None
    if not steady or not 0 <= index < len(receiving):  # (or an older operator's, without stages)
        ended = "Interrupted", "RebalanceInterrupted"
    elif started is not None and now >= started + spec.timeoutSeconds:
        ended = "TimedOut", "RebalanceTimedOut"
    if ended is not None:
        return _end(out, pods, nodeinfo, steady, timestamp, *ended)

    receiver = receiving[index][0]
    away = set(nodeinfo) - {receiver}
    counts = stages({p: e["asked"] for p, e in pods.items()}, receiving)[index]
    order_id = f"{prev['id']}.{index}"
    if stage.get("orderedAt") is None:  # the Services are leaving every other pod out
        if settled_for < STEER_SETTLE:
            return Step(out, away=away, recheck=STEER_SETTLE - settled_for)
        until = (started or now) + spec.timeoutSeconds
        orders: dict[str, Order | None] = {
            d: Order(order_id, n, spec.evictionRate, until) for d, n in counts.items() if n > 0
        }
        out["stage"] = {**stage, "orderedAt": timestamp}
        return Step(out, orders=orders, away=away, recheck=max(counts.values()) / spec.evictionRate + 1.0)

    before = stage.get("movedBefore") or {}
    done = True
    for pod, entry in pods.items():
        if counts.get(pod, 0) == 0:
            continue
        raw = (nodeinfo.get(pod) or {}).get("rebalance")
        progress = Progress.parse(raw) if raw else None
        if progress is not None and progress.id == order_id:
            entry["moved"] = int(before.get(pod, 0)) + progress.evicted
            done = done and progress.done
        else:
            done = False
    out["moved"] = sum(e["moved"] for e in pods.values())
    if not done:
        return Step(out, away=away, recheck=2.0)
    drained = epoch(stage.get("drainedAt"))
    if drained is None:
        out["stage"] = {**stage, "drainedAt": timestamp}
        return Step(out, away=away, recheck=HOLD)
    if now < drained + HOLD:  # the last clients let go are still reconnecting: to this pod alone
        return Step(out, away=away, recheck=drained + HOLD - now)
    if index + 1 < len(receiving):
        following = receiving[index + 1][0]
        out["stage"] = _stage(index + 1, following, timestamp, {p: e["moved"] for p, e in pods.items()})
        return Step(out, away=set(nodeinfo) - {following}, recheck=STEER_SETTLE)
    return _end(out, pods, nodeinfo, steady, timestamp, "Completed", "RebalanceCompleted")


def _end(
    out: dict[str, Any],
    pods: dict[str, dict[str, int]],
    nodeinfo: dict[str, dict[str, str]],
    steady: bool,
    timestamp: str,
    phase: str,
    reason: str,
) -> Step:
    """The rebalance over: its orders withdrawn, every pod serving again."""
    out |= {"phase": phase, "finishedAt": timestamp, "stage": None}
    if steady:
        out["replicas"] = len(nodeinfo)
    message = f"{out.get('moved', 0)} of {sum(e['asked'] for e in pods.values())} connections moved"
    return Step(out, orders=dict.fromkeys(pods), event=(reason, message))
