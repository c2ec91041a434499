"""MqttZone: listeners bound to one set of session, keep-alive, limit and access settings, derived from
the broker's ZoneSettings and ListenerConfig."""

from __future__ import annotations

import copy
import json
from typing import Annotated, Any, Literal

from fleetmq.broker.config import ListenerConfig
from fleetmq.broker.zones import AclRule, HttpAuthentication, JwtAuthentication, ZoneSettings
from pydantic import ConfigDict, Field, create_model, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .base import Condition, CrdModel, ObjectRef, SecretRef, UsersSecretRef, cel, doc
from .certificate import ListenerTlsSpec
from .core import NetworkPolicyPeer
from .derive import derive, derived_field

# Where each ZoneSettings field lives in an MqttZone spec: group -> {broker field: camelCase name}.
SESSION_FIELDS = {
    "max_inflight": "maxInflight",
    "max_mqueue_len": "maxMqueueLen",
    "max_mqueue_bytes": "maxMqueueBytes",
    "mqueue_overflow": "mqueueOverflow",
    "mqueue_store_qos0": "mqueueStoreQos0",
    "retry_interval": "retryInterval",
    "retry_v5": "retryV5",
    "max_awaiting_rel": "maxAwaitingRel",
    "await_rel_timeout": "awaitRelTimeout",
    "session_expiry_interval": "sessionExpiryInterval",
}
KEEPALIVE_FIELDS = {
    "server_keepalive": "serverKeepalive",
    "keepalive_backoff": "backoff",
    "idle_timeout": "idleTimeout",
}
LIMITS_FIELDS = {
    "max_connections": "maxConnections",
    "max_conn_rate": "maxConnRate",
    "max_publish_rate": "maxPublishRate",
    "max_publish_bytes_rate": "maxPublishBytesRate",
    "max_subscriptions": "maxSubscriptions",
    "max_connections_per_user": "maxConnectionsPerUser",
    "max_packet_size": "maxPacketSize",
    "max_topic_alias": "maxTopicAlias",
    "max_clientid_len": "maxClientidLen",
    "receive_maximum": "receiveMaximum",
}
AUTH_FIELDS = {"allow_anonymous": "allowAnonymous"}
ACCESS_FIELDS = {"acl": "acl", "acl_default": "aclDefault"}
#: ZoneSettings fields an MqttZone does not set directly, and what sets them instead.
OPERATOR_SET_FIELDS = {
    "users_file": "authentication.usersSecretRef (mounted into the pods)",
    "users_files": "the MqttUsers of the zone (their passwords' hashes, in the fleet's users Secret)",
    "user_acl": "MqttUser acl",
    "cert_users": "MqttUser certificateCommonName",
    "certificate_users": "always known: a certificate names an MqttUser or a user of usersSecretRef",
    "user_quotas": "MqttUser quotas",
    "authentication": "authentication.chain (its Secrets and ConfigMaps mounted into the pods)",
}
ZONE_GROUPS = {
    "session": SESSION_FIELDS,
    "keepalive": KEEPALIVE_FIELDS,
    "limits": LIMITS_FIELDS,
    "authentication": AUTH_FIELDS,
}


SessionSpec = derive(
    "SessionSpec",
    ZoneSettings,
    SESSION_FIELDS,
    "Session settings: Inflight Window, Message Queue, retransmission, QoS2 and expiry. Applied live.",
)
KeepaliveSpec = derive(
    "KeepaliveSpec", ZoneSettings, KEEPALIVE_FIELDS, "Keep-alive settings. Applied live to new connections."
)
LimitsSpec = derive(
    "LimitsSpec", ZoneSettings, LIMITS_FIELDS, "Per-node and per-connection limits of the zone. Applied live."
)
_AuthBase = derive("AuthenticationBase", ZoneSettings, AUTH_FIELDS, "Who may connect.")


class KeyRef(CrdModel):
    """One key of a Secret or ConfigMap in the zone's namespace, mounted into the broker pods as a file."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object in this namespace.")
    key: str = Field(min_length=1, max_length=253, description="Key holding the content.")


JWT_FIELDS = {
    "mechanism": "mechanism",
    "from_": "from",
    "algorithms": "algorithms",
    "jwks_url": "jwksUrl",
    "jwks_refresh": "jwksRefresh",
    "jwks_refresh_min": "jwksRefreshMin",
    "verify_claims": "verifyClaims",
    "acl_claim": "aclClaim",
    "disconnect_after_expire": "disconnectAfterExpire",
    "leeway": "leeway",
}
#: JwtAuthentication's files, and the fields of a jwt authenticator that mount them (Secret or ConfigMap)
JWT_FILES = {"secret_file": ("secretRef", "Secret"), "public_key_file": ("publicKeyRef", "ConfigMap"),
             "jwks_file": ("jwksRef", "ConfigMap")}  # fmt: skip
HTTP_FIELDS = {
    "mechanism": "mechanism",
    "url": "url",
    "method": "method",
    "headers": "headers",
    "body": "body",
    "timeout": "timeout",
    "cache_ttl": "cacheTtl",
    "cache_size": "cacheSize",
    "acl_url": "aclUrl",
}


def _optional(fields: dict[str, tuple[Any, FieldInfo]], mechanism: str) -> dict[str, tuple[Any, FieldInfo]]:
    """Derived fields made optional with no default in the schema (the broker's applies), so an entry of
    the other mechanism does not get them filled in by the API server."""
    out = {}
    for name, (annotation, info) in fields.items():
        default = info.get_default(call_default_factory=True)
        shown = info.json_schema_extra.get("default") if isinstance(info.json_schema_extra, dict) else default
        described = f"({mechanism}) {info.description or ''}"
        if shown not in (None, PydanticUndefined) and shown != [] and shown != {}:
            described += f" Default: {json.dumps(shown)}."
        info = copy.copy(info)
        info.default, info.default_factory, info.json_schema_extra = None, None, None
        info.description = described
        out[name] = (annotation | None, info)
    return out


_JWT = {n: derived_field(JwtAuthentication, n, a) for n, a in JWT_FIELDS.items() if n != "mechanism"}
_HTTP = {n: derived_field(HttpAuthentication, n, a) for n, a in HTTP_FIELDS.items() if n != "mechanism"}
_AuthenticatorBase: type[CrdModel] = create_model(  # type: ignore[call-overload]
    "AuthenticatorBase", __base__=CrdModel, **_optional(_JWT, "jwt"), **_optional(_HTTP, "http")
)


class AuthenticatorSpec(_AuthenticatorBase):
    """One authenticator of a zone's chain (the broker's jwt or http authentication, in camelCase; its
    files from Secrets and ConfigMaps). One schema for both mechanisms: a CRD's schema cannot branch."""

    mechanism: Literal["jwt", "http"] = Field(
        description="jwt: a JSON Web Token in the CONNECT; http: the platform's authentication service."
    )
    secretRef: KeyRef | None = Field(
        None, description="(jwt) Secret key holding the HMAC secret of HS* tokens."
    )
    publicKeyRef: KeyRef | None = Field(None, description="(jwt) ConfigMap key holding the PEM public key.")
    jwksRef: KeyRef | None = Field(
        None,
        description="(jwt) ConfigMap key holding a JSON Web Key Set; an edit reaches the brokers without a "
        "restart.",
    )
    headerSecretRefs: dict[str, KeyRef] | None = Field(
        None,
        description="(http) Headers whose value is a Secret key (an API key), mounted into the brokers, never "
        "in the rendered config.",
    )

    model_config = cel(
        {"rule": "self.mechanism != 'http' || has(self.url)", "message": "http authenticators need url"},
        {
            "rule": "self.mechanism != 'jwt' || !has(self.algorithms) "
            "|| !self.algorithms.exists(a, a.startsWith('HS')) || has(self.secretRef)",
            "message": "HS* algorithms need secretRef",
        },
        {
            "rule": "self.mechanism != 'jwt' || (has(self.algorithms) && self.algorithms.all(a, a.startsWith('HS'))) "
            "|| has(self.publicKeyRef) || has(self.jwksRef) || has(self.jwksUrl)",
            "message": "RS*/ES* algorithms (the default) need publicKeyRef, jwksRef or jwksUrl",
        },
    )

    def broker(self) -> dict[str, Any]:
        """The broker config's entry, without the files (render.config puts the mounted paths in)."""
        names = JWT_FIELDS if self.mechanism == "jwt" else HTTP_FIELDS
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class AuthenticationSpec(_AuthBase):  # type: ignore[misc,valid-type]
    """Who may connect: anonymous clients, the users of a Secret (`fleetmq-broker passwd` format) and the
    zone's MqttUsers. Once a zone has users, a client giving a username must give its password."""

    usersSecretRef: UsersSecretRef | None = Field(
        None,
        description="Secret whose key (default 'users') holds the users file (salted hashes, one user a line, "
        "written by `fleetmq-broker passwd`). Mounted into the pods; edits reach the brokers live.",
    )
    chain: list[AuthenticatorSpec] = Field(
        default_factory=list,
        max_length=8,
        description="Authenticators tried in order at CONNECT (jwt, http); each allows, denies or passes to "
        "the next. When every one passes, the users Secret, MqttUsers and certificates decide. One that "
        "cannot answer denies (CONNACK 0x88).",
    )

    # (allowAnonymous: false without usersSecretRef was refused before MqttUsers: now the zone's users can
    # be MqttUsers, and without any no client connects)


_LISTENER_DERIVED = derive(
    "ListenerBase",
    ListenerConfig,
    {
        "protocol": "protocol",
        "path": "path",
        "verify_peer": "verifyPeer",
        "peer_cert_as_username": "peerCertAsUsername",
        "proxy_protocol": "proxyProtocol",
        "proxy_protocol_timeout": "proxyProtocolTimeout",
    },
    "A listener.",
    {
        "verify_peer": "Require a client certificate signed by the ca.crt of tlsSecretRef, or with tls by the "
        "CA that issued the listener's certificate (tls/wss only).",
        "peer_cert_as_username": "cn: a client with a verified certificate is authenticated by it, as the "
        "MqttUser whose certificateCommonName is the certificate's common name (else as the user of "
        "usersSecretRef named like the common name; a certificate naming no user is refused with 0x87, "
        "and deleting the MqttUser disconnects its clients); its CONNECT username and password are not "
        "used. Needs verifyPeer.",
    },
)


class ListenerServiceSpec(CrdModel):
    """The listener's client Service where it differs from the fleet's spec.service: its type (and what
    goes with it), annotations added to the fleet's."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = Field(
        None, description="Service type (default: the fleet's service.type)."
    )
    annotations: dict[str, str] | None = Field(
        None,
        max_length=64,
        description="Annotations of this Service, over the fleet's service.annotations (a load balancer's "
        "settings, external-dns names).",
    )
    nodePort: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Node port of the listener (type NodePort or LoadBalancer, within the cluster's node "
        "port range; default: one the cluster picks).",
    )
    loadBalancerIP: str | None = Field(
        None,
        max_length=45,
        description="Address asked of the load balancer (type LoadBalancer; where the cloud supports it).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isIP(self)", "message": "loadBalancerIP must be an IP address"}
            ]
        },
    )
    loadBalancerSourceRanges: list[Annotated[str, Field(max_length=49)]] | None = Field(
        None,
        max_length=64,
        description="Client networks (CIDRs, e.g. 203.0.113.0/24) the load balancer admits (type LoadBalancer).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(r, isCIDR(r))",
                    "message": "loadBalancerSourceRanges are CIDRs (10.0.0.0/8)",
                }
            ]
        },
    )
    externalTrafficPolicy: Literal["Cluster", "Local"] | None = Field(
        None,
        description="Local keeps the clients' source addresses and skips a hop, reaching only the nodes with "
        "a broker pod; Cluster (default) spreads over every node (type NodePort or LoadBalancer).",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.nodePort) || (has(self.type) && self.type in ['NodePort', 'LoadBalancer'])",
                    "message": "service.nodePort needs service.type NodePort or LoadBalancer, set here",
                },
                {
                    "rule": "!has(self.externalTrafficPolicy) || "
                    "(has(self.type) && self.type in ['NodePort', 'LoadBalancer'])",
                    "message": "service.externalTrafficPolicy needs service.type NodePort or LoadBalancer, set here",
                },
                {
                    "rule": "!(has(self.loadBalancerIP) || has(self.loadBalancerSourceRanges)) || "
                    "(has(self.type) && self.type == 'LoadBalancer')",
                    "message": "service.loadBalancerIP and loadBalancerSourceRanges need service.type "
                    "LoadBalancer, set here",
                },
            ]
        },
    )


class ListenerSpec(_LISTENER_DERIVED):  # type: ignore[misc,valid-type]
    """One listener of the zone: a port on every broker pod and a client Service."""

    name: str = Field(
        min_length=1,
        max_length=15,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        description="Listener name, unique in the zone; also the Service port name (IANA service name).",
    )
    port: int = Field(ge=1, le=65535, description="Port the brokers listen on and the Service exposes.")
    tlsSecretRef: SecretRef | None = Field(
        None,
        description="kubernetes.io/tls Secret (tls.crt, tls.key, optional ca.crt for verifyPeer) of a tls or "
        "wss listener. Or tls: a certificate the operator gets.",
    )
    tls: ListenerTlsSpec | None = Field(None, description=doc(ListenerTlsSpec))
    service: ListenerServiceSpec | None = Field(None, description=doc(ListenerServiceSpec))
    allowFrom: list[NetworkPolicyPeer] | None = Field(
        None,
        max_length=16,
        description="Who may connect to this listener (NetworkPolicyPeers): with it the fleet's brokers get a "
        "NetworkPolicy, and other listeners stay open to all. Holds where the network plugin enforces "
        "NetworkPolicies.",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.protocol in ['tls', 'wss']) || has(self.tlsSecretRef) || has(self.tls)",
                    "message": "a tls or wss listener needs tlsSecretRef or tls",
                },
                {
                    "rule": "!(has(self.tlsSecretRef) && has(self.tls))",
                    "message": "tlsSecretRef (a certificate you bring) and tls (one the operator gets) "
                    "exclude each other",
                },
                {
                    "rule": "!has(self.tls) || self.protocol in ['tls', 'wss']",
                    "message": "tls needs protocol tls or wss",
                    "fieldPath": ".tls",
                },
                {
                    "rule": "!self.verifyPeer || self.protocol in ['tls', 'wss']",
                    "message": "verifyPeer needs a tls or wss listener",
                },
                {
                    "rule": "!has(self.peerCertAsUsername) || self.verifyPeer",
                    "message": "peerCertAsUsername needs verifyPeer: only a verified certificate names a user",
                    "fieldPath": ".peerCertAsUsername",
                },
            ]
        },
    )

    @model_validator(mode="after")
    def _certificate(self) -> ListenerSpec:
        """The CEL rules above, for the operator's own validation (the API server checks them too)."""
        secure = self.protocol in ("tls", "wss")
        if secure and self.tlsSecretRef is None and self.tls is None:
            raise ValueError("a tls or wss listener needs tlsSecretRef or tls")
        if self.tlsSecretRef is not None and self.tls is not None:
            raise ValueError("tlsSecretRef (a certificate you bring) and tls (one the operator gets) "
                             "exclude each other")  # fmt: skip
        if self.tls is not None and not secure:
            raise ValueError("tls needs protocol tls or wss")
        return self


class MqttZoneSpec(CrdModel):
    """A zone: listeners bound to one set of session, keep-alive, limit and access settings."""

    fleetRef: ObjectRef = Field(description="The BrokerFleet (same namespace) whose brokers serve this zone.")
    listeners: list[ListenerSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Listeners of this zone. Adding, changing or removing one is applied live by the brokers "
        "and updates the zone's client Services.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(l, self.filter(m, m.port == l.port).size() == 1)",
                    "message": "listener ports must be unique",
                },
                {
                    "rule": "self.all(l, !has(l.service) || !has(l.service.nodePort) || self.filter(m, "
                    "has(m.service) && has(m.service.nodePort) && m.service.nodePort == l.service.nodePort)"
                    ".size() == 1)",
                    "message": "listener node ports must be unique",
                },
            ],
        },
    )
    session: SessionSpec = Field(default_factory=SessionSpec, description=SessionSpec.__doc__)  # type: ignore[valid-type]
    keepalive: KeepaliveSpec = Field(default_factory=KeepaliveSpec, description=KeepaliveSpec.__doc__)  # type: ignore[valid-type]
    limits: LimitsSpec = Field(default_factory=LimitsSpec, description=LimitsSpec.__doc__)  # type: ignore[valid-type]
    authentication: AuthenticationSpec = Field(
        default_factory=AuthenticationSpec, description=doc(AuthenticationSpec)
    )
    acl: list[AclRule] = Field(
        default_factory=list,
        max_length=256,
        description=ZoneSettings.model_fields["acl"].description,
    )
    aclDefault: Literal["allow", "deny"] = Field(
        ZoneSettings.model_fields["acl_default"].default,
        description=ZoneSettings.model_fields["acl_default"].description,
    )

    def zone_settings(self, users_file: str | None = None, **users: Any) -> ZoneSettings:
        """The broker's settings for this zone (snake_case, validated by the broker's model); `users`: its
        MqttUsers' part (users_files, user_acl, cert_users)."""
        data: dict[str, Any] = {}
        for group, fields in ZONE_GROUPS.items():
            values = getattr(self, group)
            for name in fields:
                data[name] = getattr(values, name)
        data["acl"] = [rule.model_dump() for rule in self.acl]
        data["acl_default"] = self.aclDefault
        data["users_file"] = users_file
        data |= users
        return ZoneSettings.model_validate(data)


class MqttZoneStatus(CrdModel):
    """Observed state of the zone."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    appliedGeneration: int | None = Field(None, description="Generation applied by every pod of the fleet.")
    podGenerations: dict[str, int] = Field(default_factory=dict, description="Generation each pod applied.")
