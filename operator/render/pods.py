"""What every pod the operator runs gets: the restricted Pod Security Standard, a spread over nodes and
zones, what the user's pod template adds, and a disruption budget."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..crds import OPERATOR_LABELS, OPERATOR_PREFIX, PodTemplate, SchedulingSpec
from .common import Fleet, RenderError, names, object_meta, selector_labels


def placement(
    fleet_name: str, component: str, scheduling: SchedulingSpec, pod: PodTemplate | None = None
) -> dict[str, Any]:
    """Pod spec fields that spread the fleet's pods of one kind over nodes (anti-affinity) and zones; a pod
    template's affinity and topologySpreadConstraints, when set, replace the preset ones."""
    match = {"labelSelector": {"matchLabels": selector_labels(fleet_name, component)}}
    out: dict[str, Any] = {
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
             **match}
        ]
    }  # fmt: skip
    term = {**match, "topologyKey": scheduling.topologyKey}
    if scheduling.antiAffinity == "required":
        out["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    elif scheduling.antiAffinity == "preferred":
        preferred = [{"weight": 100, "podAffinityTerm": term}]
        out["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    if scheduling.nodeSelector:
        out["nodeSelector"] = dict(scheduling.nodeSelector)
    if pod is not None and pod.affinity is not None:
        out.pop("affinity", None)
        if affinity := pod.affinity.model_dump(mode="json", exclude_none=True):
            out["affinity"] = affinity
    if pod is not None and pod.topologySpreadConstraints is not None:
        out.pop("topologySpreadConstraints")
        if pod.topologySpreadConstraints:
            out["topologySpreadConstraints"] = [
                {**match, **c.model_dump(mode="json", exclude_none=True)}
                for c in pod.topologySpreadConstraints
            ]
    return out


def pod_template(
    fleet_name: str,
    component: str,
    scheduling: SchedulingSpec,
    tpl: PodTemplate | None,
    where: str,
    metadata: dict[str, Any],
    spec: dict[str, Any],
    *,
    sidecars: bool = True,
) -> dict[str, Any]:
    """A pod template: the operator's metadata and pod spec, placed over nodes, with what the user's pod
    template (`tpl`, at `where` in the fleet) adds. The operator's own names (labels, containers,
    volumes, variables, mount paths) are refused (RenderError naming the field): in lists keyed by name the
    API server would merge the two. The CRD refuses them first; this also covers names made at render
    time (tls-N, users-N). Without `sidecars` (a Job) the template's sidecars are left out: the Job would
    never end."""
    tpl = tpl or PodTemplate()
    metadata, spec = dict(metadata), {**spec, **placement(fleet_name, component, scheduling, tpl)}
    main = [dict(c) for c in spec["containers"]]

    def refuse(field: str, names: Collection[str], own: Collection[str], what: str) -> None:
        if taken := sorted(set(names) & set(own)):
            raise RenderError(
                f"{where}.{field}: {', '.join(taken)} {what} of the operator's {component} pods"
            )

    labels_ = tpl.labels or {}
    operators = [
        k
        for k in [*labels_, *(tpl.annotations or {})]
        if k in OPERATOR_LABELS or k.startswith(OPERATOR_PREFIX)
    ]
    if operators:
        raise RenderError(f"{where}: {', '.join(operators)} are the operator's labels and annotations")
    refuse("volumes", [v.name for v in tpl.volumes or []], [v["name"] for v in spec.get("volumes", [])],
           "is a volume")  # fmt: skip
    own_containers = [c["name"] for c in main]
    refuse("sidecars", [c.name for c in tpl.sidecars or []], own_containers, "is a container")
    refuse("initContainers", [c.name for c in tpl.initContainers or []], own_containers, "is a container")
    for c in main:
        refuse("env", [e.name for e in tpl.env or []], [e["name"] for e in c.get("env", [])], "is a variable")
        refuse("volumeMounts", [m.mountPath for m in tpl.volumeMounts or []],
               [m["mountPath"] for m in c.get("volumeMounts", [])], "is a mount path")  # fmt: skip
    if labels_:
        metadata["labels"] = {**labels_, **metadata["labels"]}
    if tpl.annotations:
        metadata["annotations"] = {**tpl.annotations, **metadata.get("annotations", {})}
    for c in main:
        if tpl.env:
            c["env"] = [*c.get("env", []), *(e.model_dump(mode="json", exclude_none=True) for e in tpl.env)]
        if tpl.envFrom:
            c["envFrom"] = [e.model_dump(mode="json", exclude_none=True) for e in tpl.envFrom]
        if tpl.volumeMounts:
            c["volumeMounts"] = [
                *c.get("volumeMounts", []),
                *(m.model_dump(mode="json", exclude_none=True) for m in tpl.volumeMounts),
            ]
    spec["containers"] = [*main, *(c.manifest() for c in (tpl.sidecars or []) if sidecars)]
    if tpl.initContainers:
        spec["initContainers"] = [c.manifest() for c in tpl.initContainers]
    if tpl.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *(v.manifest() for v in tpl.volumes)]
    if tpl.tolerations:
        spec["tolerations"] = [t.model_dump(mode="json", exclude_none=True) for t in tpl.tolerations]
    if tpl.imagePullSecrets:
        spec["imagePullSecrets"] = [{"name": ref.name} for ref in tpl.imagePullSecrets]
    if tpl.priorityClassName:
        spec["priorityClassName"] = tpl.priorityClassName
    if tpl.serviceAccountName:
        # with the deprecated alias the API server fills in from it: were only serviceAccountName applied,
        # removing it later would not work (the server restores it from serviceAccount)
        spec["serviceAccountName"] = spec["serviceAccount"] = tpl.serviceAccountName
    if tpl.automountServiceAccountToken is not None:
        spec["automountServiceAccountToken"] = tpl.automountServiceAccountToken
    return {"metadata": metadata, "spec": spec}


def pdb(fleet: Fleet, name: str | None = None, component: str = "broker") -> dict[str, Any]:
    """How many pods of a kind may be down at a time by choice (drains, upgrades): the brokers' as
    spec.disruption says; one at a time for Redis and sentinels."""
    budget = fleet.spec.disruption.budget() if component == "broker" else {"maxUnavailable": 1}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(fleet, name or names(fleet.name)["pdb"], component),
        "spec": {**budget, "selector": {"matchLabels": selector_labels(fleet.name, component)}},
    }


# The "restricted" Pod Security Standard, for every pod the operator creates.
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
BROKER_UID = 10001  # the image's fleetmq user (Dockerfile)
REDIS_UID = 999  # the redis user of the official image
POD_NAME_ENV = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def restricted_pod(uid: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
