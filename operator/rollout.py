"""Rollouts that move each client once.

A broker pod holds no state of its own, so a rollout can add before it removes, as a Deployment with
maxSurge 1 and maxUnavailable 0 does. The broker StatefulSet cannot run two templates side by side on its
own, but the operator drives three of its fields (a `Shape`): ``ordinals.start``, ``replicas`` and the
rolling update's ``partition`` (pods whose index, ordinal minus start, is at or above it are made from
the update revision; the controller leaves the others alone). Outside a rollout the partition equals
replicas, so a new template changes no pod by itself. A rollout then repeats one step per old pod:

1. **add**: one more replica, at the top ordinal, made from the new template (its index is the partition);
2. once it is Ready (for READY_FOR seconds), **steer**: it alone takes new connections (the client
   Services select ``fleetmq.io/serving: "true"``); the Services get STEER_SETTLE seconds to follow;
3. **slide**: ``ordinals.start`` up by one and replicas back: the oldest pod goes, and the clients it
   evicts (paced, BrokerFleet.evictionRate) can only land on the pod just added;
4. the next step starts once that pod is gone.

Every old pod's clients thus move once, onto a pod that stays, and the new pods end up with the load the
old ones had. Pod names move up with the start ordinal (edge-0..2 become edge-3..5).

An added pod that cannot pull its image, crash-loops or is not Ready within the progress deadline stops
the rollout with no old pod replaced: the old ones keep serving (steering only starts once an updated
pod is Ready). Setting the template back makes that pod the odd one, and it goes. ``spec.paused`` holds
a rollout where it is.

Everything here is pure: the operator feeds in what it observed and applies the Plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .timestamps import epoch

L_SERVING = "fleetmq.io/serving"
#: the StatefulSet controller's label: the revision a pod was made from
L_REVISION = "controller-revision-hash"
#: seconds the EndpointSlice controller and kube-proxy are given to take a serving label up
STEER_SETTLE = 3.0
#: seconds an added pod stays Ready before an old pod is let go (a crash-looping one is Ready briefly)
READY_FOR = 5.0
#: container waiting reasons that mean the image cannot be had
IMAGE_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})
#: restarts of an added pod's container that count as a crash loop even before kubelet says so
CRASH_RESTARTS = 3
#: the Progressing reasons of a rollout stopped on the pod it added
FAILURES = ("ImagePullFailed", "CrashLoop", "ReadinessTimeout")


@dataclass(frozen=True)
class Shape:
    """The broker StatefulSet's fields the operator drives."""

    start: int
    replicas: int
    partition: int

    @classmethod
    def of(cls, statefulset: Mapping[str, Any] | None, replicas: int) -> Shape:
        """The shape a StatefulSet has (a steady one of `replicas` pods if there is none yet)."""
        if statefulset is None:
            return cls(0, replicas, replicas)
        spec = statefulset.get("spec") or {}
        start = int((spec.get("ordinals") or {}).get("start") or 0)
        current = int(spec.get("replicas", replicas))
        update = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        return cls(start, current, int(update.get("partition") or 0))

    def ordinals(self) -> range:
        return range(self.start, self.start + self.replicas)


@dataclass(frozen=True)
class Progress:
    """How a rollout stands: the fleet's Progressing condition and status.rollout."""

    status: bool | None  # the condition's status (None: Unknown)
    reason: str
    message: str
    updated: int  # pods made from the update revision
    pod: str | None = None  # the pod being added, or leaving


@dataclass(frozen=True)
class Plan:
    shape: Shape
    #: pods whose serving label must change, and to what ("true" / "false")
    serving: dict[str, str] = field(default_factory=dict)
    #: None outside a rollout
    progress: Progress | None = None
    #: look again in this many seconds (something is due that no Kubernetes event announces)
    recheck: float | None = None

    @property
    def failed(self) -> bool:
        return self.progress is not None and self.progress.status is False


def ordinal(pod: Mapping[str, Any]) -> int:
    return int(str(pod["metadata"]["name"]).rsplit("-", 1)[1])


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return pod["metadata"].get("labels") or {}


def _ready_since(pod: Mapping[str, Any]) -> float | None:
    """When the pod became Ready (wall clock), or None if it is not."""
    if pod["metadata"].get("deletionTimestamp"):
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return epoch(c.get("lastTransitionTime")) or 0.0
    return None


def ready(pod: Mapping[str, Any]) -> bool:
    return _ready_since(pod) is not None


def _failure(pod: Mapping[str, Any], now: float, deadline: float) -> tuple[str, str] | None:
    """Why an added pod will not become Ready: (Progressing reason, message), or None."""
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason"), waiting.get("message")
        detail = f"pod {name}: {reason}" + (f": {message}" if message else "")
        if reason in IMAGE_FAILURES:
            return "ImagePullFailed", detail
        if reason == "CrashLoopBackOff" or int(cs.get("restartCount") or 0) >= CRASH_RESTARTS:
            return "CrashLoop", f"pod {name}: restarted {cs.get('restartCount', 0)} times" + (
                f" ({reason})" if reason else ""
            )
    created = epoch(pod["metadata"].get("creationTimestamp"))
    if created is not None and now - created > deadline:
        return "ReadinessTimeout", f"pod {name} not Ready {deadline:g}s after it was created"
    return None


def _serving(pods: Sequence[Mapping[str, Any]], want: Mapping[str, bool]) -> dict[str, str]:
    out = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        value = "true" if want.get(name, True) else "false"
        if _labels(pod).get(L_SERVING) != value:
            out[name] = value
    return out


def _scale_down(
    shape: Shape,
    target: int,
    live: list[Mapping[str, Any]],
    leaving: list[Mapping[str, Any]],
    settled_for: float,
    away: Collection[str],
    max_unavailable: int,
) -> Plan:
    """One pod fewer, the one with the highest ordinal (a StatefulSet removes no other), one at a time.
    Every pod above `target` leaves the Services first, so the clients each evicts land on pods that stay
    (each moves once)."""
    last = shape.start + target
    want = {p["metadata"]["name"]: ordinal(p) < last and p["metadata"]["name"] not in away for p in live}
    serving = _serving(live, want)
    if leaving or serving or settled_for < STEER_SETTLE:
        wait = 1.0 if leaving or serving else STEER_SETTLE - settled_for
        return Plan(shape, serving, recheck=wait)
    if target - sum(1 for p in live if ordinal(p) < last and _ready_since(p) is not None) > max_unavailable:
        return Plan(shape, recheck=2.0)  # (the disruption budget is spent: pods that stay are not Ready)
    fewer = shape.replicas - 1
    return Plan(Shape(shape.start, fewer, fewer), recheck=1.0)


def plan(
    statefulset: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    replicas: int,
    *,
    now: float,
    settled_for: float,
    paused: bool = False,
    deadline: float = 600.0,
    away: Collection[str] = (),
    max_unavailable: int = 1,
) -> Plan:
    """What to do with the broker StatefulSet and its pods' serving labels in this pass.

    `pods`: the broker pods; `replicas`: the fleet's; `now`: the wall clock (pod timestamps are wall
    time); `settled_for`: seconds since the operator last changed a serving label; `away`: pods a
    rebalance keeps out of the Services (rebalance.py: all but the one receiving), outside a rollout;
    `max_unavailable`: the disruption budget (spec.disruption): no pod is let go while more of
    `replicas` are not Ready."""
    shape = Shape.of(statefulset, replicas)
    steady = Shape(shape.start, replicas, replicas)
    if statefulset is None:
        return Plan(steady)
    meta, status = statefulset.get("metadata") or {}, statefulset.get("status") or {}
    update = status.get("updateRevision")
    if status.get("observedGeneration") != meta.get("generation") or not update:
        # (the controller has not seen the latest template: which revision is new is not known yet)
        return Plan(shape, recheck=1.0)
    live = sorted((p for p in pods if ordinal(p) in shape.ordinals()), key=ordinal)
    old = [p for p in live if _labels(p).get(L_REVISION) != update]
    updated = len(live) - len(old)
    # (one the StatefulSet is still to delete, outside the ordinals, is leaving too: the pass right after a
    # slide may come before the controller marks it)
    leaving = [
        p for p in pods if p["metadata"].get("deletionTimestamp") or ordinal(p) not in shape.ordinals()
    ]
    if not old or (
        shape.replicas > replicas and old == live[-1:] and ordinal(old[0]) >= shape.start + replicas
    ):
        # nothing to roll; or the pod a rollout added is the odd one: its template was set back
        if shape.replicas > replicas:
            return _scale_down(shape, replicas, live, leaving, settled_for, away, max_unavailable)
        serving = _serving(live, {p["metadata"]["name"]: p["metadata"]["name"] not in away for p in live})
        if leaving and any(v == "true" for v in serving.values()):
            # (the last old pod of a rollout may still be letting its clients go: they go where the
            # rollout sent new clients, so pods serve again only once it is gone)
            serving = {n: v for n, v in serving.items() if v == "false"}
            return Plan(steady, serving, recheck=1.0)
        if status.get("currentRevision") != update:
            # A pod below the partition is made from the current revision, which moves on only once every
            # pod is updated and Ready: a pod that was never made (a template the API server refused) would
            # come from the old template again. With no old pod to keep, missing ones get the new one.
            have = {ordinal(p) for p in live}
            missing = [o - shape.start for o in steady.ordinals() if o not in have]
            if missing:
                return Plan(Shape(shape.start, replicas, min(missing)), serving, recheck=2.0)
        return Plan(steady, serving)
    if shape.replicas > replicas + 1:  # scaled down meanwhile: that first, then the rollout goes on
        return _scale_down(shape, replicas + 1, live, leaving, settled_for, (), max_unavailable)
    if shape.replicas < replicas:  # scaled up meanwhile: the new pods come from the old template
        return Plan(Shape(shape.start, replicas, replicas), recheck=1.0)

    added = shape.replicas == replicas + 1
    top = live[-1] if live and added and ordinal(live[-1]) == shape.start + replicas else None
    newest = top if top is not None and _labels(top).get(L_REVISION) == update else None
    ready_since = _ready_since(newest) if newest is not None else None
    # Steering: every new connection goes to the updated pod added last that is Ready, alone: the one just
    # added, or until it is Ready the one before (whose old pod may still be letting its clients go: they
    # must not land on an earlier new pod, or the new pods would not end up with one old pod's load each).
    # With no updated pod Ready, to every pod (a new revision that does not start must leave somewhere to go).
    ready_updated = [p for p in live if p not in old and _ready_since(p) is not None]
    steer_to = ready_updated[-1] if ready_updated else None
    serving = _serving(live, {p["metadata"]["name"]: steer_to is None or p is steer_to for p in live})

    def progress(status: bool | None, reason: str, message: str, pod: str | None) -> Progress:
        done = max(replicas - len(old), 0)
        return Progress(status, reason, f"{message} ({done}/{replicas} old pods replaced)", updated, pod)

    if paused:  # (held where it is; new clients go to every updated pod that is Ready, not one alone)
        serving = _serving(
            live, {p["metadata"]["name"]: not ready_updated or p in ready_updated for p in live}
        )
        return Plan(shape, serving, progress(None, "Paused", "the rollout is paused (spec.paused)", None))
    if leaving:  # the last pod let go is still evicting its clients: the next step waits for it
        name = leaving[0]["metadata"]["name"]
        return Plan(
            shape, serving, progress(True, "RollingOut", f"pod {name} is letting its clients go", name), 1.0
        )
    if not added:
        name = f"{str(old[0]['metadata']['name']).rsplit('-', 1)[0]}-{shape.start + replicas}"
        step = Shape(shape.start, replicas + 1, replicas)
        return Plan(step, serving, progress(True, "RollingOut", f"adding pod {name}", name), 1.0)
    if newest is None:  # (being created, or made from another revision: the controller replaces it)
        return Plan(shape, serving, progress(True, "RollingOut", "waiting for the added pod", None), 1.0)
    name = newest["metadata"]["name"]
    if ready_since is None:  # (kubelet's container states come with no event the operator watches)
        failure = _failure(newest, now, deadline)
        if failure is not None:
            return Plan(shape, serving, progress(False, *failure, name), 5.0)
        return Plan(
            shape, serving, progress(True, "RollingOut", f"waiting for pod {name} to be Ready", name), 2.0
        )
    wait = max(
        READY_FOR - (now - ready_since), 0.0 if not serving else STEER_SETTLE, STEER_SETTLE - settled_for
    )
    if wait > 0:
        return Plan(
            shape, serving, progress(True, "RollingOut", f"steering new clients to pod {name}", name), wait
        )
    if replicas - sum(1 for p in live[1:] if _ready_since(p) is not None) > max_unavailable:
        message = f"waiting for the disruption budget to let pod {live[0]['metadata']['name']} go"
        return Plan(shape, serving, progress(True, "RollingOut", message, name), 2.0)
    gone = live[0]["metadata"]["name"]  # (the oldest: old ones, unless the template was set back midway)
    step = Shape(shape.start + 1, replicas, replicas)
    return Plan(
        step, serving, progress(True, "RollingOut", f"pod {gone} lets its clients go to {name}", gone), 1.0
    )
