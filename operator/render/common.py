"""What every rendered object shares: the names the operator gives them, their labels and owner, and
the paths and ports the pods agree on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..crds import API_VERSION, BrokerFleetSpec, RedisSpec

MANAGER = "fleetmq-operator"
PAUSED = "fleetmq.io/paused"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_MANAGED = "app.kubernetes.io/managed-by"
L_FLEET = "fleetmq.io/fleet"
CONFIG_KEY = "broker.yaml"
CONFIG_DIR = "/etc/fleetmq"
REDIS_PORT = 6379
SENTINEL_PORT = 26379
PASSWORD_KEY = "password"
# in broker pods: the Redis password (of the managed Redis or redis.secretRef), an external sentinels' own
REDIS_AUTH_DIR = f"{CONFIG_DIR}/redis"
#: the fleet's bridge Secret (bridge_secret): every bridge's password and TLS files, flat, always mounted
BRIDGE_SECRETS_DIR = f"{CONFIG_DIR}/bridge-secrets"
SENTINEL_AUTH_DIR = f"{CONFIG_DIR}/redis-sentinel"
#: the fleet's users Secret (users_secret): one users file per zone of its MqttUsers, always mounted
USERS_SECRET_DIR = f"{CONFIG_DIR}/fleet-users"
#: the management API's keys file (spec.api: its keysSecretRef, or the generated <fleet>-api-keys)
API_KEYS_DIR = f"{CONFIG_DIR}/api"
API_KEYS_FILE = "keys.yaml"
API_ADMIN_KEY = "admin-key"  # the generated Secret's plain admin key, for the user to read


class RenderError(Exception):
    """The fleet's config cannot be rendered; the running fleet is left as it is."""


@dataclass(frozen=True)
class Fleet:
    """A BrokerFleet as the operator reads it: its object (metadata and status as the API server gave
    them) and its spec, validated once where the object comes in (Fleet.parse)."""

    obj: dict[str, Any]
    spec: BrokerFleetSpec

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Fleet:
        """Raises pydantic's ValidationError when the spec is invalid."""
        return cls(dict(obj), BrokerFleetSpec.model_validate(obj.get("spec") or {}))

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace", "default"))

    @property
    def uid(self) -> str:
        """What the fleet's children name it by in their ownerReferences (deleted with it)."""
        return str(self.obj["metadata"]["uid"])


def paused(obj: dict[str, Any]) -> bool:
    return str((obj.get("metadata", {}).get("annotations") or {}).get(PAUSED, "")).lower() == "true"


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
        "redis": dns_name(fleet, "redis", limit=52),  # StatefulSet, its Service and PodDisruptionBudget
        "sentinel": dns_name(fleet, "redis-sentinel", limit=52),
        "redis_auth": dns_name(fleet, "redis-auth"),
        "redis_scripts": dns_name(fleet, "redis-scripts"),
        "bridge_secrets": dns_name(fleet, "bridge-secrets"),
        "users": dns_name(fleet, "mqttusers"),
        "api": dns_name(fleet, "api"),  # the API's Service
        "api_keys": dns_name(
            fleet, "api-keys"
        ),  # its generated keys Secret  # (not "-users": the README names a zone's own Secret so)
    }


def pod_address(namespace: str, statefulset: str, i: int, port: int) -> str:
    """HOST:PORT of one pod of a StatefulSet whose headless Service has the StatefulSet's name."""
    return f"{statefulset}-{i}.{statefulset}.{namespace}.svc:{port}"


def redis_addresses(fleet: str, namespace: str, spec: BrokerFleetSpec) -> list[str]:
    """Every managed Redis server (pod 0 first)."""
    return [
        pod_address(namespace, names(fleet)["redis"], i, REDIS_PORT) for i in range(redis_pods(spec.redis))
    ]


def sentinel_addresses(fleet: str, namespace: str, spec: BrokerFleetSpec) -> list[str]:
    return [
        pod_address(namespace, names(fleet)["sentinel"], i, SENTINEL_PORT)
        for i in range(spec.redis.sentinels)
    ]


def redis_pods(redis: RedisSpec) -> int:
    """Redis servers of the managed Redis: each primary (a shard of a cluster) and its replicas."""
    return (redis.shards if redis.mode == "cluster" else 1) * (redis.replicas_per_primary + 1)


def selector_labels(fleet: str, component: str = "broker") -> dict[str, str]:
    return {L_NAME: "fleetmq", L_INSTANCE: fleet, L_COMPONENT: component}


def labels(fleet: str, component: str = "broker", **extra: str) -> dict[str, str]:
    return {**selector_labels(fleet, component), L_MANAGED: MANAGER, L_FLEET: fleet, **extra}


def selector_string(fleet: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(fleet).items())


def owner_reference(fleet: Fleet) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "BrokerFleet",
        "name": fleet.name,
        "uid": fleet.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def short_digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def object_meta(fleet: Fleet, name: str, component: str = "broker", **extra: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": fleet.namespace,
        "labels": labels(fleet.name, component, **extra),
        "ownerReferences": [owner_reference(fleet)],
    }
