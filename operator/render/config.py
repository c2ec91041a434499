"""The broker config file (snake_case, the docs/design.md contract): rendered from the fleet and what it
serves, put in the fleet's ConfigMap with annotations saying what it holds, and read back from it.

Everything a broker applies live (zones, ACLs, users, listeners, bridges) lives only there, so changing
it never changes the pod template; what a broker reads only at start is hashed (restart_hash) into it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import Any, cast

import yaml
from fleetmq.broker.config import BrokerConfig, format_validation_error
from pydantic import BaseModel, ValidationError

from ..crds import BrokerFleetSpec, MqttBridgeSpec, MqttZoneSpec
from ..crds.zone import JWT_FILES, KeyRef
from .certificates import listener_secret
from .common import (
    API_KEYS_DIR,
    API_KEYS_FILE,
    BRIDGE_SECRETS_DIR,
    CONFIG_DIR,
    CONFIG_KEY,
    PASSWORD_KEY,
    REDIS_AUTH_DIR,
    REDIS_PORT,
    SENTINEL_AUTH_DIR,
    Fleet,
    RenderError,
    names,
    object_meta,
    redis_addresses,
    sentinel_addresses,
    short_digest,
)
from .select import Bridge, User, Zone, user_files, zone_user_settings

A_CONFIG_HASH = "fleetmq.io/config-hash"
A_ZONE_GENERATIONS = "fleetmq.io/zone-generations"
A_HISTORY = "fleetmq.io/config-history"
A_ZONE_SPECS = "fleetmq.io/zone-specs"
A_BRIDGE_SPECS = "fleetmq.io/bridge-specs"  # name -> [generation, MqttBridge spec] of the bridges rendered
A_USER_HISTORY = "fleetmq.io/user-history"  # config hash -> {MqttUser: User.token} of the users it held
HISTORY_LEN = 16
#: seconds a broker keeps in hand at the end of its grace period (committing, closing) after evicting
SHUTDOWN_MARGIN = 5


def tls_dir(secret: str) -> str:
    return f"{CONFIG_DIR}/tls/{secret}"


def users_dir(zone: str) -> str:
    return f"{CONFIG_DIR}/users/{zone}"


def authn_files(zone: Zone) -> list[tuple[str, str, KeyRef, str]]:
    """Every file the zone's authentication chain reads: (volume kind Secret or ConfigMap, the directory
    it is mounted at, the key reference, the broker config field it goes to, e.g. "0.jwks_file" or
    "1.header_files.X-Api-Key")."""
    out = []
    for i, a in enumerate(zone.spec.authentication.chain):
        if a.mechanism == "jwt":
            for field, (attr, kind) in JWT_FILES.items():
                ref = getattr(a, attr)
                if ref is not None:
                    out.append((kind, f"{CONFIG_DIR}/authn/{zone.name}/{i}/{attr}", ref, f"{i}.{field}"))
        else:
            for n, (header, ref) in enumerate(sorted((a.headerSecretRefs or {}).items())):
                out.append(("Secret", f"{CONFIG_DIR}/authn/{zone.name}/{i}/header-{n}", ref,
                            f"{i}.header_files.{header}"))  # fmt: skip
    return out


def authentication(zone: Zone) -> list[dict[str, Any]]:
    """The zone's chain as the broker config has it: the CRD's fields in snake_case, its references as
    the files they are mounted at (authn_files)."""
    chain = [a.broker() for a in zone.spec.authentication.chain]
    for _kind, directory, ref, target in authn_files(zone):
        i, field, *header = target.split(".", 2)
        if header:
            chain[int(i)].setdefault(field, {})[header[0]] = f"{directory}/{ref.key}"
        else:
            chain[int(i)][field] = f"{directory}/{ref.key}"
    return chain


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
    fleet: Fleet,
    zones: list[Zone],
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    bridge_files: Collection[str] = (),
    users: list[User] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """The broker config file (snake_case, the docs/design.md contract) of a fleet, its zones, bridges and
    users."""
    files = user_files(zones, users)
    spec = fleet.spec
    zone_cfg: dict[str, Any] = {}
    listeners: list[dict[str, Any]] = []
    for zone in zones:
        users_ref = zone.spec.authentication.usersSecretRef
        users_file = f"{users_dir(zone.name)}/{users_ref.key}" if users_ref else None
        zone_cfg[zone.name] = zone.spec.zone_settings(
            users_file, authentication=authentication(zone), **zone_user_settings(zone, users, files)
        ).model_dump(mode="json", by_alias=True)
        for lst in zone.spec.listeners:
            entry: dict[str, Any] = {
                "name": listener_name(zone.name, lst.name),
                "zone": zone.name,
                "bind": f"0.0.0.0:{lst.port}",
                "protocol": lst.protocol,
            }
            if lst.protocol in ("ws", "wss"):
                entry["path"] = lst.path
            if lst.proxy_protocol:
                entry |= {"proxy_protocol": True, "proxy_protocol_timeout": lst.proxy_protocol_timeout}
            if (secret := listener_secret(zone.name, lst)) is not None:
                base = tls_dir(secret)
                entry |= {"certfile": f"{base}/tls.crt", "keyfile": f"{base}/tls.key"}
                if lst.verify_peer:
                    entry |= {"cafile": f"{base}/ca.crt", "verify_peer": True}
                    if lst.peer_cert_as_username is not None:
                        entry["peer_cert_as_username"] = lst.peer_cert_as_username
            listeners.append(entry)
    return {
        "store": store_config(fleet.name, fleet.namespace, spec),
        "zones": zone_cfg,
        "listeners": listeners,
        "metrics": {"bind": f"0.0.0.0:{spec.metrics.port}"},
        **api_config(spec),
        # the streams are fmq:eventlog:<fleet>:{<tag>} in the fleet's Redis, where the pipeline reads them
        "event_log": {**cast(BaseModel, spec.eventLog).model_dump(mode="json"), "fleet": fleet.name},
        "bridges": [bridge_config(b, bridge_files) for b in bridges],
        "shutdown": {
            "eviction_rate": spec.evictionRate,
            "timeout": max(1, spec.terminationGracePeriodSeconds - SHUTDOWN_MARGIN),
        },
    }


def api_config(spec: BrokerFleetSpec) -> dict[str, Any]:
    """The config's `api` section when spec.api is on (the keys file is mounted: render.broker)."""
    if not spec.api.enabled:
        return {}
    return {"api": {"bind": f"0.0.0.0:{spec.api.port}", "keys_file": f"{API_KEYS_DIR}/{API_KEYS_FILE}"}}


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
    if "api" in config:  # (a node opens its API at start; keyed so that fleets without one keep their hash)
        start_only["api"] = config["api"]
    if redis_password:
        start_only["password"] = hashlib.sha256(redis_password.encode()).hexdigest()
    return short_digest(start_only)


def config_map(
    fleet: Fleet,
    config: dict[str, Any],
    digest: str,
    zones: list[Zone],
    history: dict[str, dict[str, int]],
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    user_history: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The config file, plus annotations saying which zone and bridge generations (and specs) it holds,
    and which version of each MqttUser."""
    meta = object_meta(fleet, names(fleet.name)["config"])
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
