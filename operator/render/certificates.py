"""The certificates a fleet needs (its listeners' with `tls`, its MqttUsers' of type tls) and the objects
that hold them: cert-manager Certificates where an issuer is named, Secrets the operator signs with the
fleet's CA otherwise."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from ..crds import API_VERSION, ListenerSpec
from ..crds.certificate import IssuerRef, Validity, certificate_duration
from ..pki import MAX_COMMON_NAME, KeyPair, Wanted
from .common import Fleet, dns_name, labels, names, object_meta, owner_reference
from .select import User, Zone

CA_KEYS = ("tls.crt", "tls.key")
L_CERTIFICATE = "fleetmq.io/certificate"  # on what the operator issues: "listener" or "user"
CLUSTER_DOMAIN = "cluster.local"
CERT_MANAGER = "cert-manager.io/v1"


@dataclass(frozen=True)
class Needed:
    """One certificate a fleet needs, and where it goes."""

    secret: str
    wanted: Wanted
    validity: Validity
    issuer: IssuerRef | None  # None: the fleet's CA
    owner: dict[str, Any]  # the ownerReference of its Secret (or Certificate)
    kind: str  # "listener" or "user"
    zone: str | None = None  # of a listener's
    user: str | None = None  # of a user's (the MqttUser's name)


def listener_secret(zone: str, lst: ListenerSpec) -> str | None:
    """The Secret holding a listener's certificate: the one it names, or the one the operator fills."""
    if lst.tlsSecretRef is not None:
        return lst.tlsSecretRef.name
    return dns_name(zone, lst.name, "tls") if lst.tls is not None else None


def user_secret(user: str) -> str:
    return dns_name(user, "tls")


def ca_secret_name(fleet: str) -> str:
    return dns_name(fleet, "ca")


def listener_dns_names(fleet: Fleet, zone: str, lst: ListenerSpec) -> tuple[str, ...]:
    """What clients reach a listener by: its Service, and each pod through the headless Service, in every
    form the cluster's DNS answers; then the spec's own names."""
    ns = fleet.namespace
    service = dns_name(fleet.name, zone, lst.name)
    headless = names(fleet.name)["headless"]
    out = [service, f"{service}.{ns}", f"{service}.{ns}.svc", f"{service}.{ns}.svc.{CLUSTER_DOMAIN}"]
    out += [f"*.{headless}.{ns}.svc", f"*.{headless}.{ns}.svc.{CLUSTER_DOMAIN}"]
    assert lst.tls is not None
    out += [n for n in lst.tls.dnsNames if n not in out]
    return tuple(out)


def user_issuer(user: User, zones: list[Zone]) -> tuple[IssuerRef | None, str | None]:
    """The issuer of a user's client certificate: that of its zones' verifying listeners with tls, which
    check client certificates against its CA (none: the fleet's CA). Second: a conflict, if they differ."""
    issuers = {
        lst.tls.issuer.model_dump_json() if lst.tls.issuer else "": lst.tls.issuer
        for z in zones
        if z.name in user.zones
        for lst in z.spec.listeners
        if lst.tls is not None and lst.verify_peer
    }
    if len(issuers) > 1:
        named = ", ".join(sorted(f"{i.kind} {i.name}" if i else "the fleet's CA" for i in issuers.values()))
        return None, f"its zones' verifying listeners get their certificates from different issuers: {named}"
    return next(iter(issuers.values()), None), None


def _owner(kind: str, obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    meta = obj["metadata"]
    return {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"], "uid": meta["uid"]}


def needed(
    fleet: Fleet,
    zones: list[Zone],
    users: list[User],
    zone_objs: dict[str, dict[str, Any]],
    user_objs: dict[str, dict[str, Any]],
) -> tuple[list[Needed], dict[str, str]]:
    """The certificates of a fleet's accepted zones and users, and the users that cannot get one (why).
    Each is owned by its MqttZone or MqttUser: deleted with it (the operator may not delete Secrets)."""
    fleet_owner = owner_reference(fleet)
    out: list[Needed] = []
    problems: dict[str, str] = {}
    for zone in zones:
        for lst in zone.spec.listeners:
            if lst.tls is None:
                continue
            secret = listener_secret(zone.name, lst)
            assert secret is not None
            dns = listener_dns_names(fleet, zone.name, lst)
            wanted = Wanted(dns[0], "server", lst.tls.duration, lst.tls.renew_before, dns)
            owner = _owner("MqttZone", zone_objs.get(zone.name)) or fleet_owner
            out.append(Needed(secret, wanted, lst.tls, lst.tls.issuer, owner, "listener", zone=zone.name))
    for user in users:
        cn = user.spec.common_name(user.username)
        if user.spec.type != "tls" or cn is None:
            continue
        issuer, problem = user_issuer(user, zones)
        if len(cn) > MAX_COMMON_NAME:
            problem = (
                f"a certificate's common name has at most {MAX_COMMON_NAME} characters: {cn!r} has {len(cn)}"
            )
            problem += "; set certificateCommonName"
        if problem is not None:
            problems[user.name] = problem
            continue
        owner = _owner("MqttUser", user_objs.get(user.name)) or fleet_owner
        validity = user.spec.tls or Validity()
        wanted = Wanted(cn, "client", validity.duration, validity.renew_before)
        out.append(Needed(user_secret(user.name), wanted, validity, issuer, owner, "user", user=user.name))
    return out, problems


def _meta(fleet: Fleet, name: str, need: Needed) -> dict[str, Any]:
    meta = object_meta(fleet, name, **{L_CERTIFICATE: need.kind})
    meta["ownerReferences"] = [need.owner]
    return meta


def certificate(fleet: Fleet, need: Needed) -> dict[str, Any]:
    """The cert-manager Certificate of a needed certificate with an issuer: cert-manager writes its
    Secret (labelled like the operator's own, so pruning and the pods find it) and renews it."""
    assert need.issuer is not None
    wanted = need.wanted
    usage = "server auth" if wanted.usage == "server" else "client auth"
    spec: dict[str, Any] = {
        "secretName": need.secret,
        "issuerRef": need.issuer.model_dump(),
        "commonName": wanted.common_name,
        **certificate_duration(need.validity),
        "usages": ["digital signature", "key encipherment", usage],
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "secretTemplate": {"labels": labels(fleet.name, **{L_CERTIFICATE: need.kind})},
    }
    if wanted.dns_names:
        spec["dnsNames"] = list(wanted.dns_names)
    return {"apiVersion": CERT_MANAGER, "kind": "Certificate", "metadata": _meta(fleet, need.secret, need),
            "spec": spec}  # fmt: skip


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def issued_secret(fleet: Fleet, need: Needed, pair: KeyPair, ca: KeyPair) -> dict[str, Any]:
    """A kubernetes.io/tls Secret with a certificate the fleet's CA signed, and that CA as ca.crt."""
    data = {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem), "ca.crt": _b64(ca.cert_pem)}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(fleet, need.secret, need),
            "type": "kubernetes.io/tls", "data": data}  # fmt: skip


def ca_secret(fleet: Fleet, ca: KeyPair) -> dict[str, Any]:
    """The fleet's CA: made once, owned by the fleet; deleting it makes a new CA and new certificates."""
    meta = object_meta(fleet, ca_secret_name(fleet.name), **{L_CERTIFICATE: "ca"})
    data = {"tls.crt": _b64(ca.cert_pem), "tls.key": _b64(ca.key_pem)}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "kubernetes.io/tls", "data": data}


def key_pair(secret: dict[str, Any] | None, keys: tuple[str, str] = CA_KEYS) -> KeyPair | None:
    """The certificate and key a Secret holds (None: missing or not base64)."""
    data = (secret or {}).get("data") or {}
    try:
        return KeyPair(base64.b64decode(data[keys[0]]), base64.b64decode(data[keys[1]]))
    except (KeyError, ValueError):
        return None


def hold_back(
    zones: list[Zone], missing: dict[str, str], last_applied: dict[str, Zone]
) -> tuple[list[Zone], dict[str, str]]:
    """The zones to render while some certificates are not there yet: a zone with a listener whose Secret
    is missing keeps the version it applied before if that one needs none of them, else waits; second:
    why, by zone."""
    if not missing:
        return zones, {}

    def pending(zone: Zone) -> list[str]:
        return [
            f"listener {lst.name}: {missing[secret]}"
            for lst in zone.spec.listeners
            if (secret := listener_secret(zone.name, lst)) in missing
        ]

    out: list[Zone] = []
    held: dict[str, str] = {}
    for zone in zones:
        why = pending(zone)
        if not why:
            out.append(zone)
            continue
        held[zone.name] = "; ".join(why)
        before = last_applied.get(zone.name)
        if before is not None and not pending(before):
            out.append(before)
    return out, held
