"""Pure rendering: a BrokerFleet and its MqttZones -> the broker config file and the child manifests.

No I/O here, so every decision the operator makes about what to run is unit-tested. What goes where:
- Everything a broker applies live (zones, ACLs, users, listeners) lives only in the ConfigMap, which the
  kubelet refreshes in the pods, so changing it never changes the pod template.
- What a broker reads only at start (store, metrics bind, event log) is hashed into the pod template's
  `fleetmq.io/restart-hash` annotation: changing it rolls the pods one at a time.
- The operator version appears nowhere in the pods, so upgrading the operator restarts no broker.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from fleetmq.broker.config import BrokerConfig, format_validation_error
from pydantic import ValidationError

from .crds import API_VERSION, BrokerFleetSpec, MqttZoneSpec

MANAGER = "fleetmq-operator"
PAUSED = "fleetmq.io/paused"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_MANAGED = "app.kubernetes.io/managed-by"
L_FLEET = "fleetmq.io/fleet"
L_ZONE = "fleetmq.io/zone"
A_CONFIG_HASH = "fleetmq.io/config-hash"
A_ZONE_GENERATIONS = "fleetmq.io/zone-generations"
A_HISTORY = "fleetmq.io/config-history"
A_ZONE_SPECS = "fleetmq.io/zone-specs"
A_RESTART_HASH = "fleetmq.io/restart-hash"
CONFIG_KEY = "broker.yaml"
CONFIG_DIR = "/etc/fleetmq"
HISTORY_LEN = 16
REDIS_PORT = 6379


class RenderError(Exception):
    """The fleet's config cannot be rendered; the running fleet is left as it is."""


@dataclass(frozen=True)
class Zone:
    """An accepted MqttZone, as it goes into the config."""

    name: str
    generation: int
    spec: MqttZoneSpec


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


@dataclass
class Rendered:
    config: dict[str, Any]  # the broker config file (no node_id: each pod passes its own name)
    config_hash: str  # what every broker reports once it applied `config`
    zone_generations: dict[str, int]
    history: dict[str, dict[str, int]]  # config hash -> zone generations, newest last
    manifests: list[dict[str, Any]] = field(default_factory=list)


def paused(obj: dict[str, Any]) -> bool:
    return (obj.get("metadata", {}).get("annotations") or {}).get(PAUSED, "").lower() == "true"


def dns_name(*parts: str, limit: int = 63) -> str:
    """Join parts into an object name; too long ones are cut and made unique with a short digest."""
    name = "-".join(p for p in parts if p)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def names(fleet: str) -> dict[str, str]:
    return {
        "config": dns_name(fleet, "config"),
        "statefulset": dns_name(fleet, limit=52),  # pods get "-N" and a controller-revision label
        "headless": dns_name(fleet, "headless"),
        "pdb": dns_name(fleet),
        "monitor": dns_name(fleet),
        "redis": dns_name(fleet, "redis", limit=52),
    }


def selector_labels(fleet: str, component: str = "broker") -> dict[str, str]:
    return {L_NAME: "fleetmq", L_INSTANCE: fleet, L_COMPONENT: component}


def labels(fleet: str, component: str = "broker", **extra: str) -> dict[str, str]:
    return {**selector_labels(fleet, component), L_MANAGED: MANAGER, L_FLEET: fleet, **extra}


def selector_string(fleet: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(fleet).items())


def owner_reference(fleet: dict[str, Any]) -> dict[str, Any]:
    meta = fleet["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "BrokerFleet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------- zones
def _created(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("creationTimestamp") or "", meta.get("name", "")


def select_zones(
    fleet: dict[str, Any],
    zone_objs: list[dict[str, Any]],
    last_applied: dict[str, Zone] | None = None,
) -> tuple[list[Zone], dict[str, Rejection]]:
    """Which zones of a fleet go into its config, and why the others do not.

    A zone that is invalid, collides with an earlier zone's port, or is paused keeps the version last
    applied (`last_applied`), so a bad edit never takes a running zone away; oldest zone wins a port.
    """
    fleet_spec = BrokerFleetSpec.model_validate(fleet.get("spec") or {})
    last_applied = last_applied or {}
    taken: dict[int, str] = {fleet_spec.metrics.port: "the fleet's metrics port"}
    accepted: list[Zone] = []
    rejected: dict[str, Rejection] = {}

    def claim(zone: Zone) -> str | None:
        ports = [lst.port for lst in zone.spec.listeners]
        for port in ports:
            if port in taken:
                return f"port {port} is already used by {taken[port]}"
        for port in ports:
            taken[port] = f"zone {zone.name}"
        return None

    fallbacks: list[tuple[Zone, Rejection]] = []
    for obj in sorted(zone_objs, key=_created):
        meta = obj["metadata"]
        name = meta["name"]
        if paused(obj):
            if name in last_applied:
                fallbacks.append((last_applied[name], Rejection("Paused", "fleetmq.io/paused is set")))
            else:
                rejected[name] = Rejection("Paused", "fleetmq.io/paused is set; never applied")
            continue
        try:
            spec = MqttZoneSpec.model_validate(obj.get("spec") or {})
        except ValidationError as e:
            rejection = Rejection("InvalidSpec", format_validation_error(e))
            if name in last_applied:
                fallbacks.append((last_applied[name], rejection))
            else:
                rejected[name] = rejection
            continue
        zone = Zone(name, int(meta.get("generation") or 1), spec)
        problem = claim(zone)
        if problem is None:
            accepted.append(zone)
            continue
        rejected[name] = Rejection("PortConflict", problem)
        if name in last_applied and (previous := last_applied[name]) and claim(previous) is None:
            accepted.append(previous)
    for zone, rejection in fallbacks:  # paused/invalid zones keep what runs, ports permitting
        rejected[zone.name] = rejection
        if claim(zone) is None:
            accepted.append(zone)
    accepted.sort(key=lambda z: z.name)
    return accepted, rejected


# ---------------------------------------------------------------------------------------- config file
def tls_dir(secret: str) -> str:
    return f"{CONFIG_DIR}/tls/{secret}"


def users_dir(zone: str) -> str:
    return f"{CONFIG_DIR}/users/{zone}"


def listener_name(zone: str, listener: str) -> str:
    return f"{zone}/{listener}"


def redis_url(fleet_name: str, namespace: str, spec: BrokerFleetSpec) -> str:
    if spec.redis.managed:
        return f"redis://{names(fleet_name)['redis']}.{namespace}.svc:{REDIS_PORT}/0"
    assert spec.redis.url is not None
    return spec.redis.url


def with_password(url: str, password: str | None) -> str:
    """The URL the brokers use: the password of redis.secretRef put into the user's URL."""
    if not password:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f":{password}@{host}"))


def broker_config(fleet: dict[str, Any], zones: list[Zone]) -> dict[str, Any]:
    """The broker config file (snake_case, the DESIGN.md contract) of a fleet and its zones."""
    meta = fleet["metadata"]
    spec = BrokerFleetSpec.model_validate(fleet.get("spec") or {})
    zone_cfg: dict[str, Any] = {}
    listeners: list[dict[str, Any]] = []
    for zone in zones:
        users = zone.spec.authentication.usersSecretRef
        users_file = f"{users_dir(zone.name)}/{users.key}" if users else None
        zone_cfg[zone.name] = zone.spec.zone_settings(users_file).model_dump(mode="json")
        for lst in zone.spec.listeners:
            entry: dict[str, Any] = {
                "name": listener_name(zone.name, lst.name),
                "zone": zone.name,
                "bind": f"0.0.0.0:{lst.port}",
                "protocol": lst.protocol,
            }
            if lst.protocol in ("ws", "wss"):
                entry["path"] = lst.path
            if lst.tlsSecretRef is not None:
                base = tls_dir(lst.tlsSecretRef.name)
                entry |= {"certfile": f"{base}/tls.crt", "keyfile": f"{base}/tls.key"}
                if lst.verify_peer:
                    entry |= {"cafile": f"{base}/ca.crt", "verify_peer": True}
            listeners.append(entry)
    return {
        "store": {
            "kind": "redis",
            "url": redis_url(meta["name"], meta.get("namespace", "default"), spec),
            "wait_replicas": spec.redis.waitReplicas,
        },
        "zones": zone_cfg,
        "listeners": listeners,
        "metrics": {"bind": f"0.0.0.0:{spec.metrics.port}"},
        # the stream is fmq:eventlog:<fleet> in the fleet's Redis, where the pipeline reads it
        "event_log": {
            "enabled": spec.eventLog.enabled,
            "max_len": spec.eventLog.max_len,
            "sample": spec.eventLog.sample,
            "max_rate": spec.eventLog.max_rate,
            "fleet": meta["name"],
        },
    }


def expected_hash(config: dict[str, Any]) -> str:
    """The hash a broker reports after applying `config` (it leaves out the store, so not the password)."""
    try:
        return BrokerConfig.model_validate(config).config_hash()
    except ValidationError as e:
        raise RenderError(format_validation_error(e)) from e


def restart_hash(config: dict[str, Any], redis_password: str | None = None) -> str:
    """Digest of what brokers read only at start: a change means new pods (rolled one at a time)."""
    start_only = {k: config[k] for k in ("store", "metrics", "event_log")}
    if redis_password:
        start_only["password"] = hashlib.sha256(redis_password.encode()).hexdigest()
    return _digest(start_only)


def render(
    fleet: dict[str, Any],
    zones: list[Zone],
    *,
    history: dict[str, dict[str, int]] | None = None,
    redis_password: str | None = None,
    service_monitor: bool = False,
) -> Rendered:
    """Everything the operator applies for a fleet (raises RenderError, applying nothing, if invalid)."""
    config = broker_config(fleet, zones)
    digest = expected_hash(config)
    generations = {z.name: z.generation for z in zones}
    hist = {h: g for h, g in (history or {}).items() if h != digest}
    hist[digest] = generations
    hist = dict(list(hist.items())[-HISTORY_LEN:])
    out = Rendered(config, digest, generations, hist)
    spec = BrokerFleetSpec.model_validate(fleet.get("spec") or {})
    out.manifests = [
        config_map(fleet, config, digest, zones, hist),
        statefulset(fleet, spec, zones, restart_hash(config, redis_password)),
        headless_service(fleet, spec),
        pdb(fleet),
        *client_services(fleet, spec, zones),
    ]
    if spec.redis.managed:
        out.manifests += redis_manifests(fleet, spec)
    if service_monitor and spec.metrics.serviceMonitor:
        out.manifests.append(servicemonitor(fleet, spec))
    return out


# ------------------------------------------------------------------------------------------ manifests
def _meta(fleet: dict[str, Any], name: str, component: str = "broker", **extra: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": fleet["metadata"].get("namespace", "default"),
        "labels": labels(fleet["metadata"]["name"], component, **extra),
        "ownerReferences": [owner_reference(fleet)],
    }


def config_map(
    fleet: dict[str, Any],
    config: dict[str, Any],
    digest: str,
    zones: list[Zone],
    history: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """The config file, plus annotations saying which zone generations (and specs) it holds."""
    meta = _meta(fleet, names(fleet["metadata"]["name"])["config"])
    meta["annotations"] = {
        A_CONFIG_HASH: digest,
        A_ZONE_GENERATIONS: json.dumps({z.name: z.generation for z in zones}, sort_keys=True),
        A_ZONE_SPECS: json.dumps(
            {z.name: z.spec.model_dump(mode="json", by_alias=True) for z in zones}, sort_keys=True
        ),
        A_HISTORY: json.dumps(history),
    }
    text = "# Rendered by fleetmq-operator from the BrokerFleet and its MqttZones; do not edit.\n"
    text += yaml.safe_dump(config, sort_keys=False)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CONFIG_KEY: text}}


def _affinity(fleet_name: str, spec: BrokerFleetSpec) -> dict[str, Any]:
    term = {
        "labelSelector": {"matchLabels": selector_labels(fleet_name)},
        "topologyKey": spec.scheduling.topologyKey,
    }
    if spec.scheduling.antiAffinity == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if spec.scheduling.antiAffinity == "preferred":
        preferred = [{"weight": 100, "podAffinityTerm": term}]
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    return {}


def _secret_volumes(zones: list[Zone]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    tls = sorted({lst.tlsSecretRef.name for z in zones for lst in z.spec.listeners if lst.tlsSecretRef})
    for i, secret in enumerate(tls):
        volumes.append({"name": f"tls-{i}", "secret": {"secretName": secret}})
        mounts.append({"name": f"tls-{i}", "mountPath": tls_dir(secret), "readOnly": True})
    for i, zone in enumerate(z for z in zones if z.spec.authentication.usersSecretRef):
        ref = zone.spec.authentication.usersSecretRef
        assert ref is not None
        volumes.append({"name": f"users-{i}", "secret": {"secretName": ref.name}})
        mounts.append({"name": f"users-{i}", "mountPath": users_dir(zone.name), "readOnly": True})
    return volumes, mounts


def statefulset(
    fleet: dict[str, Any], spec: BrokerFleetSpec, zones: list[Zone], restart: str
) -> dict[str, Any]:
    name = fleet["metadata"]["name"]
    n = names(name)
    volumes, mounts = _secret_volumes(zones)
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    args = [
        "--config",
        f"{CONFIG_DIR}/{CONFIG_KEY}",
        "--node-id",
        "$(POD_NAME)",
        "--log-level",
        spec.logLevel,
    ]
    if spec.redis.secretRef is not None and spec.redis.url:
        ref = spec.redis.secretRef
        env += [
            {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}},
            {"name": "FLEETMQ_REDIS_URL", "value": with_password(spec.redis.url, "$(REDIS_PASSWORD)")},
        ]
        args += ["--redis-url", "$(FLEETMQ_REDIS_URL)"]
    probe = {"port": "metrics", "scheme": "HTTP"}
    container = {
        "name": "broker",
        "image": spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "args": args,
        "env": env,
        # Listener ports are deliberately not declared: they change live, the pod template must not.
        "ports": [{"name": "metrics", "containerPort": spec.metrics.port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **probe},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **probe},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "startupProbe": {
            "httpGet": {"path": "/healthz", **probe},
            "periodSeconds": 2,
            "failureThreshold": 30,
        },
        "resources": spec.resources.model_dump(mode="json", exclude_defaults=False),
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, *mounts],
        "securityContext": RESTRICTED_CONTAINER,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": spec.terminationGracePeriodSeconds,
        "securityContext": restricted_pod(BROKER_UID),
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": n["config"]}}, *volumes],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector_labels(name)},
            }
        ],
    }
    if affinity := _affinity(name, spec):
        pod_spec["affinity"] = affinity
    if spec.scheduling.nodeSelector:
        pod_spec["nodeSelector"] = dict(spec.scheduling.nodeSelector)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(fleet, n["statefulset"]),
        "spec": {
            "replicas": spec.replicas,
            "serviceName": n["headless"],
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},  # one pod at a time, each waiting for readiness
            "selector": {"matchLabels": selector_labels(name)},
            "template": {
                "metadata": {"labels": labels(name), "annotations": {A_RESTART_HASH: restart}},
                "spec": pod_spec,
            },
        },
    }


def headless_service(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    name = fleet["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(fleet, names(name)["headless"], **{"fleetmq.io/service": "headless"}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [
                {"name": "metrics", "port": spec.metrics.port, "targetPort": "metrics", "protocol": "TCP"}
            ],
        },
    }


def client_services(fleet: dict[str, Any], spec: BrokerFleetSpec, zones: list[Zone]) -> list[dict[str, Any]]:
    """One Service per listener, so each can have its own type, address and DNS name."""
    name = fleet["metadata"]["name"]
    out = []
    for zone in zones:
        for lst in zone.spec.listeners:
            meta = _meta(fleet, dns_name(name, zone.name, lst.name), **{L_ZONE: zone.name})
            if spec.service.annotations:
                meta["annotations"] = dict(spec.service.annotations)
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": meta,
                    "spec": {
                        "type": spec.service.type,
                        "selector": selector_labels(name),
                        "ports": [
                            {"name": lst.name, "port": lst.port, "targetPort": lst.port, "protocol": "TCP"}
                        ],
                    },
                }
            )
    return out


def pdb(fleet: dict[str, Any]) -> dict[str, Any]:
    name = fleet["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(fleet, names(name)["pdb"]),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
    }


def servicemonitor(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    name = fleet["metadata"]["name"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(fleet, names(name)["monitor"]),
        "spec": {
            "selector": {"matchLabels": {**selector_labels(name), "fleetmq.io/service": "headless"}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": spec.metrics.interval}],
        },
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


def restricted_pod(uid: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def redis_manifests(fleet: dict[str, Any], spec: BrokerFleetSpec) -> list[dict[str, Any]]:
    """A single-replica Redis with AOF, for fleets that ask the operator to run one."""
    name = fleet["metadata"]["name"]
    rname = names(name)["redis"]
    sel = selector_labels(name, "redis")
    container: dict[str, Any] = {
        "name": "redis",
        "image": spec.redis.image,
        "args": ["--appendonly", "yes", "--save", ""],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "securityContext": RESTRICTED_CONTAINER,
    }
    sts_spec: dict[str, Any] = {
        "replicas": 1,
        "serviceName": rname,
        "selector": {"matchLabels": sel},
        "template": {
            "metadata": {"labels": labels(name, "redis")},
            "spec": {
                "automountServiceAccountToken": False,
                # the image's own redis user: its entrypoint runs redis-server directly when not root
                "securityContext": restricted_pod(REDIS_UID),
                "containers": [container],
            },
        },
    }
    if spec.redis.storage:
        sts_spec["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": spec.redis.storage}},
                },
            }
        ]
    else:
        sts_spec["template"]["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _meta(fleet, rname, "redis"),
            "spec": sts_spec,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(fleet, rname, "redis"),
            "spec": {
                "selector": sel,
                "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
            },
        },
    ]


# ------------------------------------------------------------------------------ reading what was applied
def applied_zones(config_map_obj: dict[str, Any] | None) -> dict[str, Zone]:
    """The zones in a rendered ConfigMap, as MqttZone specs, so a paused or broken zone keeps running."""
    if not config_map_obj:
        return {}
    try:
        config = yaml.safe_load((config_map_obj.get("data") or {}).get(CONFIG_KEY) or "") or {}
        generations = json.loads(
            config_map_obj["metadata"].get("annotations", {}).get(A_ZONE_GENERATIONS, "{}")
        )
        specs = json.loads(config_map_obj["metadata"].get("annotations", {}).get(A_ZONE_SPECS, "{}"))
    except (yaml.YAMLError, ValueError, KeyError):
        return {}
    out = {}
    for name, gen in generations.items():
        if name in specs and name in (config.get("zones") or {}):
            try:
                out[name] = Zone(name, int(gen), MqttZoneSpec.model_validate(specs[name]))
            except (ValidationError, ValueError):
                continue
    return out


def history(config_map_obj: dict[str, Any] | None) -> dict[str, dict[str, int]]:
    if not config_map_obj:
        return {}
    try:
        value = json.loads(config_map_obj["metadata"].get("annotations", {}).get(A_HISTORY, "{}"))
    except (ValueError, KeyError):
        return {}
    return value if isinstance(value, dict) else {}
