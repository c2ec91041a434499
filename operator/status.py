"""Status of BrokerFleets and MqttZones from what was rendered and what the pods report (pure).

Pods report the hash of the config they applied in Redis (`fmq:nodeinfo:{<pod>}`); the rendered ConfigMap's
history maps each hash to the zone generations it held, so a pod's hash says which generation of every
zone it runs. Conditions follow the Kubernetes conventions: lastTransitionTime moves only when status does.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleetmq.broker.eventschema import BRIDGE_LOST

from .autoscale import Load
from .crds import RedisSpec, fleet_ref
from .render import Fleet, Rejection, Rendered, User, names, redis_pods, selector_string
from .rollout import Progress
from .timestamps import now

STATEFULSET_ROLLING = "rolling"
# Why a container of the fleet's pods cannot run, when a person has to act (a wrong image, a crash loop, a
# missing Secret): said in Degraded, not left as "0/3 pods ready".
POD_PROBLEMS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    timestamp: str,
) -> list[dict[str, Any]]:
    """Conditions with `type_` set; its lastTransitionTime kept unless its status changed."""
    value = "Unknown" if status is None else ("True" if status else "False")
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value else timestamp
    new = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }
    return [c for c in conditions if c.get("type") != type_] + [new]


def condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), None)


@dataclass(frozen=True)
class Autoscaled:
    """What the operator's autoscaler made of this pass (handlers._autoscale)."""

    desired: int | None
    reason: (
        str  # ScaledUp, ScaledDown, Stable, Stabilizing, Limited; HPAOwnsScale, MetricsUnavailable, Unknown
    )
    message: str = ""
    load: Load | None = None
    scaled_at: str | None = None  # when it changed spec.replicas in this pass


@dataclass
class Observed:
    """What the operator saw of a fleet's running parts."""

    statefulset: dict[str, Any] | None = None
    nodeinfo: dict[str, dict[str, str]] | None = None  # pod -> fields; None: Redis not readable
    nodeinfo_error: str = ""
    apply_error: str = ""
    rejected: dict[str, Rejection] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)  # the fleet's pods (brokers, managed Redis)
    #: (StatefulSet, message) of the latest FailedCreate event of each of the fleet's StatefulSets that lack
    #: pods: the API server refused their pod template (a StatefulSet's status does not say so)
    create_failures: list[tuple[str, str]] = field(default_factory=list)
    # the managed Redis' StatefulSets and Job ("Kind/name" -> object; None: not there)
    store_children: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: the names of the broker pods the StatefulSet has now (its ordinals move up with rollouts); empty:
    #: those of spec.replicas from ordinal 0
    brokers: list[str] = field(default_factory=list)
    #: a rollout under way (rollout.plan), None when none is
    rollout: Progress | None = None
    #: spec.autoscaling's pass, None without it
    autoscaling: Autoscaled | None = None


def pod_problems(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(reason, "pod NAME: REASON: message") for each container that cannot run and each pod the scheduler
    cannot place."""
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in POD_PROBLEMS:
                message = f"pod {name}: {waiting['reason']}"
                out.append(
                    (
                        waiting["reason"],
                        message + (f": {waiting['message']}" if waiting.get("message") else ""),
                    )
                )
        for cond in status.get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                out.append(("Unschedulable", f"pod {name}: Unschedulable: {cond.get('message', '')}"))
    return out


def pod_generations(
    rendered: Rendered, nodeinfo: dict[str, dict[str, str]], pods: list[str]
) -> dict[str, dict[str, int | None]]:
    """zone -> pod -> generation the pod applied (None: unknown hash or pod not reporting)."""
    out: dict[str, dict[str, int | None]] = {}
    for zone in rendered.zone_generations:
        out[zone] = {}
        for pod in pods:
            digest = (nodeinfo.get(pod) or {}).get("config_hash")
            out[zone][pod] = rendered.history.get(digest or "", {}).get(zone)
    return out


def _store_mode(redis: RedisSpec) -> str:
    if redis.managed:
        return redis.mode
    return "sentinel" if redis.sentinel else ("cluster" if redis.cluster else "standalone")


def _store_pods(redis: RedisSpec, observed: Observed) -> tuple[int, int, bool]:
    """Ready and wanted pods of the managed Redis (servers and sentinels), and whether its cluster (mode
    cluster) is formed, from its StatefulSets' and Job's status."""
    wanted = redis_pods(redis) + (redis.sentinels if redis.mode == "sentinel" else 0)
    ready = 0
    formed = redis.mode != "cluster"
    for key, obj in observed.store_children.items():
        status = (obj or {}).get("status") or {}
        if key.startswith("StatefulSet/"):
            ready += int(status.get("readyReplicas") or 0)
        elif key.startswith("Job/"):
            formed = formed or int(status.get("succeeded") or 0) > 0
    return ready, wanted, formed


def store_status(
    redis: RedisSpec, observed: Observed, pods: list[str]
) -> tuple[dict[str, Any], tuple[bool | None, str, str]]:
    """status.store and the StoreReady condition (status, reason, message): the managed Redis' pods, and
    what the brokers report of it: the primary they write to, failovers they saw, replicas in sync."""
    reports = [info for pod in pods if (info := (observed.nodeinfo or {}).get(pod))]
    primaries = Counter(r["store_primary"] for r in reports if r.get("store_primary"))
    in_sync = [n for r in reports if (n := _int(r.get("store_replicas_in_sync"))) is not None and n >= 0]
    store: dict[str, Any] = {
        "mode": _store_mode(redis),
        "managed": redis.managed,
        "primary": primaries.most_common(1)[0][0] if primaries else None,
        "failovers": max((_int(r.get("store_failovers")) or 0 for r in reports), default=0),
        "replicasInSync": min(in_sync) if in_sync else None,
        "readyPods": None,
        "wantedPods": None,
    }
    notes = ""
    if len(primaries) > 1:
        notes = "; brokers name different primaries: " + ", ".join(
            f"{a} ({n})" for a, n in primaries.most_common()
        )
    elif store["primary"]:
        notes = f"; brokers write to {store['primary']}"
    if store["replicasInSync"] is not None:
        notes += f"; {store['replicasInSync']} replica(s) in sync"
    behind = store["replicasInSync"] is not None and store["replicasInSync"] < redis.wait_replicas
    if not redis.managed:
        if observed.nodeinfo is None:
            return store, (False, "Unreachable", f"cannot reach the Redis: {observed.nodeinfo_error}")
        if behind:
            return store, (
                False,
                "ReplicasNotInSync",
                f"acks wait for {redis.wait_replicas} replica(s){notes}",
            )
        return store, (True, "Reachable", f"the brokers' Redis answers{notes}")
    ready, wanted, formed = _store_pods(redis, observed)
    store |= {"readyPods": ready, "wantedPods": wanted}
    pods_msg = f"{ready}/{wanted} Redis pods ready"
    if ready < wanted:
        return store, (False, "PodsNotReady", pods_msg + notes)
    if not formed:
        return store, (False, "ClusterForming", f"{pods_msg}; the Redis Cluster is not formed yet (its Job)")
    if behind:
        return store, (False, "ReplicasNotInSync", f"{pods_msg}; acks wait for {redis.wait_replicas}{notes}")
    return store, (True, "Ready", pods_msg + notes)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def fleet_status(
    fleet: Fleet,
    rendered: Rendered | None,
    render_error: str,
    observed: Observed,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """The BrokerFleet's status (a merge patch of .status)."""
    timestamp = timestamp or now()
    meta = fleet.obj["metadata"]
    gen = meta.get("generation")
    replicas = fleet.spec.replicas
    previous = fleet.obj.get("status") or {}
    conds: list[dict[str, Any]] = list(previous.get("conditions") or [])
    sts_status = (observed.statefulset or {}).get("status") or {}
    ready = int(sts_status.get("readyReplicas") or 0)
    current = int(sts_status.get("replicas") or 0)
    pods = observed.brokers or [f"{names(meta['name'])['statefulset']}-{i}" for i in range(replicas)]
    nodeinfo = observed.nodeinfo or {}
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "replicas": current,
        "readyReplicas": ready,
        "updatedReplicas": int(sts_status.get("updatedReplicas") or 0),
        "selector": selector_string(meta["name"]),
        "rollout": None,
    }
    progress = observed.rollout
    if progress is not None:
        status["updatedReplicas"] = progress.updated
        status["rollout"] = {"pod": progress.pod, "reason": progress.reason, "message": progress.message}
    reports = []
    for pod in pods:
        info = nodeinfo.get(pod)
        if info is not None:
            reports.append(
                {
                    "name": pod,
                    "configHash": info.get("config_hash"),
                    "connections": int(info.get("connections") or 0),
                    "sessions": int(info.get("sessions") or 0),
                }
            )
    status["pods"] = reports
    status["store"], (store_ok, store_reason, store_msg) = store_status(fleet.spec.redis, observed, pods)
    conds = set_condition(conds, "StoreReady", store_ok, store_reason, store_msg, gen, timestamp)
    status["connections"] = sum(r["connections"] for r in reports)
    status["sessions"] = sum(r["sessions"] for r in reports)
    applied_pods = 0
    if rendered is not None:
        status["configHash"] = rendered.config_hash
        status["zoneCount"] = len(rendered.zone_generations)
        gens = pod_generations(rendered, nodeinfo, pods)
        zones = {}
        for zone, generation in rendered.zone_generations.items():
            per_pod = gens[zone]
            known = [g for g in per_pod.values() if g is not None]
            zones[zone] = {
                "generation": generation,
                "appliedGeneration": min(known) if pods and len(known) == len(pods) else None,
                "podsApplied": sum(1 for g in known if g == generation),
            }
        status["zones"] = zones
        applied_pods = sum(1 for r in reports if r["configHash"] == rendered.config_hash)

    # ConfigApplied: every pod runs the rendered config
    if render_error:
        conds = set_condition(conds, "ConfigApplied", False, "ConfigInvalid", render_error, gen, timestamp)
    elif observed.nodeinfo is None:
        msg = f"cannot read pod reports from Redis: {observed.nodeinfo_error}"
        conds = set_condition(conds, "ConfigApplied", None, "ReportsUnavailable", msg, gen, timestamp)
    elif replicas == 0:
        conds = set_condition(conds, "ConfigApplied", True, "NoPods", "replicas is 0", gen, timestamp)
    elif rendered is not None and applied_pods >= replicas:  # (a rollout's added pod may not run yet)
        msg = f"all {replicas} pods run config {rendered.config_hash}"
        conds = set_condition(conds, "ConfigApplied", True, "Applied", msg, gen, timestamp)
    else:
        want = rendered.config_hash if rendered else "?"
        msg = f"{applied_pods}/{replicas} pods run config {want}"
        conds = set_condition(conds, "ConfigApplied", False, "Pending", msg, gen, timestamp)
    config_ok = (condition({"conditions": conds}, "ConfigApplied") or {}).get("status") == "True"

    # Progressing: the StatefulSet rolls or pods have yet to pick the config up
    sts = observed.statefulset or {}
    sts_gen = (sts.get("metadata") or {}).get("generation")
    rolling = (
        sts_status.get("observedGeneration") != sts_gen
        or int(sts_status.get("updatedReplicas") or 0) < replicas
        or (sts_status.get("currentRevision") != sts_status.get("updateRevision"))
    )
    if render_error or observed.apply_error:
        conds = set_condition(
            conds, "Progressing", False, "Blocked", render_error or observed.apply_error, gen, timestamp
        )
    elif progress is not None:
        conds = set_condition(
            conds, "Progressing", progress.status, progress.reason, progress.message, gen, timestamp
        )
    elif ready < replicas or (replicas and rolling):
        msg = f"{ready}/{replicas} pods ready"
        conds = set_condition(conds, "Progressing", True, "RollingOut", msg, gen, timestamp)
    elif not config_ok:
        conds = set_condition(
            conds, "Progressing", True, "ApplyingConfig", "pods are loading the config", gen, timestamp
        )
    else:
        conds = set_condition(conds, "Progressing", False, "Stable", "nothing to do", gen, timestamp)

    # Degraded: something the user must fix
    problems = []
    if render_error:
        problems.append(("ConfigInvalid", render_error))
    if observed.apply_error:
        problems.append(("ApplyFailed", observed.apply_error))
    bad_zones = {k: v for k, v in observed.rejected.items() if v.reason != "Paused"}
    if bad_zones:
        problems.append(
            (
                "ZoneRejected",
                "; ".join(f"zone {k}: {v.reason}: {v.message}" for k, v in sorted(bad_zones.items())),
            )
        )
    problems += [
        ("FailedCreate", f"StatefulSet {sts}: FailedCreate: {msg}") for sts, msg in observed.create_failures
    ]
    stuck = pod_problems(observed.pods)
    problems += stuck
    if progress is not None and progress.reason == "ReadinessTimeout":  # (the others are pod problems)
        problems.append((progress.reason, f"rollout stopped: {progress.message}"))
    if problems:
        reason = problems[0][0]
        conds = set_condition(
            conds, "Degraded", True, reason, "; ".join(m for _, m in problems), gen, timestamp
        )
    else:
        conds = set_condition(conds, "Degraded", False, "AsExpected", "", gen, timestamp)

    # Ready: all pods ready and on the rendered config, and the store takes what acks wait for (brokers
    # whose Redis has no replica in sync yet refuse persistent sessions: not a fleet to send clients to)
    if ready >= replicas and config_ok and store_ok:
        conds = set_condition(conds, "Ready", True, "Ready", f"{ready}/{replicas} pods ready", gen, timestamp)
    elif ready >= replicas and config_ok:
        conds = set_condition(conds, "Ready", False, "StoreNotReady", store_msg, gen, timestamp)
    else:
        reason = "PodsNotReady" if ready < replicas else "ConfigPending"
        msg = f"{ready}/{replicas} pods ready" + "".join(f"; {m}" for _, m in stuck if ready < replicas)
        conds = set_condition(conds, "Ready", False, reason, msg, gen, timestamp)
    status["conditions"] = conds
    _autoscaling_status(status, observed.autoscaling, previous, gen, timestamp)
    return status


def _autoscaling_status(
    status: dict[str, Any], scaled: Autoscaled | None, previous: dict[str, Any], gen: Any, timestamp: str
) -> None:
    """status.autoscaling and the Autoscaling condition: True while the operator's autoscaler acts,
    False while a HorizontalPodAutoscaler owns the scale, Unknown without metrics (absent without
    spec.autoscaling)."""
    conds = status["conditions"]
    if scaled is None:
        status["autoscaling"] = None
        status["conditions"] = [c for c in conds if c.get("type") != "Autoscaling"]
        return
    last = (previous.get("autoscaling") or {}).get("lastScaleTime")
    out: dict[str, Any] = {"desiredReplicas": scaled.desired, "lastScaleTime": scaled.scaled_at or last}
    load = scaled.load
    if load is not None:
        out["connections"] = round(load.connections, 1)
        if load.messages_per_second is not None:
            out["messagesPerSecond"] = round(load.messages_per_second, 1)
        if load.cpu_millicores is not None:
            out["cpu"] = f"{load.cpu_millicores:.0f}m"
    status["autoscaling"] = out
    state = {"HPAOwnsScale": False, "MetricsUnavailable": None, "Unknown": None}.get(scaled.reason, True)
    message = scaled.message or f"desired {scaled.desired} replicas"
    status["conditions"] = set_condition(conds, "Autoscaling", state, scaled.reason, message, gen, timestamp)


def zone_status(
    zone: dict[str, Any],
    *,
    fleet_found: bool,
    rejection: Rejection | None,
    fleet_status_: dict[str, Any] | None,
    pod_gens: dict[str, int | None] | None,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """The MqttZone's status: Accepted (valid, fleet found, ports free) and Applied (every pod runs it)."""
    timestamp = timestamp or now()
    meta = zone["metadata"]
    gen = meta.get("generation")
    conds: list[dict[str, Any]] = list((zone.get("status") or {}).get("conditions") or [])
    fleet = fleet_ref(zone) or ""
    status: dict[str, Any] = {"observedGeneration": gen}
    if not fleet_found:
        msg = f"BrokerFleet {fleet!r} not found in this namespace"
        conds = set_condition(conds, "Accepted", False, "FleetNotFound", msg, gen, timestamp)
        conds = set_condition(conds, "Applied", False, "FleetNotFound", msg, gen, timestamp)
        status["conditions"] = conds
        return status
    if rejection is not None:
        conds = set_condition(conds, "Accepted", False, rejection.reason, rejection.message, gen, timestamp)
    else:
        conds = set_condition(conds, "Accepted", True, "Accepted", f"served by fleet {fleet}", gen, timestamp)
    pod_gens = pod_gens or {}
    status["podGenerations"] = {p: g for p, g in pod_gens.items() if g is not None}
    known = [g for g in pod_gens.values() if g is not None]
    applied = min(known) if pod_gens and len(known) == len(pod_gens) else None
    status["appliedGeneration"] = applied
    if rejection is not None:
        msg = f"generation {gen} is not applied ({rejection.reason})"
        if applied is not None:
            msg += f"; pods run generation {applied}"
        conds = set_condition(conds, "Applied", False, rejection.reason, msg, gen, timestamp)
    elif not pod_gens:
        conds = set_condition(conds, "Applied", None, "NoPods", "the fleet has no pods", gen, timestamp)
    elif applied == gen:
        msg = f"all {len(pod_gens)} pods run generation {gen}"
        conds = set_condition(conds, "Applied", True, "Applied", msg, gen, timestamp)
    else:
        done = sum(1 for g in pod_gens.values() if g == gen)
        msg = f"{done}/{len(pod_gens)} pods run generation {gen}"
        conds = set_condition(conds, "Applied", False, "Pending", msg, gen, timestamp)
    status["conditions"] = conds
    return status


def bridge_status(
    bridge: dict[str, Any],
    rejection: Rejection | None,
    rendered: Any,
    observed: Observed,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """The MqttBridge's status: Accepted (valid, its Secrets there), Connected (the pod leading it is
    connected to the remote) and Degraded (no leader, or messages lost since the last status: drops that
    lose what someone meant to pass on, not a two-way bridge's loop drops), from the pods' reports."""
    timestamp = timestamp or now()
    meta = bridge["metadata"]
    name, gen = meta["name"], meta.get("generation")
    conds: list[dict[str, Any]] = list((bridge.get("status") or {}).get("conditions") or [])
    status: dict[str, Any] = {"observedGeneration": gen}
    if rejection is not None:
        conds = set_condition(conds, "Accepted", False, rejection.reason, rejection.message, gen, timestamp)
    elif rendered is None:
        conds = set_condition(
            conds, "Accepted", None, "FleetNotRendered", "the fleet's config has an error", gen, timestamp
        )
    else:
        conds = set_condition(conds, "Accepted", True, "Accepted", "in the fleet's config", gen, timestamp)
    reports: dict[str, dict[str, Any]] = {}
    for pod, info in sorted((observed.nodeinfo or {}).items()):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            report = json.loads(info.get("bridges") or "{}").get(name)
            if report is not None:
                reports[pod] = report
    leader = next((pod for pod, r in reports.items() if r.get("leader")), None)
    status["leader"] = leader
    status["connected"] = bool(leader and reports[leader].get("connected"))
    status["queueMessages"] = int(reports[leader].get("queue") or 0) if leader else 0
    status["forwarded"] = sum(int(r.get("forwarded") or 0) for r in reports.values())
    dropped: dict[str, int] = {}
    for r in reports.values():
        for reason, n in (r.get("dropped") or {}).items():
            dropped[reason] = dropped.get(reason, 0) + int(n)
    status["dropped"] = {k: v for k, v in sorted(dropped.items()) if v}
    status["lastError"] = reports[leader].get("last_error") if leader else None
    if not reports:
        conds = set_condition(
            conds, "Connected", None, "NoReports", "no broker pod reports the bridge yet", gen, timestamp
        )
    elif status["connected"]:
        conds = set_condition(
            conds, "Connected", True, "Connected", f"pod {leader} forwards it", gen, timestamp
        )
    else:
        why = status["lastError"] or ("no pod leads it" if leader is None else "connecting")
        conds = set_condition(conds, "Connected", False, "Disconnected", why, gen, timestamp)
    problems = []
    if reports and leader is None:
        problems.append("no broker pod leads the bridge")
    before = (bridge.get("status") or {}).get("dropped") or {}
    lost = {  # (counts only grow, but a restarted pod starts over: then nothing is taken for new)
        reason: n - int(before.get(reason) or 0)
        for reason, n in status["dropped"].items()
        if reason in BRIDGE_LOST and n > int(before.get(reason) or 0)
    }
    if lost:
        problems.append("lost " + ", ".join(f"{n} {reason}" for reason, n in lost.items()) + " lately")
    if problems:
        conds = set_condition(conds, "Degraded", True, "Degraded", "; ".join(problems), gen, timestamp)
    else:
        conds = set_condition(conds, "Degraded", False, "Healthy", "nothing lost lately", gen, timestamp)
    status["conditions"] = conds
    return status


def user_status(
    user: dict[str, Any],
    *,
    rejection: Rejection | None,
    rendered_user: User | None,
    rendered: Rendered | None,
    nodeinfo: dict[str, dict[str, str]] | None,
    pods: list[str],
    secret_name: str | None = None,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """The MqttUser's status: Accepted (valid, its zones served, its Secret there, its names its own) and
    Applied (every pod runs a config with this user's current generation and password)."""
    timestamp = timestamp or now()
    meta = user["metadata"]
    name, gen = meta["name"], meta.get("generation")
    spec = user.get("spec") or {}
    conds: list[dict[str, Any]] = list((user.get("status") or {}).get("conditions") or [])
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "username": rendered_user.username if rendered_user else spec.get("username") or name,
        "zones": list(rendered_user.zones) if rendered_user else [],
        "secretName": secret_name,
        "podsApplied": 0,
    }
    if rejection is not None:
        conds = set_condition(conds, "Accepted", False, rejection.reason, rejection.message, gen, timestamp)
    elif rendered is None:
        msg = "the fleet's config has an error (see its status)"
        conds = set_condition(conds, "Accepted", None, "FleetNotRendered", msg, gen, timestamp)
    else:
        msg = f"in zones {', '.join(rendered_user.zones)}" if rendered_user else "in no zone"
        conds = set_condition(conds, "Accepted", True, "Accepted", msg, gen, timestamp)
    if rendered_user is None or rendered is None:
        why = rejection.reason if rejection is not None else "FleetNotRendered"
        msg = rejection.message if rejection is not None else "the fleet's config has an error"
        conds = set_condition(conds, "Applied", False, why, msg, gen, timestamp)
        status["conditions"] = conds
        return status
    token = rendered_user.token
    applied = [
        pod
        for pod in pods
        if rendered.user_history.get(((nodeinfo or {}).get(pod) or {}).get("config_hash") or "", {}).get(name)
        == token
    ]
    status["podsApplied"] = len(applied)
    if not pods:
        conds = set_condition(conds, "Applied", None, "NoPods", "the fleet has no pods", gen, timestamp)
    elif nodeinfo is None:
        msg = "the pods' reports cannot be read"
        conds = set_condition(conds, "Applied", None, "ReportsUnavailable", msg, gen, timestamp)
    elif len(applied) == len(pods):
        msg = f"all {len(pods)} pods run generation {gen} with its password"
        conds = set_condition(conds, "Applied", True, "Applied", msg, gen, timestamp)
    else:
        msg = f"{len(applied)}/{len(pods)} pods run generation {gen} with its password"
        conds = set_condition(conds, "Applied", False, "Pending", msg, gen, timestamp)
    status["conditions"] = conds
    return status
