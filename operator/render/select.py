"""Which MqttZones, MqttBridges and MqttUsers of a fleet go into its config, and why the others do not.

A bad edit never takes away what runs: an invalid or paused zone or bridge keeps the version last applied.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from fleetmq.broker.config import format_validation_error
from pydantic import ValidationError

from ..crds import MqttBridgeSpec, MqttUserSpec, MqttZoneSpec
from .common import USERS_SECRET_DIR, Fleet, paused, short_digest


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
        return f"{self.generation}:{short_digest(self.entry)}"


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


def _created(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("creationTimestamp") or "", meta.get("name", "")


def select_zones(
    fleet: Fleet,
    zone_objs: list[dict[str, Any]],
    last_applied: dict[str, Zone] | None = None,
) -> tuple[list[Zone], dict[str, Rejection]]:
    """Which zones of a fleet go into its config, and why the others do not.

    A zone that is invalid, collides with an earlier zone's port, or is paused keeps the version last
    applied (`last_applied`), so a bad edit never takes a running zone away; oldest zone wins a port.
    """
    last_applied = last_applied or {}
    taken: dict[int, str] = {fleet.spec.metrics.port: "the fleet's metrics port"}
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
            if (cn := spec.common_name(username)) is not None:
                wanted.append(("cn", cn, "CertificateConflict"))
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
    own rules and quotas, and the certificate common names that name them."""
    mine = [u for u in users if zone.name in u.zones]
    # a certificate is a user of the zone, or nobody: deleting an MqttUser revokes its certificate
    out: dict[str, Any] = {"certificate_users": "known"}
    if zone.name in files:
        out["users_files"] = [
            {
                "path": f"{USERS_SECRET_DIR}/{zone.name}",
                "sha256": hashlib.sha256(files[zone.name]).hexdigest(),
            }
        ]
    if acl := {u.username: [r.model_dump() for r in u.spec.acl] for u in mine if u.spec.acl}:
        out["user_acl"] = acl
    if certs := {cn: u.username for u in mine if (cn := u.spec.common_name(u.username)) is not None}:
        out["cert_users"] = certs
    if quotas := {u.username: u.spec.quotas.model_dump(exclude_none=True) for u in mine if u.spec.quotas}:
        out["user_quotas"] = quotas
    return out
