"""Pure rendering: a BrokerFleet and its MqttZones -> the broker config file and the child manifests.

No I/O here, so every decision the operator makes about what to run is unit-tested. What goes where:
- Everything a broker applies live (zones, ACLs, users, listeners) lives only in the ConfigMap, which the
  kubelet refreshes in the pods, so changing it never changes the pod template; so do the Secrets every pod
  mounts whatever the fleet holds (the bridges' files, the MqttUsers' password hashes).
- What a broker reads only at start (store, metrics bind, event log) is hashed into the pod template's
  `fleetmq.io/restart-hash` annotation: changing it rolls the pods one at a time.
- The operator version appears nowhere in the pods, so upgrading the operator restarts no broker.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import yaml
from fleetmq.broker.config import BrokerConfig, format_validation_error
from pydantic import BaseModel, ValidationError

from .crds import (
    API_VERSION,
    OPERATOR_LABELS,
    OPERATOR_PREFIX,
    BrokerFleetSpec,
    ListenerSpec,
    MqttBridgeSpec,
    MqttUserSpec,
    MqttZoneSpec,
    PodTemplate,
    RedisSpec,
    SchedulingSpec,
    ServiceSpec,
)
from .rollout import L_SERVING

MANAGER = "fleetmq-operator"
BROKER_IMAGE_ENV = "FLEETMQ_BROKER_IMAGE"  # (fleetmq-operator --broker-image)
#: images earlier CRDs wrote into every BrokerFleet as the default of spec.image: they mean "not set", or a
#: fleet made by 0.1.0 would keep its brokers on 0.1.0 after an upgrade, with configs they cannot read
LEGACY_DEFAULT_IMAGES = frozenset({"fleetmq/broker:0.1.0"})
PAUSED = "fleetmq.io/paused"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_MANAGED = "app.kubernetes.io/managed-by"
L_FLEET = "fleetmq.io/fleet"
L_ZONE = "fleetmq.io/zone"
L_USER = "fleetmq.io/user"  # on an MqttUser's generated password Secret
L_REDIS_MODE = "fleetmq.io/redis-mode"  # on the managed Redis' StatefulSet: the topology its data is in
A_CONFIG_HASH = "fleetmq.io/config-hash"
A_ZONE_GENERATIONS = "fleetmq.io/zone-generations"
A_HISTORY = "fleetmq.io/config-history"
A_ZONE_SPECS = "fleetmq.io/zone-specs"
A_BRIDGE_SPECS = "fleetmq.io/bridge-specs"  # name -> [generation, MqttBridge spec] of the bridges rendered
A_USER_HISTORY = "fleetmq.io/user-history"  # config hash -> {MqttUser: User.token} of the users it held
A_RESTART_HASH = "fleetmq.io/restart-hash"
CONFIG_KEY = "broker.yaml"
CONFIG_DIR = "/etc/fleetmq"
HISTORY_LEN = 16
REDIS_PORT = 6379
SENTINEL_PORT = 26379
PASSWORD_KEY = "password"
# in broker pods: the Redis password (of the managed Redis or redis.secretRef), an external sentinels' own
REDIS_AUTH_DIR = f"{CONFIG_DIR}/redis"
#: seconds a broker keeps in hand at the end of its grace period (committing, closing) after evicting
SHUTDOWN_MARGIN = 5
#: the fleet's bridge Secret (bridge_secret): every bridge's password and TLS files, flat, always mounted
BRIDGE_SECRETS_DIR = f"{CONFIG_DIR}/bridge-secrets"
SENTINEL_AUTH_DIR = f"{CONFIG_DIR}/redis-sentinel"
#: the fleet's users Secret (users_secret): one users file per zone of its MqttUsers, always mounted
USERS_SECRET_DIR = f"{CONFIG_DIR}/fleet-users"
# in the managed Redis' pods
SCRIPT = "redis.sh"
SCRIPT_TEXT = (Path(__file__).parent / SCRIPT).read_text()
SCRIPTS_DIR = "/scripts"
REDIS_SECRET_DIR = "/etc/redis-auth"
MAXMEMORY_SHARE = 0.7  # of the container's memory: the rest is for the forks of AOF rewrites and syncs


class RenderError(Exception):
    """The fleet's config cannot be rendered; the running fleet is left as it is."""


def broker_image(spec: BrokerFleetSpec) -> str:
    """The fleet's broker image: its own, else the operator's (the one it renders configs for)."""
    if spec.image and spec.image not in LEGACY_DEFAULT_IMAGES:
        return spec.image
    return os.environ.get(BROKER_IMAGE_ENV) or f"fleetmq/broker:{version('fleetmq')}"


@dataclass(frozen=True)
class Zone:
    """An accepted MqttZone, as it goes into the config."""

    name: str
    generation: int
    spec: MqttZoneSpec


@dataclass(frozen=True)
class Bridge:
    """An accepted MqttBridge, as it goes into the config."""

    name: str
    generation: int
    spec: MqttBridgeSpec


@dataclass(frozen=True)
class User:
    """An accepted MqttUser, as it goes into the config: the zones it is in and its password's hash."""

    name: str
    generation: int
    spec: MqttUserSpec
    zones: tuple[str, ...]
    entry: str | None = None  # its users-file hash (pbkdf2_sha256$...); None: certificate only

    @property
    def username(self) -> str:
        return self.spec.username or self.name

    @property
    def token(self) -> str:
        """What a pod must run for this user to count as applied: its generation and password hash."""
        return f"{self.generation}:{_digest(self.entry)}"


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
    user_history: dict[str, dict[str, str]] = field(default_factory=dict)  # hash -> {user: token}


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
        "users": dns_name(fleet, "mqttusers"),  # (not "-users": the README names a zone's own Secret so)
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


def select_bridges(
    bridge_objs: list[dict[str, Any]], last_applied: dict[str, Bridge] | None = None
) -> tuple[list[Bridge], dict[str, Rejection]]:
    """Which bridges of a fleet go into its config, and why the others do not: an invalid or paused
    bridge keeps the version last applied, so a bad edit never stops a running bridge. Of two bridges
    with one session at the same remote (host, port and client id), the older one keeps it: they would
    take it from each other there forever."""
    last_applied = last_applied or {}
    accepted: list[Bridge] = []
    rejected: dict[str, Rejection] = {}
    sessions: dict[tuple[str, int, str], str] = {}

    def claim(bridge: Bridge) -> str | None:
        cfg = bridge.spec.bridge_config(bridge.name)
        key = (*cfg.remote.address, cfg.client_id(bridge.spec.fleetRef.name))
        holder = sessions.setdefault(key, bridge.name)
        if holder == bridge.name:
            return None
        return f"spec.remote.clientId: bridge {holder} already connects to {key[0]}:{key[1]} as {key[2]!r}"

    for obj in sorted(bridge_objs, key=_created):
        meta = obj["metadata"]
        name = meta["name"]
        if paused(obj):
            rejection = Rejection("Paused", "fleetmq.io/paused is set")
        else:
            try:
                spec = MqttBridgeSpec.model_validate(obj.get("spec") or {})
                spec.bridge_config(name)  # the broker's own rules (templates, QoS, reconnect delays)
            except ValidationError as e:
                rejection = Rejection("InvalidSpec", format_validation_error(e))
            else:
                bridge = Bridge(name, int(meta.get("generation") or 1), spec)
                problem = claim(bridge)
                if problem is None:
                    accepted.append(bridge)
                    continue
                rejection = Rejection("SessionConflict", problem)
        rejected[name] = rejection
        if name in last_applied and claim(last_applied[name]) is None:
            accepted.append(last_applied[name])
    accepted.sort(key=lambda b: b.name)
    return accepted, rejected


def select_users(
    user_objs: list[dict[str, Any]], zones: list[Zone]
) -> tuple[list[User], dict[str, Rejection]]:
    """Which users go into which zones of the config, and what is wrong with the others.

    A user is rendered into the named zones the fleet serves; one naming a zone it does not serve is
    rendered into the others and not Accepted (UnknownZone). In a zone, the older user keeps a username or
    a certificate common name another one also claims (UsernameConflict, CertificateConflict)."""
    served = {z.name for z in zones}
    accepted: list[User] = []
    rejected: dict[str, Rejection] = {}
    claims: dict[tuple[str, str, str], str] = {}  # (zone, "username"/"cn", value) -> MqttUser
    for obj in sorted(user_objs, key=_created):
        meta = obj["metadata"]
        name = meta["name"]
        try:
            spec = MqttUserSpec.model_validate(obj.get("spec") or {})
        except ValidationError as e:
            rejected[name] = Rejection("InvalidSpec", format_validation_error(e))
            continue
        username = spec.username or name
        problems: list[Rejection] = []
        unknown = [z for z in spec.zones if z not in served]
        if unknown:
            fleet = spec.fleetRef.name
            problems.append(
                Rejection("UnknownZone", f"spec.zones: fleet {fleet} serves no zone {', '.join(unknown)}")
            )
        zones_in: list[str] = []
        for zone in (z for z in spec.zones if z in served):
            wanted = [("username", username, "UsernameConflict")]
            if spec.certificateCommonName is not None:
                wanted.append(("cn", spec.certificateCommonName, "CertificateConflict"))
            taken = [(kind, value, reason) for kind, value, reason in wanted if (zone, kind, value) in claims]
            if taken:
                kind, value, reason = taken[0]
                holder = claims[(zone, kind, value)]
                what = "username" if kind == "username" else "certificateCommonName"
                problems.append(
                    Rejection(reason, f"zone {zone}: MqttUser {holder} already has {what} {value!r}")
                )
                continue
            for kind, value, _ in wanted:
                claims[(zone, kind, value)] = name
            zones_in.append(zone)
        if problems:
            rejected[name] = Rejection(problems[0].reason, "; ".join(p.message for p in problems))
        if zones_in:
            accepted.append(User(name, int(meta.get("generation") or 1), spec, tuple(zones_in)))
    accepted.sort(key=lambda u: u.name)
    return accepted, rejected


def user_files(zones: list[Zone], users: list[User]) -> dict[str, bytes]:
    """zone -> its MqttUsers' users file (`username:hash` lines, sorted), for the zones that need one: those
    with a user with a password, and those refusing anonymous clients with no users Secret of their own
    (an empty file: without any users file a broker would check no password at all)."""
    out: dict[str, bytes] = {}
    for zone in zones:
        lines = sorted(f"{u.username}:{u.entry}\n" for u in users if zone.name in u.zones and u.entry)
        auth = zone.spec.authentication
        if lines or (not auth.allow_anonymous and auth.usersSecretRef is None):
            out[zone.name] = "".join(lines).encode()
    return out


def zone_user_settings(zone: Zone, users: list[User], files: dict[str, bytes]) -> dict[str, Any]:
    """The ZoneSettings fields a zone's MqttUsers set: its users file (pinned to its content), the users'
    own rules, and the certificate common names that name them."""
    mine = [u for u in users if zone.name in u.zones]
    out: dict[str, Any] = {}
    if zone.name in files:
        out["users_files"] = [
            {
                "path": f"{USERS_SECRET_DIR}/{zone.name}",
                "sha256": hashlib.sha256(files[zone.name]).hexdigest(),
            }
        ]
    if acl := {u.username: [r.model_dump() for r in u.spec.acl] for u in mine if u.spec.acl}:
        out["user_acl"] = acl
    if certs := {u.spec.certificateCommonName: u.username for u in mine if u.spec.certificateCommonName}:
        out["cert_users"] = certs
    return out


# ---------------------------------------------------------------------------------------- config file
def tls_dir(secret: str) -> str:
    return f"{CONFIG_DIR}/tls/{secret}"


def users_dir(zone: str) -> str:
    return f"{CONFIG_DIR}/users/{zone}"


def listener_name(zone: str, listener: str) -> str:
    return f"{zone}/{listener}"


def store_config(fleet_name: str, namespace: str, spec: BrokerFleetSpec) -> dict[str, Any]:
    """The broker config's store: where the fleet's Redis is and how to reach it (docs/design.md's contract).
    Passwords are files mounted from Secrets (REDIS_AUTH_DIR, SENTINEL_AUTH_DIR), never in the config."""
    redis = spec.redis
    password_file = f"{REDIS_AUTH_DIR}/{PASSWORD_KEY}"
    store: dict[str, Any] = {"kind": "redis"}
    if redis.managed:
        if redis.mode == "sentinel":
            nodes = sentinel_addresses(fleet_name, namespace, spec)
            store["sentinel"] = {"nodes": nodes, "master": fleet_name, "password_file": password_file}
        elif redis.mode == "cluster":
            store["cluster"] = {"nodes": redis_addresses(fleet_name, namespace, spec)}
        else:
            store["url"] = f"redis://{names(fleet_name)['redis']}.{namespace}.svc:{REDIS_PORT}/0"
        store["password_file"] = password_file
    else:
        if redis.url is not None:
            store["url"] = redis.url
        if redis.sentinel is not None:
            store["sentinel"] = {"nodes": list(redis.sentinel.nodes), "master": redis.sentinel.master}
            if redis.sentinel.secretRef is not None:
                store["sentinel"]["password_file"] = f"{SENTINEL_AUTH_DIR}/{PASSWORD_KEY}"
        if redis.cluster is not None:
            store["cluster"] = {"nodes": list(redis.cluster.nodes)}
        if redis.secretRef is not None:
            store["password_file"] = password_file
    store["wait_replicas"] = redis.wait_replicas
    return store


def broker_config(
    fleet: dict[str, Any],
    zones: list[Zone],
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    bridge_files: Collection[str] = (),
    users: list[User] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """The broker config file (snake_case, the docs/design.md contract) of a fleet, its zones, bridges and
    users."""
    files = user_files(zones, users)
    meta = fleet["metadata"]
    spec = BrokerFleetSpec.model_validate(fleet.get("spec") or {})
    zone_cfg: dict[str, Any] = {}
    listeners: list[dict[str, Any]] = []
    for zone in zones:
        users_ref = zone.spec.authentication.usersSecretRef
        users_file = f"{users_dir(zone.name)}/{users_ref.key}" if users_ref else None
        zone_cfg[zone.name] = zone.spec.zone_settings(
            users_file, **zone_user_settings(zone, users, files)
        ).model_dump(mode="json")
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
                    if lst.peer_cert_as_username is not None:
                        entry["peer_cert_as_username"] = lst.peer_cert_as_username
            listeners.append(entry)
    return {
        "store": store_config(meta["name"], meta.get("namespace", "default"), spec),
        "zones": zone_cfg,
        "listeners": listeners,
        "metrics": {"bind": f"0.0.0.0:{spec.metrics.port}"},
        # the streams are fmq:eventlog:<fleet>:{<tag>} in the fleet's Redis, where the pipeline reads them
        "event_log": {**cast(BaseModel, spec.eventLog).model_dump(mode="json"), "fleet": meta["name"]},
        "bridges": [bridge_config(b, bridge_files) for b in bridges],
        "shutdown": {
            "eviction_rate": spec.evictionRate,
            "timeout": max(1, spec.terminationGracePeriodSeconds - SHUTDOWN_MARGIN),
        },
    }


def bridge_secret_files(name: str, password: str | None, tls: dict[str, str] | None) -> dict[str, str]:
    """A bridge's files in the fleet's bridge Secret (base64 data by file name): its password, and its TLS
    Secret's ca.crt and tls.crt with tls.key where that Secret has them."""
    files = {f"{name}.password": password} if password is not None else {}
    for keys in (("ca.crt",), ("tls.crt", "tls.key")):
        if tls and all(k in tls for k in keys):
            files |= {f"{name}.{k}": tls[k] for k in keys}
    return files


def bridge_config(bridge: Bridge, files: Collection[str] = ()) -> dict[str, Any]:
    """A bridge's entry in the config file: its Secrets' files where the pods find them (`files`: the
    names in the fleet's bridge Secret)."""
    remote, name = bridge.spec.remote, bridge.name
    password = f"{BRIDGE_SECRETS_DIR}/{name}.password" if remote.passwordSecretRef is not None else None
    tls = {
        field: f"{BRIDGE_SECRETS_DIR}/{name}.{key}"
        for field, key in (("cafile", "ca.crt"), ("certfile", "tls.crt"), ("keyfile", "tls.key"))
        if f"{name}.{key}" in files
    }
    try:
        return bridge.spec.bridge_config(name, password, tls).model_dump(mode="json")
    except ValidationError as e:
        raise RenderError(f"bridge {name}: {format_validation_error(e)}") from e


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
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    history: dict[str, dict[str, int]] | None = None,
    redis_password: str | None = None,
    service_monitor: bool = False,
    bridge_files: dict[str, str] | None = None,
    users: list[User] = (),  # type: ignore[assignment]
    user_history: dict[str, dict[str, str]] | None = None,
) -> Rendered:
    """Everything the operator applies for a fleet (raises RenderError, applying nothing, if invalid).

    bridge_files: the bridges' Secrets' files (bridge_secret_files), copied into the fleet's own bridge
    Secret, which every pod mounts: adding a bridge or rotating its credentials never changes the pods'
    template (kubelet brings the files within its sync period; a bridge reads them at each connection).
    users: the MqttUsers with their password hashes, into the fleet's users Secret (mounted always, too)."""
    bridge_files = bridge_files or {}
    config = broker_config(fleet, zones, bridges, bridge_files, users)
    digest = expected_hash(config)
    generations = {z.name: z.generation for z in zones}
    hist = {h: g for h, g in (history or {}).items() if h != digest}
    hist[digest] = generations
    hist = dict(list(hist.items())[-HISTORY_LEN:])
    out = Rendered(config, digest, generations, hist)
    uhist = {h: t for h, t in (user_history or {}).items() if h != digest}
    uhist[digest] = {u.name: u.token for u in users}
    out.user_history = dict(list(uhist.items())[-HISTORY_LEN:])
    spec = BrokerFleetSpec.model_validate(fleet.get("spec") or {})
    # An existing Redis' password, changed in its Secret, takes new broker pods; the managed Redis' is
    # generated once and never changed by the operator (its servers read it only at start, too).
    hashed_password = None if spec.redis.managed else redis_password
    out.manifests = [
        config_map(fleet, config, digest, zones, hist, bridges, out.user_history),
        bridge_secret(fleet, bridge_files),
        users_secret(fleet, user_files(zones, users)),
        statefulset(fleet, spec, zones, restart_hash(config, hashed_password), bridges),
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
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    user_history: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The config file, plus annotations saying which zone and bridge generations (and specs) it holds,
    and which version of each MqttUser."""
    meta = _meta(fleet, names(fleet["metadata"]["name"])["config"])
    meta["annotations"] = {
        A_CONFIG_HASH: digest,
        A_ZONE_GENERATIONS: json.dumps({z.name: z.generation for z in zones}, sort_keys=True),
        A_ZONE_SPECS: json.dumps(
            {z.name: z.spec.model_dump(mode="json", by_alias=True) for z in zones}, sort_keys=True
        ),
        A_HISTORY: json.dumps(history),
    }
    if bridges:
        meta["annotations"][A_BRIDGE_SPECS] = json.dumps(
            {b.name: [b.generation, b.spec.model_dump(mode="json", by_alias=True)] for b in bridges},
            sort_keys=True,
        )
    if user_history and any(user_history.values()):
        meta["annotations"][A_USER_HISTORY] = json.dumps(user_history)
    text = (
        "# Rendered by fleetmq-operator from the BrokerFleet, its MqttZones and MqttBridges; do not edit.\n"
    )
    text += yaml.safe_dump(config, sort_keys=False)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CONFIG_KEY: text}}


def bridge_secret(fleet: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The fleet's bridge Secret: copies of its bridges' Secrets' files, refreshed at each reconciliation."""
    meta = _meta(fleet, names(fleet["metadata"]["name"])["bridge_secrets"])
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": dict(files)}


def users_secret(fleet: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """The fleet's users Secret: one users file per zone with MqttUsers (salted hashes, never passwords)."""
    meta = _meta(fleet, names(fleet["metadata"]["name"])["users"])
    data = {zone: base64.b64encode(content).decode() for zone, content in files.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": data}


def user_password_secret(
    user: dict[str, Any], name: str, key: str, username: str, password: str
) -> dict[str, Any]:
    """An MqttUser's generated password: created once, owned by the user (deleted with it), never rewritten."""
    meta = user["metadata"]
    data = {key: password}
    if key != "username":
        data["username"] = username
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "labels": {L_MANAGED: MANAGER, L_USER: meta["name"]},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "MqttUser", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def user_file_entries(secret: dict[str, Any] | None) -> dict[str, list[str]]:
    """username -> the hashes the fleet's users Secret holds for it (to keep a hash while its password
    stays: a new salt each time would rewrite the Secret at every reconciliation)."""
    out: dict[str, list[str]] = {}
    for value in ((secret or {}).get("data") or {}).values():
        try:
            text = base64.b64decode(value).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            user, sep, encoded = line.partition(":")
            if sep:
                out.setdefault(user, []).append(encoded)
    return out


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
    fleet: dict[str, Any],
    spec: BrokerFleetSpec,
    zones: list[Zone],
    restart: str,
    bridges: list[Bridge] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    name = fleet["metadata"]["name"]
    n = names(name)
    volumes, mounts = _secret_volumes(name, zones)
    for volume, mount in _redis_auth_volumes(name, spec):
        volumes.append(volume)
        mounts.append(mount)
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
        "metadata": _meta(fleet, n["statefulset"]),
        "spec": {
            "replicas": spec.replicas,
            "serviceName": n["headless"],
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},  # one pod at a time, each waiting for readiness
            "selector": {"matchLabels": selector_labels(name)},
            "template": template,
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
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": meta,
                    **_listener_service(name, spec.service, lst, meta),
                }
            )
    return out


def _listener_service(
    fleet_name: str, defaults: ServiceSpec, lst: ListenerSpec, meta: dict[str, Any]
) -> dict[str, Any]:
    """A listener's Service spec (and its annotations, into `meta`): the fleet's service settings, the
    listener's own over them. Only fields set are applied, so what the cluster fills in (a node port it
    picked, a cluster IP) stays the cluster's."""
    own = lst.service
    annotations = {**defaults.annotations, **((own.annotations if own else None) or {})}
    if annotations:
        meta["annotations"] = annotations
    port: dict[str, Any] = {"name": lst.name, "port": lst.port, "targetPort": lst.port, "protocol": "TCP"}
    svc: dict[str, Any] = {
        "type": (own.type if own else None) or defaults.type,
        # (only serving pods: rollout.py steers reconnecting clients to updated pods)
        "selector": {**selector_labels(fleet_name), L_SERVING: "true"},
        "ports": [port],
    }
    if own is not None:
        if own.nodePort is not None:
            port["nodePort"] = own.nodePort
        if own.loadBalancerIP is not None:
            svc["loadBalancerIP"] = own.loadBalancerIP
        if own.loadBalancerSourceRanges:
            svc["loadBalancerSourceRanges"] = list(own.loadBalancerSourceRanges)
        if own.externalTrafficPolicy is not None:
            svc["externalTrafficPolicy"] = own.externalTrafficPolicy
    return {"spec": svc}


def pdb(fleet: dict[str, Any], name: str | None = None, component: str = "broker") -> dict[str, Any]:
    """At most one pod of a kind down at a time by choice (drains, upgrades): brokers, Redis, sentinels."""
    fleet_name = fleet["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(fleet, name or names(fleet_name)["pdb"], component),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(fleet_name, component)}},
    }


def servicemonitor(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    """The brokers' scrape config for the Prometheus Operator: the user's labels let a Prometheus'
    serviceMonitorSelector (kube-prometheus-stack: release=<name>) pick it up, and the namespaceSelector
    names the fleet's namespace so no Prometheus setting widens it to Services of other namespaces."""
    name = fleet["metadata"]["name"]
    metrics = spec.metrics
    meta = _meta(fleet, names(name)["monitor"])
    meta["labels"] = {**metrics.serviceMonitorLabels, **meta["labels"]}  # (the model refuses its own keys)
    endpoint = {"port": "metrics", "path": "/metrics", "interval": metrics.interval}
    if metrics.scrapeTimeout:
        endpoint["scrapeTimeout"] = metrics.scrapeTimeout
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {**selector_labels(name), "fleetmq.io/service": "headless"}},
            "namespaceSelector": {"matchNames": [meta["namespace"]]},
            "endpoints": [endpoint],
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
POD_NAME_ENV = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def restricted_pod(uid: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# ------------------------------------------------------------------------------------ the managed Redis
# Servers, sentinels and the Job forming a Redis Cluster all run redis.sh (the ConfigMap <fleet>-redis-scripts)
# from the Redis image, with the password from the Secret <fleet>-redis-auth (created once by the operator)
# as a file. Servers keep their append-only file (and a cluster node its nodes.conf) on a claim of their own.
def quantity_bytes(quantity: int | str) -> int | None:
    """Bytes of a Kubernetes memory quantity ("256Mi", "1G", "1e9", 1024); None if it is not one."""
    text = str(quantity).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip
    for suffix, factor in units.items():
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)], factor
            break
    else:
        scale = 1
    try:
        return int(float(text) * scale)
    except ValueError:
        return None


def redis_auth_secret(fleet: dict[str, Any], password: str) -> dict[str, Any]:
    """The managed Redis' password: created once (the operator never applies it again), owned by the fleet."""
    meta = _meta(fleet, names(fleet["metadata"]["name"])["redis_auth"], "redis")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {PASSWORD_KEY: password}}  # fmt: skip


def _env(**values: str | int) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def _exec_probe(command: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "exec": {"command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", command]},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _redis_volumes(fleet_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What every managed Redis container mounts: the script, the password, a private dir for configs."""
    n = names(fleet_name)
    volumes: list[dict[str, Any]] = [
        {"name": "scripts", "configMap": {"name": n["redis_scripts"], "defaultMode": 0o555}},
        {"name": "auth", "secret": {"secretName": n["redis_auth"], "defaultMode": 0o440}},
        {"name": "conf", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True},
        {"name": "auth", "mountPath": REDIS_SECRET_DIR, "readOnly": True},
        {"name": "conf", "mountPath": "/conf"},
    ]
    return volumes, mounts


def _redis_pod_template(
    fleet: dict[str, Any], spec: BrokerFleetSpec, component: str, container: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A pod of the managed Redis: restricted, spread over nodes, with the script, password and conf dir,
    and what redis.pod (for sentinels redis.sentinelPod, if set) adds."""
    fleet_name = fleet["metadata"]["name"]
    redis = spec.redis
    tpl, where = redis.pod, "spec.redis.pod"
    if component == "redis-sentinel" and redis.sentinelPod is not None:
        tpl, where = redis.sentinelPod, "spec.redis.sentinelPod"
    volumes, mounts = _redis_volumes(fleet_name)
    container = {
        **container,
        "image": spec.redis.image,
        "volumeMounts": [*mounts, *container.get("volumeMounts", [])],
        "securityContext": RESTRICTED_CONTAINER,
    }
    pod = {
        "automountServiceAccountToken": False,
        # the image's own redis user: its entrypoint is not used, redis.sh execs redis-server
        "securityContext": restricted_pod(REDIS_UID),
        "containers": [container],
        "volumes": [*volumes, *extra.pop("volumes", [])],
        **extra,
    }
    return pod_template(
        fleet_name,
        component,
        redis.scheduling,
        tpl,
        where,
        {"labels": labels(fleet_name, component)},
        pod,
        sidecars=component != "redis-setup",
    )


def _redis_statefulset(
    fleet: dict[str, Any], name: str, component: str, replicas: int, template: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    fleet_name = fleet["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(fleet, name, component),
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": selector_labels(fleet_name, component)},
            "updateStrategy": {"type": "RollingUpdate"},  # one pod at a time, each waiting for readiness
            "template": template,
            **extra,
        },
    }


def _service(
    fleet: dict[str, Any], name: str, component: str, ports: dict[str, int], *, headless: bool
) -> dict[str, Any]:
    """A Service of the managed Redis; headless ones give every pod a DNS name before it is ready."""
    spec: dict[str, Any] = {
        "selector": selector_labels(fleet["metadata"]["name"], component),
        "ports": [{"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in ports.items()],
    }
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(fleet, name, component), "spec": spec}


def _server_env(fleet: dict[str, Any], spec: BrokerFleetSpec) -> list[dict[str, Any]]:
    """What redis.sh needs to start a server of this fleet (its own address comes from its pod name)."""
    meta = fleet["metadata"]
    fleet_name, ns = meta["name"], meta.get("namespace", "default")
    redis = spec.redis
    values: dict[str, str | int] = {
        "REDIS_MODE": redis.mode,
        "REDIS_PASSWORD_FILE": f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
        "REDIS_APPENDFSYNC": redis.appendfsync,
    }
    maxmemory = quantity_bytes(redis.resources.memory)
    if maxmemory:
        values["REDIS_MAXMEMORY"] = int(maxmemory * MAXMEMORY_SHARE)
    if redis.mode != "standalone":
        redis_name = names(fleet_name)["redis"]
        values["REDIS_SELF"] = f"$(POD_NAME).{redis_name}.{ns}.svc:{REDIS_PORT}"
        values["REDIS_NODES"] = " ".join(redis_addresses(fleet_name, ns, spec))
    if redis.mode == "sentinel":
        values |= {
            "SENTINEL_NODES": " ".join(sentinel_addresses(fleet_name, ns, spec)),
            "SENTINEL_MASTER": fleet_name,
        }
    return [POD_NAME_ENV, *_env(**values)]


def redis_servers(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    """The StatefulSet of the managed Redis servers, in every mode."""
    redis = spec.redis
    name = names(fleet["metadata"]["name"])["redis"]
    ports = [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}]
    if redis.mode == "cluster":
        ports.append({"name": "cluster-bus", "containerPort": REDIS_PORT + 10000, "protocol": "TCP"})
    ready = _exec_probe("ready", period=5, failures=2)
    if redis.mode == "cluster":  # its readiness also finds peers whose address changed (redis.sh heal)
        ready = _exec_probe("ready", period=10, failures=2, timeout=20)
    container: dict[str, Any] = {
        "name": "redis",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "server"],
        "env": _server_env(fleet, spec),
        "ports": ports,
        "resources": redis.resources.requirements(),
        "startupProbe": _exec_probe("live", period=5, failures=120),  # a large append-only file loads first
        "livenessProbe": _exec_probe("live", period=10, failures=6),
        "readinessProbe": ready,
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    extra: dict[str, Any] = {}
    if redis.mode == "sentinel":
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "prestop"]}}
        }
        extra["terminationGracePeriodSeconds"] = 40  # the handover takes up to 20 s
    sts_extra: dict[str, Any] = {}
    if redis.mode != "standalone":  # a cluster forms only once every node runs; replicas need not wait
        sts_extra["podManagementPolicy"] = "Parallel"
    if redis.storage:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": redis.storage}},
        }
        if redis.storageClassName:
            claim["storageClassName"] = redis.storageClassName
        meta = {"name": "data", "labels": labels(fleet["metadata"]["name"], "redis")}
        sts_extra["volumeClaimTemplates"] = [{"metadata": meta, "spec": claim}]
        # the data goes with the fleet (its StatefulSet is deleted with it), not with a pod or a scale-down
        sts_extra["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    else:
        extra["volumes"] = [{"name": "data", "emptyDir": {}}]
    template = _redis_pod_template(fleet, spec, "redis", container, **extra)
    sts = _redis_statefulset(fleet, name, "redis", redis_pods(spec.redis), template, **sts_extra)
    sts["metadata"]["labels"][L_REDIS_MODE] = redis.mode
    return sts


def check_redis_topology(spec: BrokerFleetSpec, existing: dict[str, Any] | None) -> None:
    """RenderError, applying nothing, when the managed Redis' StatefulSet holds data of another topology
    (one an earlier operator made, a single server without this label): the running fleet is left as it
    is rather than half turned into a topology its sessions are not in."""
    if existing is None or not spec.redis.managed:
        return
    found = (existing["metadata"].get("labels") or {}).get(L_REDIS_MODE)
    if found != spec.redis.mode:
        was = f"mode {found}" if found else "a single server (made before redis.mode existed)"
        raise RenderError(
            f"redis.mode: StatefulSet {existing['metadata']['name']} runs {was}, not mode {spec.redis.mode}: "
            "sessions are not moved between Redis topologies; the fleet keeps running as it is; delete the "
            "BrokerFleet and create it again for the new topology"
        )


def redis_sentinels(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    """The sentinels: pods of their own, so a failing Redis node never takes a sentinel's vote with it and
    their number (odd) is independent of the servers'."""
    meta = fleet["metadata"]
    fleet_name, ns = meta["name"], meta.get("namespace", "default")
    name = names(fleet_name)["sentinel"]
    env = [
        POD_NAME_ENV,
        *_env(
            REDIS_PASSWORD_FILE=f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
            SENTINEL_SELF=f"$(POD_NAME).{name}.{ns}.svc:{SENTINEL_PORT}",
            SENTINEL_NODES=" ".join(sentinel_addresses(fleet_name, ns, spec)),
            SENTINEL_MASTER=fleet_name,
            REDIS_NODES=" ".join(redis_addresses(fleet_name, ns, spec)),
        ),
    ]
    container = {
        "name": "sentinel",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "sentinel"],
        "env": env,
        "ports": [{"name": "sentinel", "containerPort": SENTINEL_PORT, "protocol": "TCP"}],
        "resources": spec.redis.sentinelResources.requirements(),
        "livenessProbe": _exec_probe("sentinel-live", period=10, failures=6),
        "readinessProbe": _exec_probe("sentinel-ready", period=5, failures=2),
    }
    template = _redis_pod_template(fleet, spec, "redis-sentinel", container)
    return _redis_statefulset(
        fleet, name, "redis-sentinel", spec.redis.sentinels, template, podManagementPolicy="Parallel"
    )


def cluster_create_job(fleet: dict[str, Any], spec: BrokerFleetSpec) -> dict[str, Any]:
    """The Job that forms the Redis Cluster once all its nodes answer (redis.sh cluster-create: nothing to
    do when it is formed). Named after its template, so a changed one (a new image) is a new Job."""
    meta = fleet["metadata"]
    fleet_name, ns = meta["name"], meta.get("namespace", "default")
    container = {
        "name": "create",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "cluster-create"],
        "env": _env(
            REDIS_PASSWORD_FILE=f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
            REDIS_NODES=" ".join(redis_addresses(fleet_name, ns, spec)),
            CLUSTER_REPLICAS=spec.redis.replicas_per_primary,
        ),
        "resources": spec.redis.setupResources.requirements(),
    }
    template = _redis_pod_template(fleet, spec, "redis-setup", container, restartPolicy="OnFailure")
    name = dns_name(fleet_name, "redis-cluster", _digest(template)[:8])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(fleet, name, "redis-setup"),
        "spec": {"backoffLimit": 20, "template": template},
    }


def redis_manifests(fleet: dict[str, Any], spec: BrokerFleetSpec) -> list[dict[str, Any]]:
    """Everything of the managed Redis but its password Secret (see redis_auth_secret)."""
    fleet_name = fleet["metadata"]["name"]
    n = names(fleet_name)
    mode = spec.redis.mode
    ports = {"redis": REDIS_PORT} | ({"cluster-bus": REDIS_PORT + 10000} if mode == "cluster" else {})
    scripts = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(fleet, n["redis_scripts"], "redis"),
               "data": {SCRIPT: SCRIPT_TEXT}}  # fmt: skip
    out = [
        scripts,
        redis_servers(fleet, spec),
        _service(fleet, n["redis"], "redis", ports, headless=mode != "standalone"),
        pdb(fleet, n["redis"], "redis"),
    ]
    if mode == "sentinel":
        out += [
            redis_sentinels(fleet, spec),
            _service(fleet, n["sentinel"], "redis-sentinel", {"sentinel": SENTINEL_PORT}, headless=True),
            pdb(fleet, n["sentinel"], "redis-sentinel"),
        ]
    elif mode == "cluster":
        out.append(cluster_create_job(fleet, spec))
    return out


STORE_COMPONENTS = ("redis", "redis-sentinel", "redis-setup")


def store_workloads(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The managed Redis' StatefulSets and Job among rendered manifests."""
    return [
        m
        for m in manifests
        if m["kind"] in ("StatefulSet", "Job")
        and m["metadata"]["labels"].get(L_COMPONENT) in STORE_COMPONENTS
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


def applied_bridges(config_map_obj: dict[str, Any] | None) -> dict[str, Bridge]:
    """The bridges in a rendered ConfigMap, as MqttBridge specs, so a paused or broken bridge keeps running."""
    try:
        specs = json.loads(
            ((config_map_obj or {}).get("metadata") or {}).get("annotations", {}).get(A_BRIDGE_SPECS, "{}")
        )
        return {
            name: Bridge(name, int(gen), MqttBridgeSpec.model_validate(spec))
            for name, (gen, spec) in specs.items()
        }
    except (ValidationError, ValueError, TypeError):
        return {}


def user_history(config_map_obj: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    try:
        value = json.loads(
            ((config_map_obj or {}).get("metadata") or {}).get("annotations", {}).get(A_USER_HISTORY, "{}")
        )
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def history(config_map_obj: dict[str, Any] | None) -> dict[str, dict[str, int]]:
    if not config_map_obj:
        return {}
    try:
        value = json.loads(config_map_obj["metadata"].get("annotations", {}).get(A_HISTORY, "{}"))
    except (ValueError, KeyError):
        return {}
    return value if isinstance(value, dict) else {}
