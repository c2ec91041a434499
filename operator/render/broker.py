"""The broker pods' StatefulSet: the config and the Secrets mounted, the probes, and the restart hash
that rolls the pods when what they read only at start changes. The operator version appears nowhere in
it, so upgrading the operator restarts no broker."""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

from ..crds import BrokerFleetSpec
from ..rollout import L_SERVING, Shape
from .certificates import listener_secret
from .common import (
    API_KEYS_DIR,
    API_KEYS_FILE,
    BRIDGE_SECRETS_DIR,
    CONFIG_DIR,
    CONFIG_KEY,
    PASSWORD_KEY,
    REDIS_AUTH_DIR,
    SENTINEL_AUTH_DIR,
    USERS_SECRET_DIR,
    Fleet,
    labels,
    names,
    object_meta,
    selector_labels,
)
from .config import authn_files, tls_dir, users_dir
from .pods import BROKER_UID, POD_NAME_ENV, RESTRICTED_CONTAINER, pod_template, restricted_pod
from .select import Bridge, Zone

BROKER_IMAGE_ENV = "FLEETMQ_BROKER_IMAGE"  # (fleetmq-operator --broker-image)
#: images earlier CRDs wrote into every BrokerFleet as the default of spec.image: they mean "not set", or a
#: fleet made by 0.1.0 would keep its brokers on 0.1.0 after an upgrade, with configs they cannot read
LEGACY_DEFAULT_IMAGES = frozenset({"fleetmq/broker:0.1.0"})
A_RESTART_HASH = "fleetmq.io/restart-hash"


def broker_image(spec: BrokerFleetSpec) -> str:
    """The fleet's broker image: its own, else the operator's (the one it renders configs for)."""
    if spec.image and spec.image not in LEGACY_DEFAULT_IMAGES:
        return spec.image
    return os.environ.get(BROKER_IMAGE_ENV) or f"fleetmq/broker:{version('fleetmq')}"


def _secret_file_volume(name: str, secret: str, key: str, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A volume with one key of a Secret as the file `password` in `path`, and its read-only mount."""
    volume = {"name": name, "secret": {"secretName": secret, "items": [{"key": key, "path": PASSWORD_KEY}]}}
    return volume, {"name": name, "mountPath": path, "readOnly": True}


def _redis_auth_volumes(
    fleet_name: str, spec: BrokerFleetSpec
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The Redis password files a broker reads (store.password_file, store.sentinel.password_file)."""
    redis = spec.redis
    out = []
    if redis.managed:
        out.append(
            _secret_file_volume("redis-auth", names(fleet_name)["redis_auth"], PASSWORD_KEY, REDIS_AUTH_DIR)
        )
    elif redis.secretRef is not None:
        out.append(
            _secret_file_volume("redis-auth", redis.secretRef.name, redis.secretRef.key, REDIS_AUTH_DIR)
        )
    if redis.sentinel is not None and redis.sentinel.secretRef is not None:
        ref = redis.sentinel.secretRef
        out.append(_secret_file_volume("redis-sentinel-auth", ref.name, ref.key, SENTINEL_AUTH_DIR))
    return out


def _secret_volumes(fleet_name: str, zones: list[Zone]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "bridge-secrets", "secret": {"secretName": names(fleet_name)["bridge_secrets"]}},
        {"name": "fleet-users", "secret": {"secretName": names(fleet_name)["users"]}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "bridge-secrets", "mountPath": BRIDGE_SECRETS_DIR, "readOnly": True},
        {"name": "fleet-users", "mountPath": USERS_SECRET_DIR, "readOnly": True},
    ]
    tls = sorted({s for z in zones for lst in z.spec.listeners if (s := listener_secret(z.name, lst))})
    for i, secret in enumerate(tls):
        volumes.append({"name": f"tls-{i}", "secret": {"secretName": secret}})
        mounts.append({"name": f"tls-{i}", "mountPath": tls_dir(secret), "readOnly": True})
    # (a volume per file the authentication chains read: projecting one key keeps the others out)
    for i, (kind, directory, key_ref, _field) in enumerate(f for z in zones for f in authn_files(z)):
        source: dict[str, Any] = {"secretName" if kind == "Secret" else "name": key_ref.name}
        source["items"] = [{"key": key_ref.key, "path": key_ref.key}]
        volumes.append({"name": f"authn-{i}", "secret" if kind == "Secret" else "configMap": source})
        mounts.append({"name": f"authn-{i}", "mountPath": directory, "readOnly": True})
    for i, zone in enumerate(z for z in zones if z.spec.authentication.usersSecretRef):
        ref = zone.spec.authentication.usersSecretRef
        assert ref is not None
        volumes.append({"name": f"users-{i}", "secret": {"secretName": ref.name}})
        mounts.append({"name": f"users-{i}", "mountPath": users_dir(zone.name), "readOnly": True})
    return volumes, mounts


def statefulset(
    fleet: Fleet,
    zones: list[Zone],
    restart: str,
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    shape: Shape | None = None,
) -> dict[str, Any]:
    """The broker StatefulSet; `shape` is how the operator drives a rollout (rollout.py): its start
    ordinal, replicas and partition (None: a steady fleet of spec.replicas)."""
    name, spec = fleet.name, fleet.spec
    shape = shape or Shape(0, spec.replicas, spec.replicas)
    n = names(name)
    volumes, mounts = _secret_volumes(name, zones)
    for volume, mount in _redis_auth_volumes(name, spec):
        volumes.append(volume)
        mounts.append(mount)
    ports = [{"name": "metrics", "containerPort": spec.metrics.port, "protocol": "TCP"}]
    if spec.api.enabled:
        ref = spec.api.keysSecretRef
        secret, key = (ref.name, ref.key) if ref is not None else (n["api_keys"], API_KEYS_FILE)
        volumes.append(
            {
                "name": "api-keys",
                "secret": {"secretName": secret, "items": [{"key": key, "path": API_KEYS_FILE}]},
            }
        )
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True})
        ports.append({"name": "api", "containerPort": spec.api.port, "protocol": "TCP"})  # fmt: skip
    env: list[dict[str, Any]] = [POD_NAME_ENV]
    args = [
        "--config",
        f"{CONFIG_DIR}/{CONFIG_KEY}",
        "--node-id",
        "$(POD_NAME)",
        "--log-level",
        spec.logLevel,
    ]
    probe = {"port": "metrics", "scheme": "HTTP"}
    container = {
        "name": "broker",
        "image": broker_image(spec),
        "imagePullPolicy": spec.imagePullPolicy,
        "args": args,
        "env": env,
        # Listener ports are deliberately not declared: they change live, the pod template must not.
        "ports": ports,
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
    }
    template = pod_template(
        name,
        "broker",
        spec.scheduling,
        spec.pod,
        "spec.pod",
        {"labels": {**labels(name), L_SERVING: "true"}, "annotations": {A_RESTART_HASH: restart}},
        pod_spec,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(fleet, n["statefulset"]),
        "spec": {
            "replicas": shape.replicas,
            "ordinals": {"start": shape.start},
            "serviceName": n["headless"],
            "podManagementPolicy": "Parallel",
            # no pod changes by itself with a new template: the operator adds new pods, then slides old
            # ones out (rollout.py)
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": shape.partition}},
            "selector": {"matchLabels": selector_labels(name)},
            "template": template,
        },
    }
