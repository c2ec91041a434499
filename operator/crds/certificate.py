"""Certificates the operator gets for a listener (its server certificate) or an MqttUser of type tls (its
client certificate): from a cert-manager issuer when one is named, else from the fleet's own CA."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from .base import CrdModel, doc
from .derive import CrdDuration

#: cert-manager's own bounds: it refuses a Certificate below them
MIN_DURATION = 3600.0
MIN_RENEW_BEFORE = 300.0
#: the operator's CA: short lives are allowed (tests, rotations drills), not absurd ones
MIN_OWN_DURATION = 300.0
MIN_OWN_RENEW_BEFORE = 60.0
DEFAULT_DURATION = 90 * 86400.0  # cert-manager's default


class IssuerRef(CrdModel):
    """A cert-manager issuer (an Issuer of the namespace, or a ClusterIssuer)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the issuer.")
    kind: str = Field("Issuer", min_length=1, description="Issuer or ClusterIssuer (or an external kind).")
    group: str = Field("cert-manager.io", min_length=1, description="API group of the issuer.")


class Validity(CrdModel):
    """How long a certificate the operator gets lives, and when it is renewed. A renewed certificate
    reaches the pods (or the user's Secret) without a restart, and open connections stay up."""

    duration: CrdDuration = Field(
        DEFAULT_DURATION,
        description="Validity of each certificate issued (at least 1h with a cert-manager issuer, 5m with "
        "the fleet's CA).",
        json_schema_extra={"default": "90d"},
    )
    renewBefore: CrdDuration | None = Field(
        None,
        description="How long before its end a certificate is renewed (default: a third of duration; at "
        "least 5m with a cert-manager issuer, 1m with the fleet's CA; less than duration).",
    )

    def _check(self, low: float, low_renew: float) -> None:
        if self.duration < low:
            raise ValueError(f"duration must be at least {low:g}s")
        if self.renewBefore is not None and not low_renew <= self.renewBefore < self.duration:
            raise ValueError(f"renewBefore must be at least {low_renew:g}s and less than duration")

    @model_validator(mode="after")
    def _bounds(self) -> Validity:
        self._check(MIN_OWN_DURATION, MIN_OWN_RENEW_BEFORE)
        return self

    @property
    def renew_before(self) -> float:
        return self.renewBefore if self.renewBefore is not None else self.duration / 3


class CertificateSpec(Validity):
    """A certificate the operator gets: without an issuer the fleet's own CA (the Secret <fleet>-ca, made
    once, valid 10 years) signs it; with one, the operator writes a cert-manager Certificate and
    cert-manager fills the Secret."""

    issuer: IssuerRef | None = Field(
        None, description=f"cert-manager issuer ({doc(IssuerRef)}). Default: the fleet's own CA."
    )

    @model_validator(mode="after")
    def _issuer_bounds(self) -> CertificateSpec:
        if self.issuer is not None:
            self._check(MIN_DURATION, MIN_RENEW_BEFORE)
        return self


class ListenerTlsSpec(CertificateSpec):
    """A server certificate the operator gets for a tls or wss listener, in the Secret
    <zone>-<listener>-tls (tls.crt, tls.key, ca.crt: verifyPeer checks client certificates against the
    same CA), naming the listener's Service and the fleet's pods."""

    dnsNames: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list,
        max_length=32,
        description="More DNS names for the certificate: the names clients use from outside the cluster.",
    )


def certificate_duration(spec: Validity) -> dict[str, Any]:
    """A cert-manager Certificate's duration and renewBefore (Go durations)."""
    return {"duration": f"{int(spec.duration)}s", "renewBefore": f"{int(spec.renew_before)}s"}
