"""Everything the operator applies for a fleet, rendered in one pure call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..rollout import Shape
from .broker import statefulset
from .common import Fleet
from .config import HISTORY_LEN, broker_config, config_map, expected_hash, restart_hash
from .pods import pdb
from .redis import redis_manifests
from .secrets import bridge_secret, users_secret
from .select import Bridge, User, Zone, user_files
from .services import api_service, broker_network_policy, client_services, headless_service, servicemonitor


@dataclass
class Rendered:
    config: dict[str, Any]  # the broker config file (no node_id: each pod passes its own name)
    config_hash: str  # what every broker reports once it applied `config`
    zone_generations: dict[str, int]
    history: dict[str, dict[str, int]]  # config hash -> zone generations, newest last
    manifests: list[dict[str, Any]] = field(default_factory=list)
    user_history: dict[str, dict[str, str]] = field(default_factory=dict)  # hash -> {user: token}


def render(
    fleet: Fleet,
    zones: list[Zone],
    *,
    bridges: list[Bridge] = (),  # type: ignore[assignment]
    history: dict[str, dict[str, int]] | None = None,
    redis_password: str | None = None,
    service_monitor: bool = False,
    bridge_files: dict[str, str] | None = None,
    users: list[User] = (),  # type: ignore[assignment]
    user_history: dict[str, dict[str, str]] | None = None,
    shape: Shape | None = None,
    operator_namespace: str | None = None,
) -> Rendered:
    """Everything the operator applies for a fleet (raises RenderError, applying nothing, if invalid).

    bridge_files: the bridges' Secrets' files (bridge_secret_files), copied into the fleet's own bridge
    Secret, which every pod mounts: adding a bridge or rotating its credentials never changes the pods'
    template (kubelet brings the files within its sync period; a bridge reads them at each connection).
    users: the MqttUsers with their password hashes, into the fleet's users Secret (mounted always, too).
    shape: the broker StatefulSet's start ordinal, replicas and partition, by which the operator drives a
    rollout (rollout.plan). operator_namespace: where the operator's pods run (the managed Redis'
    NetworkPolicy admits them), None outside a cluster."""
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
    spec = fleet.spec
    # An existing Redis' password, changed in its Secret, takes new broker pods; the managed Redis' is
    # generated once and never changed by the operator (its servers read it only at start, too).
    hashed_password = None if spec.redis.managed else redis_password
    out.manifests = [
        config_map(fleet, config, digest, zones, hist, bridges, out.user_history),
        bridge_secret(fleet, bridge_files),
        users_secret(fleet, user_files(zones, users)),
        statefulset(fleet, zones, restart_hash(config, hashed_password), bridges, shape),
        headless_service(fleet),
        pdb(fleet),
        *client_services(fleet, zones),
    ]
    if (api := api_service(fleet)) is not None:
        out.manifests.append(api)
    if (policy := broker_network_policy(fleet, zones)) is not None:
        out.manifests.append(policy)
    if spec.redis.managed:
        out.manifests += redis_manifests(fleet, operator_namespace)
    if service_monitor and spec.metrics.serviceMonitor:
        out.manifests.append(servicemonitor(fleet))
    return out
