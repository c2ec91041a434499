"""MqttUser: an MQTT user of some zones of a fleet (password, own ACL rules, certificate name)."""

from __future__ import annotations

from typing import Annotated, Literal

from fleetmq.broker.zones import AclRule, UserQuota
from pydantic import ConfigDict, Field, model_validator

from .base import Condition, CrdModel, ObjectRef, SecretKeyRef, doc
from .certificate import Validity
from .derive import derive

#: a username the users file and the ACL's %u can carry: no ':' (the file's separator), no '/', '+', '#'
#: (a %u rule would reach other users' topics) and no spaces
USERNAME_PATTERN = r"^[^:/+#\s]+$"
ZONE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


_QuotasBase = derive(
    "QuotasBase",
    UserQuota,
    {"max_publish_rate": "maxPublishRate", "max_publish_bytes_rate": "maxPublishBytesRate",
     "max_subscriptions": "maxSubscriptions", "max_connections": "maxConnections"},
    "A user's quotas.",
)  # fmt: skip


class QuotasSpec(_QuotasBase):  # type: ignore[misc,valid-type]
    """The user's quotas in its zones, in place of each zone's limits of the same name (0: no limit).
    Beyond them MQTT 5 clients are refused with 0x97; MQTT 3 publishers are slowed down, losing nothing."""


class MqttUserSpec(CrdModel):
    """An MQTT user of some zones of a fleet: its password (from a Secret, or generated into one), its own
    ACL rules, and the common name of its client certificate. Applied live: no pod restarts."""

    fleetRef: ObjectRef = Field(description="The BrokerFleet (same namespace) whose zones the user is in.")
    type: Literal["password", "tls"] = Field(
        "password",
        description="password: clients authenticate with a password (and a certificate naming "
        "certificateCommonName). tls: the operator issues the user a client certificate into the Secret "
        "<name>-tls (tls.crt, tls.key, ca.crt), from the issuer of its zones' verifying listeners with tls "
        "(else the fleet's CA), whose common name is certificateCommonName (default: the username); "
        "renewed before it ends. Deleting the MqttUser revokes it: refused within seconds, connected "
        "clients disconnected (0x87).",
    )
    tls: Validity | None = Field(None, description="type tls: " + doc(Validity))
    zones: list[Annotated[str, Field(min_length=1, max_length=253, pattern=ZONE_NAME_PATTERN)]] = Field(
        min_length=1,
        max_length=64,
        description="MqttZones of the fleet (by name) where the user may connect.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    username: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        pattern=USERNAME_PATTERN,
        description="Username clients connect with (no ':', '/', '+', '#' or spaces). Default: the MqttUser's "
        "name.",
    )
    passwordSecretRef: SecretKeyRef | None = Field(
        None,
        description="Secret key (default 'password') holding the user's password. Default with "
        "generatePassword: the Secret <name>-credentials. A changed password is applied live.",
    )
    generatePassword: bool = Field(
        True,
        description="When the password Secret does not exist, the operator creates it with a random password "
        "(owned by this MqttUser, deleted with it, never changed afterwards). false: the Secret must exist; "
        "without passwordSecretRef the user has no password (certificate only).",
    )
    acl: list[AclRule] = Field(
        default_factory=list,
        max_length=256,
        description="This user's own rules, matched before the zone's acl (first match wins; %u and %c "
        "substituted).",
    )
    quotas: QuotasSpec | None = Field(None, description=doc(QuotasSpec))
    certificateCommonName: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Common name of the client certificate that authenticates as this user, on the zones' "
        "listeners with peerCertAsUsername: cn.",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.passwordSecretRef) || self.generatePassword || "
                    "has(self.certificateCommonName) || self.type == 'tls'",
                    "message": "a user needs a password (passwordSecretRef or generatePassword) or a "
                    "certificateCommonName",
                }
            ]
        },
    )

    @model_validator(mode="after")
    def _some_credential(self) -> MqttUserSpec:
        if (
            self.passwordSecretRef is None
            and not self.generatePassword
            and self.certificateCommonName is None
            and self.type != "tls"
        ):
            raise ValueError(
                "a user needs a password (passwordSecretRef or generatePassword) or a certificateCommonName"
            )
        return self

    def password_ref(self, name: str) -> SecretKeyRef | None:
        """Where the password is (None: certificate only; a user of type tls has a password only from
        passwordSecretRef)."""
        if self.passwordSecretRef is not None:
            return self.passwordSecretRef
        generated = self.generatePassword and self.type == "password"
        return SecretKeyRef(name=f"{name}-credentials") if generated else None

    def common_name(self, username: str) -> str | None:
        """The common name of the certificates that are this user."""
        if self.certificateCommonName is None and self.type == "tls":
            return username
        return self.certificateCommonName


class MqttUserStatus(CrdModel):
    """Observed state of the user."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    username: str | None = Field(None, description="The username clients connect with.")
    zones: list[str] = Field(default_factory=list, description="Zones the user is rendered into.")
    secretName: str | None = Field(None, description="Secret holding the password (none: certificate only).")
    podsApplied: int = Field(0, description="Broker pods running the config with this user as it is now.")
