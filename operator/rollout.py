"""Rolling updates that move each client about once.

A StatefulSet replaces its broker pods one at a time, and each stopping pod evicts its clients (paced,
BrokerFleet.evictionRate). Left alone, the clients of the first pod replaced reconnect to pods that are
still to be replaced, and are evicted again when their turn comes. So the client Services select only
pods labelled ``fleetmq.io/serving: "true"``: once a pod of the new revision is Ready, the operator turns
the label off on the pods of the old revision, and evicted clients can only land on updated pods. Pods
keep their connections meanwhile (the label only steers new ones), and the label comes back on whenever
no updated pod is Ready (a new revision that does not start must never leave a fleet with nowhere to
connect).

Left to itself, the StatefulSet controller stops the next old pod the moment an updated one is Ready: the
same moment the operator learns it should steer, so a pod that lets its clients go quickly sends them to
old pods before the label reaches the Services. The operator therefore drives the rollout through the
StatefulSet's ``partition`` (pods at or above it are updated): it lowers it one pod at a time, only once
the updated pods are Ready, the old ones are labelled not serving and the Services had STEER_SETTLE
seconds to follow the labels. A rollout waits while the operator is away.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

L_SERVING = "fleetmq.io/serving"
#: the StatefulSet controller's label: the revision a pod was made from
L_REVISION = "controller-revision-hash"
#: seconds the EndpointSlice controller and kube-proxy are given to take a serving label up
STEER_SETTLE = 3.0


def _ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _revisions(statefulset: dict[str, Any] | None) -> tuple[str | None, bool]:
    """(the update revision, whether pods are still to be rolled to it)."""
    status = (statefulset or {}).get("status") or {}
    update = status.get("updateRevision")
    return update, bool(update) and update != status.get("currentRevision")


def rolling(statefulset: dict[str, Any] | None) -> bool:
    return _revisions(statefulset)[1]


def serving_labels(
    statefulset: dict[str, Any] | None, pods: list[dict[str, Any]], donors: Collection[str] = ()
) -> dict[str, str]:
    """The pods whose serving label must change, and to what ("true" / "false"). Outside a rollout, the
    pods giving connections away in a rebalance (`donors`, rebalance.py) are not serving either."""
    update, rolling = _revisions(statefulset)
    steer = rolling and any(
        _ready(p) and p["metadata"].get("labels", {}).get(L_REVISION) == update for p in pods
    )
    out: dict[str, str] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if steer:
            want = "false" if labels.get(L_REVISION) != update else "true"
        else:
            want = "false" if pod["metadata"]["name"] in donors else "true"
        if labels.get(L_SERVING) != want:
            out[pod["metadata"]["name"]] = want
    return out


def _ordinal(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def partition(
    statefulset: dict[str, Any] | None, pods: list[dict[str, Any]] | None, replicas: int, settled: bool
) -> int:
    """The partition to apply to the broker StatefulSet (`pods`: its pods, None if they cannot be listed;
    `settled`: the old pods are labelled not serving and the Services had time to follow).

    Outside a rollout it is the highest ordinal, so a new template rolls one pod (there is nothing to steer
    to before an updated pod exists). During one it never rises above an updated pod (a pod below the
    partition is recreated from the old revision), and goes one lower only when every pod above is
    updated and Ready and the steering has settled."""
    top = max(replicas - 1, 0)
    update, rolling = _revisions(statefulset)
    if not rolling:
        return top
    current = ((statefulset or {}).get("spec") or {}).get("updateStrategy", {}).get("rollingUpdate", {})
    held = min(int(current.get("partition") or 0), top)
    if pods is None:
        return held
    by_ordinal = {_ordinal(p): p for p in pods}
    lowest, ready = replicas, True  # the lowest ordinal from which every pod is updated; all Ready?
    for i in range(top, -1, -1):
        p = by_ordinal.get(i)
        if p is None:  # (being recreated: from the update revision if at or above the partition)
            if i < held:
                break
            ready = False
        elif p["metadata"].get("labels", {}).get(L_REVISION) != update:
            break
        elif not _ready(p):
            ready = False
        lowest = i
    if lowest == replicas:
        return top
    return max(lowest - 1, 0) if ready and settled else lowest


def steered(statefulset: dict[str, Any] | None, pods: list[dict[str, Any]]) -> bool:
    """Every old pod of a rollout is labelled not serving (what partition's `settled` waits for, besides
    the time the Services take)."""
    update, rolling = _revisions(statefulset)
    return rolling and all(
        (p["metadata"].get("labels") or {}).get(L_SERVING) == "false"
        for p in pods
        if (p["metadata"].get("labels") or {}).get(L_REVISION) != update
        and not p["metadata"].get("deletionTimestamp")
    )
