"""Rolling updates that move each client about once.

A StatefulSet replaces its broker pods one at a time, and each stopping pod evicts its clients (paced,
BrokerFleet.evictionRate). Left alone, the clients of the first pod replaced reconnect to pods that are
still to be replaced, and are evicted again when their turn comes. So the client Services select only
pods labelled ``fleetmq.io/serving: "true"``: once a pod of the new revision is Ready, the operator turns
the label off on the pods of the old revision, and evicted clients can only land on updated pods. Pods
keep their connections meanwhile (the label only steers new ones), and the label comes back on whenever
no updated pod is Ready (a new revision that does not start must never leave a fleet with nowhere to
connect).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

L_SERVING = "fleetmq.io/serving"
#: the StatefulSet controller's label: the revision a pod was made from
L_REVISION = "controller-revision-hash"


def _ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def serving_labels(
    statefulset: dict[str, Any] | None, pods: list[dict[str, Any]], donors: Collection[str] = ()
) -> dict[str, str]:
    """The pods whose serving label must change, and to what ("true" / "false"). Outside a rollout, the
    pods giving connections away in a rebalance (`donors`, rebalance.py) are not serving either."""
    status = (statefulset or {}).get("status") or {}
    update = status.get("updateRevision")
    rolling = bool(update) and update != status.get("currentRevision")
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
