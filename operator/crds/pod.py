"""Pod templates: what a platform team sets on the pods the operator runs, besides their own settings,
and the names of those pods it keeps for itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from .base import CrdModel, ObjectRef
from .core import (
    DNS_SUBDOMAIN,
    LABEL_VALUE,
    QUALIFIED_NAME,
    Affinity,
    Container,
    EnvFromSource,
    EnvVar,
    Toleration,
    TopologySpreadConstraint,
    Volume,
    VolumeMount,
)

#: label keys the operator sets on its pods (their selectors) and the prefix it keeps for itself
OPERATOR_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
OPERATOR_PREFIX = "fleetmq.io/"


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _no_reserved(field: str, reserved: Reserved, message: str) -> dict[str, Any]:
    """CEL: no element of a list has a `field` the operator's pods use (in a list keyed by name the API
    server would merge the two, or refuse both)."""
    return {"rule": f"self.all(x, !x.{field}.matches('{reserved.regex}'))", "message": message}


def _names_unique(field: str = "name") -> dict[str, Any]:
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [field]}


class PodTemplate(CrdModel):
    """What the operator's pods get besides their own settings. Changing it rolls the pods."""

    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] | None = Field(
        None,
        max_length=64,
        description="Labels of the pods (service meshes, cost allocation); not the operator's own "
        "(app.kubernetes.io/name, instance, component, managed-by, fleetmq.io/...).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !(k in {_cel_list(OPERATOR_LABELS)}) && !k.startsWith('{OPERATOR_PREFIX}'))",
                    "message": "pod.labels: app.kubernetes.io/name, instance, component, managed-by and "
                    "fleetmq.io/ labels are the operator's (its selectors)",
                },
                {
                    "rule": f"self.all(k, k.matches('{QUALIFIED_NAME}'))",
                    "message": "pod.labels: keys are [DNS subdomain/]name, the name at most 63 characters",
                },
            ]
        },
    )
    annotations: dict[str, str] | None = Field(
        None,
        max_length=64,
        description="Annotations of the pods (sidecar and secret injectors, mesh settings); not "
        "fleetmq.io/ ones.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !k.startsWith('{OPERATOR_PREFIX}'))",
                    "message": "pod.annotations: fleetmq.io/ annotations are the operator's",
                },
                {
                    "rule": f"self.all(k, k.matches('{QUALIFIED_NAME}'))",
                    "message": "pod.annotations: keys are [DNS subdomain/]name, the name at most 63 characters",
                },
            ]
        },
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=32, description="Node taints the pods tolerate."
    )
    affinity: Affinity | None = Field(
        None,
        description="Node and pod (anti-)affinity of the pods. Set, it replaces the preset anti-affinity "
        "of `scheduling` ({} for none): include a podAntiAffinity to keep pods on different nodes.",
    )
    topologySpreadConstraints: list[TopologySpreadConstraint] | None = Field(
        None,
        max_length=8,
        description="How the pods spread over zones or nodes. Set, it replaces the preset (maxSkew 1 over "
        "topology.kubernetes.io/zone, ScheduleAnyway; [] for none). A constraint without labelSelector "
        "counts the pods of its StatefulSet.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(c, self.filter(d, d.topologyKey == c.topologyKey && "
                    "d.whenUnsatisfiable == c.whenUnsatisfiable).size() == 1)",
                    "message": "topologySpreadConstraints: one per topologyKey and whenUnsatisfiable",
                }
            ]
        },
    )
    priorityClassName: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN, description="PriorityClass of the pods."
    )
    serviceAccountName: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount the pods run as (default: the namespace's default). Its token is "
        "mounted only with automountServiceAccountToken.",
    )
    automountServiceAccountToken: bool | None = Field(
        None,
        description="Mount the ServiceAccount's API token into the pods (default false: fleetmq never "
        "calls the Kubernetes API; a secret injector or a sidecar may need it).",
    )
    imagePullSecrets: list[ObjectRef] | None = Field(
        None,
        max_length=16,
        description="Secrets (kubernetes.io/dockerconfigjson) to pull the images with.",
        json_schema_extra=_names_unique(),
    )
    envFrom: list[EnvFromSource] | None = Field(
        None,
        max_length=16,
        description="ConfigMaps and Secrets whose keys become environment variables of the main "
        "container(s).",
    )
    # env, volumes, volumeMounts, sidecars and initContainers: in pod_template (what is reserved differs)

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                    "self.volumes.exists(v, v.name == m.name))",
                    "message": "pod.volumeMounts: each names a volume of pod.volumes",
                }
            ]
        },
    )

    env: list[EnvVar] | None = None
    volumes: list[Volume] | None = None
    volumeMounts: list[VolumeMount] | None = None
    sidecars: list[Container] | None = None
    initContainers: list[Container] | None = None


@dataclass(frozen=True)
class Reserved:
    """Names the operator's own pods use: a regex (RE2 and Python alike) and how users read it."""

    regex: str
    text: str


@dataclass(frozen=True)
class PodNames:
    """What the operator's pods of one kind name: containers, volumes, variables, mount paths."""

    containers: Reserved
    volumes: Reserved
    env: Reserved
    mounts: Reserved


#: what the operator's own pods use (render/; a unit test checks the rendered pods against these)
BROKER_NAMES = PodNames(
    containers=Reserved(r"^broker$", "broker"),
    volumes=Reserved(
        r"^(config|bridge-secrets|fleet-users|redis-auth|redis-sentinel-auth|tls-[0-9]+|users-[0-9]+)$",
        "config, bridge-secrets, fleet-users, redis-auth, redis-sentinel-auth, tls-N and users-N",
    ),
    env=Reserved(r"^POD_NAME$", "POD_NAME"),
    mounts=Reserved(r"^/etc/fleetmq(/.*)?$", "/etc/fleetmq and below"),
)
REDIS_NAMES = PodNames(
    containers=Reserved(r"^(redis|sentinel|create)$", "redis, sentinel and create"),
    volumes=Reserved(r"^(scripts|auth|conf|data)$", "scripts, auth, conf and data"),
    env=Reserved(r"^(POD_NAME|CLUSTER_REPLICAS|REDIS_.*|SENTINEL_.*)$", "POD_NAME, CLUSTER_REPLICAS, REDIS_* and SENTINEL_*"),
    mounts=Reserved(r"^/(scripts|etc/redis-auth|conf|data)(/.*)?$", "/scripts, /etc/redis-auth, /conf, /data and below"),
)  # fmt: skip


def _named_list(max_length: int, description: str, rule: dict[str, Any], key: str = "name") -> Any:
    """A list field keyed by `key` (as in a Kubernetes pod spec) refusing the operator's own names."""
    extra = {**_names_unique(key), "x-kubernetes-validations": [rule]}
    return Field(None, max_length=max_length, description=description, json_schema_extra=extra)


def _env(r: PodNames) -> Any:
    return _named_list(
        64,
        f"Environment variables of the main container(s); not {r.env.text} (the operator's).",
        _no_reserved("name", r.env, f"pod.env: {r.env.text} are the operator's variables"),
    )


def _volumes(r: PodNames) -> Any:
    return _named_list(
        32,
        f"Volumes added to the pods (for volumeMounts and sidecars); not named {r.volumes.text} (the "
        "operator's).",
        _no_reserved("name", r.volumes, f"pod.volumes: {r.volumes.text} are the operator's volumes"),
    )


def _mounts(r: PodNames) -> Any:
    return _named_list(
        32,
        f"Mounts of `volumes` in the main container(s); not at {r.mounts.text} (the operator's).",
        _no_reserved("mountPath", r.mounts, f"pod.volumeMounts: {r.mounts.text} are the operator's mounts"),
        key="mountPath",
    )


def _sidecars(r: PodNames) -> Any:
    return _named_list(
        8,
        "Containers of your own beside the main one(s) (a mesh proxy, a log shipper); not named "
        f"{r.containers.text}.",
        _no_reserved(
            "name", r.containers, f"pod.sidecars: {r.containers.text} are the operator's containers"
        ),
    )


def _init_containers(r: PodNames) -> Any:
    return _named_list(
        8,
        "Init containers of your own, run before the main one(s); with restartPolicy Always a native "
        f"sidecar that starts first and stops last. Not named {r.containers.text}.",
        _no_reserved(
            "name", r.containers, f"pod.initContainers: {r.containers.text} are the operator's containers"
        ),
    )


class BrokerPodTemplate(PodTemplate):
    """What the broker pods get besides the operator's settings: labels, annotations, tolerations,
    affinity, spread, priority, ServiceAccount, pull Secrets, environment, volumes, sidecars. Changing it
    rolls the pods one at a time."""

    env: list[EnvVar] | None = _env(BROKER_NAMES)
    volumes: list[Volume] | None = _volumes(BROKER_NAMES)
    volumeMounts: list[VolumeMount] | None = _mounts(BROKER_NAMES)
    sidecars: list[Container] | None = _sidecars(BROKER_NAMES)
    initContainers: list[Container] | None = _init_containers(BROKER_NAMES)


class RedisPodTemplate(PodTemplate):
    """What the managed Redis' pods get besides the operator's settings: labels, annotations,
    tolerations, affinity, spread, priority, ServiceAccount, pull Secrets, environment, volumes, sidecars.
    Changing it rolls those pods one at a time."""

    env: list[EnvVar] | None = _env(REDIS_NAMES)
    volumes: list[Volume] | None = _volumes(REDIS_NAMES)
    volumeMounts: list[VolumeMount] | None = _mounts(REDIS_NAMES)
    sidecars: list[Container] | None = _sidecars(REDIS_NAMES)
    initContainers: list[Container] | None = _init_containers(REDIS_NAMES)
