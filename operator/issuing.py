"""Getting a fleet's certificates, each reconciliation: the listeners' with `tls` and the client
certificates of MqttUsers of type tls (render.certificates says which).

With a cert-manager issuer the operator writes a Certificate and waits for cert-manager to fill its Secret;
without one it signs them itself with the fleet's CA (pki), renewing each `renewBefore` its end. Secrets
and Certificates no longer needed are deleted. A listener whose certificate is not there yet is held
back by the caller (the zone keeps what it applied before), since a pod cannot mount a missing Secret.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import pki
from .kube import ApiError, Kube
from .render import Fleet
from .render.certificates import (
    CERT_MANAGER,
    L_CERTIFICATE,
    Needed,
    ca_secret,
    ca_secret_name,
    certificate,
    issued_secret,
    key_pair,
    needed,
)
from .render.common import L_FLEET, L_MANAGED, MANAGER
from .render.select import User, Zone

log = logging.getLogger("fleetmq.operator.issuing")

#: (object, reason, message) -> records a Kubernetes Event
EventSink = Callable[[dict[str, Any], str, str], Awaitable[None]]


@dataclass
class Issued:
    """What a reconciliation got: which Secrets are not there yet (why), which users cannot have a
    certificate (why), and when the next renewal falls due (None: none the operator does itself)."""

    missing: dict[str, str] = field(default_factory=dict)
    user_problems: dict[str, str] = field(default_factory=dict)
    next_due: dt.datetime | None = None


class Issuer:
    def __init__(self, kube: Kube, event: EventSink) -> None:
        self.kube = kube
        self._event = event

    async def reconcile(
        self,
        fleet: Fleet,
        zones: list[Zone],
        users: list[User],
        zone_objs: dict[str, dict[str, Any]],
        user_objs: dict[str, dict[str, Any]],
        now: dt.datetime | None = None,
    ) -> Issued:
        now = now or dt.datetime.now(dt.UTC)
        needs, problems = needed(fleet, zones, users, zone_objs, user_objs)
        out = Issued(user_problems=problems)
        own = [n for n in needs if n.issuer is None]
        if own:
            ca = await self._ca(fleet, now)
            for need in own:
                try:
                    due = await self._own(fleet, need, ca, now, user_objs)
                except (ApiError, ValueError) as e:  # this one waits (its zone held back), the others go on
                    log.warning("%s/%s: cannot issue %s: %s", fleet.namespace, fleet.name, need.secret, e)
                    out.missing[need.secret] = f"cannot issue it: {e}"
                    if need.user is not None:
                        out.user_problems[need.user] = f"cannot issue its certificate: {e}"
                    continue
                out.next_due = due if out.next_due is None else min(out.next_due, due)
        managed = [n for n in needs if n.issuer is not None]
        has_kind = await self.kube.has_kind(CERT_MANAGER, "Certificate")
        for need in managed:
            out.missing |= await self._managed(fleet, need, has_kind)
        if has_kind:
            await self._prune(fleet, {n.secret for n in managed})
        return out

    async def _ca(self, fleet: Fleet, now: dt.datetime) -> pki.KeyPair:
        """The fleet's CA: its Secret as it is, or made once."""
        name = ca_secret_name(fleet.name)
        pair = key_pair(await self.kube.get("Secret", fleet.namespace, name))
        if pair is not None:
            return pair
        pair = pki.new_ca(pki.short_name(f"fleetmq CA {fleet.namespace}/{fleet.name}"), now)
        try:
            await self.kube.create(ca_secret(fleet, pair))
        except ApiError as e:
            if e.status != 409:
                raise
            made = key_pair(await self.kube.get("Secret", fleet.namespace, name))  # made meanwhile
            if made is None:
                raise
            return made
        await self._event(fleet.obj, "Created", f"Created Secret {name}: the fleet's CA")
        return pair

    async def _own(
        self,
        fleet: Fleet,
        need: Needed,
        ca: pki.KeyPair,
        now: dt.datetime,
        user_objs: dict[str, dict[str, Any]],
    ) -> dt.datetime:
        """Issue or renew a certificate the fleet's CA signs; returns when it is due next."""
        secret = await self.kube.get("Secret", fleet.namespace, need.secret)
        pair = key_pair(secret, ("tls.crt", "tls.key"))
        ca_pem = base64.b64decode(((secret or {}).get("data") or {}).get("ca.crt", ""))
        due = pki.renewal_due(pair.cert_pem if pair else None, ca, need.wanted, now)
        if due > now and ca_pem == ca.cert_pem:
            return due
        fresh = pki.issue(ca, need.wanted, now)
        await self.kube.apply(issued_secret(fleet, need, fresh, ca), MANAGER)
        end = pki.not_after(fresh.cert_pem)
        verb = "Issued" if pair is None else "Renewed"
        what = f"{verb} certificate {need.wanted.common_name!r} into Secret {need.secret}, valid until {end}"
        owner = user_objs.get(need.user) if need.user is not None else fleet.obj
        await self._event(owner or fleet.obj, verb, what)
        log.info("%s/%s: %s", fleet.namespace, fleet.name, what)
        return pki.renewal_due(fresh.cert_pem, ca, need.wanted, now)

    async def _managed(self, fleet: Fleet, need: Needed, has_kind: bool) -> dict[str, str]:
        """Write the cert-manager Certificate; {secret: why} while its Secret is not there."""
        assert need.issuer is not None
        if not has_kind:
            return {need.secret: "tls.issuer needs cert-manager: the cluster serves no Certificate "
                    f"({CERT_MANAGER})"}  # fmt: skip
        try:
            await self.kube.apply(certificate(fleet, need), MANAGER)
        except ApiError as e:
            return {need.secret: f"Certificate {need.secret}: {e}"}
        secret = await self.kube.get("Secret", fleet.namespace, need.secret)
        if secret is not None and key_pair(secret, ("tls.crt", "tls.key")) is not None:
            await self._adopt(fleet, need, secret)
            return {}
        cert = await self.kube.get("Certificate", fleet.namespace, need.secret) or {}
        conditions: list[dict[str, Any]] = (cert.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        why = ready.get("message") or "not issued yet"
        return {need.secret: f"waiting for cert-manager to issue Certificate {need.secret}: {why}"}

    async def _adopt(self, fleet: Fleet, need: Needed, secret: dict[str, Any]) -> None:
        """Give cert-manager's Secret the owner its Certificate has (the MqttZone or MqttUser), so it goes
        with it as the fleet-CA ones do: by default cert-manager leaves a Secret, private key included,
        behind its deleted Certificate. (cert-manager keeps owner references that are not its own.)"""
        owners: list[dict[str, Any]] = secret["metadata"].get("ownerReferences") or []
        if any(o.get("uid") == need.owner["uid"] for o in owners):
            return
        try:
            await self.kube.patch_owners("Secret", fleet.namespace, need.secret, [*owners, need.owner])
        except ApiError as e:  # (the next pass tries again)
            log.warning("%s/%s: cannot own Secret %s: %s", fleet.namespace, fleet.name, need.secret, e)

    async def _prune(self, fleet: Fleet, wanted: set[str]) -> None:
        """Delete the fleet's cert-manager Certificates no longer needed. (Their Secrets, and those the
        fleet's CA signed, go with the MqttZone or MqttUser that owns them: the operator may not delete
        Secrets. A listener removed from a live zone leaves its Secret until then.)"""
        selector = f"{L_FLEET}={fleet.name},{L_MANAGED}={MANAGER},{L_CERTIFICATE} in (listener,user)"
        for obj in await self.kube.list("Certificate", fleet.namespace, selector):
            name = obj["metadata"]["name"]
            if name not in wanted and await self.kube.delete("Certificate", fleet.namespace, name):
                await self._event(fleet.obj, "Deleted", f"Deleted Certificate {name}: no longer needed")
