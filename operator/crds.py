"""The custom resources' models: BrokerFleet, MqttZone, MqttBridge, MqttUser (group fleetmq.io, v1alpha1).

The zone settings are not retyped here: every MqttZone field that configures a broker is derived from the
broker's own models (ZoneSettings, AclRule, ListenerConfig, RedisStoreConfig, EventLogConfig), carrying
their descriptions, defaults, ranges and enums, under camelCase names grouped as users read them
(session, keepalive, limits, authentication, acl). crdgen turns these models into the CRDs in crds/.
"""

from __future__ import annotations

import copy
import functools
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fleetmq.broker.bridges import (
    BridgeConfig,
    BridgeQueue,
    BridgeRemote,
    BridgeTls,
    Forward,
    LoopPrevention,
    Reconnect,
)
from fleetmq.broker.bridges import Subscription as BridgeSubscription
from fleetmq.broker.config import (
    EventLogConfig,
    ListenerConfig,
    RedisClusterConfig,
    RedisStoreConfig,
    SentinelConfig,
)
from fleetmq.broker.zones import AclRule, ZoneSettings, format_duration, parse_duration
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

GROUP = "fleetmq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: A duration in a CRD: "30s"-style strings (ms, s, m, h, d) or a plain number of seconds.
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)?\s*$"
DURATION_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],  # the only anyOf a structural schema allows
    "pattern": DURATION_PATTERN,  # applies to strings only
    "x-kubernetes-validations": [
        {"rule": "type(self) == string || self >= 0", "message": "a duration cannot be negative"}
    ],
}
CrdDuration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_SCHEMA)]

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
}
ZONE_GROUPS = {
    "session": SESSION_FIELDS,
    "keepalive": KEEPALIVE_FIELDS,
    "limits": LIMITS_FIELDS,
    "authentication": AUTH_FIELDS,
}


def _is_duration(info: FieldInfo) -> bool:
    return any(getattr(m, "func", None) is parse_duration for m in info.metadata)


def derived_field(source: type[BaseModel], name: str, alias: str) -> tuple[Any, FieldInfo]:
    """One field of a broker model under its CRD name, keeping type, default, range and description."""
    info = copy.copy(source.model_fields[name])
    annotation: Any = info.annotation
    if _is_duration(info):
        annotation = CrdDuration
        info.metadata = []
        if isinstance(info.default, int | float):
            info.json_schema_extra = {"default": format_duration(info.default)}
    else:
        annotation = Annotated[annotation, *info.metadata] if info.metadata else annotation
    info.alias = alias
    info.validation_alias = alias
    info.serialization_alias = alias
    return annotation, info


def derive(
    model_name: str,
    source: type[BaseModel],
    fields: dict[str, str],
    doc: str,
    descriptions: dict[str, str] | None = None,
) -> type[BaseModel]:
    """A camelCase model made of some fields of a broker model (validated by the same rules);
    `descriptions` rewords a field where the CRD spells it differently (e.g. a Secret for a file path)."""
    defs = {name: derived_field(source, name, alias) for name, alias in fields.items()}
    for name, text in (descriptions or {}).items():
        defs[name][1].description = text
    model = create_model(  # type: ignore[call-overload]
        model_name,
        __config__=ConfigDict(extra="forbid", populate_by_name=True),
        __doc__=doc,
        **defs,
    )
    return model


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _retype(annotation: Any, nested: dict[type, type]) -> Any:
    """`annotation` with broker models replaced by their CRD models (inside Optional and list too)."""
    if isinstance(annotation, type) and annotation in nested:
        return nested[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[_retype(args[0], nested), *annotation.__metadata__]
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(lambda a, b: a | b, (_retype(a, nested) for a in args))
    if origin is list:
        return list[_retype(args[0], nested)]  # type: ignore[misc]
    return annotation


def derive_all(
    model_name: str,
    source: type[BaseModel],
    doc_: str,
    nested: dict[type, type] | None = None,
    skip: tuple[str, ...] = (),
) -> type[BaseModel]:
    """A camelCase model of every field of a broker model but `skip`, its nested broker models replaced
    by their CRD models (`nested`); the broker model validates what it renders to."""
    defs = {}
    for name in source.model_fields:
        if name in skip:
            continue
        annotation, info = derived_field(source, name, camel(name))
        if nested:
            annotation = _retype(annotation, nested)
            if isinstance(info.default_factory, type) and info.default_factory in nested:
                info.default_factory = nested[info.default_factory]
        defs[name] = (annotation, info)
    model = create_model(  # type: ignore[call-overload]
        model_name, __config__=ConfigDict(extra="forbid", populate_by_name=True), __doc__=doc_, **defs
    )
    return model


class CrdModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def doc(model: type[BaseModel]) -> str:
    """A model's docstring as one line, for the description of a field of that type (kubectl explain)."""
    return " ".join((model.__doc__ or "").split())


# ----------------------------------------------------------------------------------------------- refs
class ObjectRef(CrdModel):
    """A reference to an object in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object in this namespace.")


class SecretRef(CrdModel):
    """A Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")


class SecretKeyRef(CrdModel):
    """One key of a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")
    key: str = Field("password", min_length=1, description="Key of the Secret holding the password.")


class UsersSecretRef(CrdModel):
    """The users file in a Secret of the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")
    key: str = Field("users", min_length=1, description="Key of the Secret holding the users file.")


# ------------------------------------------------------------------------------------------- MqttZone
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


class AuthenticationSpec(_AuthBase):  # type: ignore[misc,valid-type]
    """Who may connect: anonymous clients, the users of a Secret (`fleetmq-broker passwd` format) and the
    zone's MqttUsers. Once a zone has users, a client giving a username must give its password."""

    usersSecretRef: UsersSecretRef | None = Field(
        None,
        description="Secret whose key (default 'users') holds the users file (salted hashes, one user a line, "
        "written by `fleetmq-broker passwd`). Mounted into the pods; edits reach the brokers live.",
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
    },
    "A listener.",
    {
        "verify_peer": "Require a client certificate signed by the ca.crt of tlsSecretRef (tls/wss only).",
        "peer_cert_as_username": "cn: a client with a verified certificate is authenticated by it, as the "
        "MqttUser whose certificateCommonName is the certificate's common name (else as the user named "
        "like the common name); its CONNECT username and password are not used. Needs verifyPeer.",
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
        "wss listener.",
    )
    service: ListenerServiceSpec | None = Field(None, description=doc(ListenerServiceSpec))

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.protocol in ['tls', 'wss']) || has(self.tlsSecretRef)",
                    "message": "a tls or wss listener needs tlsSecretRef",
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


# ------------------------------------------------------------------------------------------ MqttBridge
ForwardSpec = derive_all("ForwardSpec", Forward, doc(Forward))
BridgeSubscriptionSpec = derive_all("BridgeSubscriptionSpec", BridgeSubscription, doc(BridgeSubscription))
BridgeQueueSpec = derive_all("BridgeQueueSpec", BridgeQueue, doc(BridgeQueue))
ReconnectSpec = derive_all("ReconnectSpec", Reconnect, doc(Reconnect))
LoopPreventionSpec = derive_all("LoopPreventionSpec", LoopPrevention, "Loop prevention across bridges.")
_BridgeTlsBase = derive_all(
    "BridgeTlsBase", BridgeTls, doc(BridgeTls), skip=("cafile", "certfile", "keyfile")
)


class BridgeTlsSpec(_BridgeTlsBase):  # type: ignore[misc,valid-type]
    """TLS towards the remote (tls and wss transports)."""

    secretRef: SecretRef | None = Field(
        None,
        description="Secret with ca.crt (the CA to verify the remote against; default: the system's) and, for "
        "remotes that require a client certificate, tls.crt and tls.key.",
    )


_RemoteBase = derive_all(
    "BridgeRemoteBase", BridgeRemote, doc(BridgeRemote), {BridgeTls: BridgeTlsSpec}, skip=("password_file",)
)


class BridgeRemoteSpec(_RemoteBase):  # type: ignore[misc,valid-type]
    """The remote broker and the bridge's session there (always resumed: Clean Start 0)."""

    passwordSecretRef: SecretKeyRef | None = Field(
        None, description="Secret key holding the password at the remote (mounted into the broker pods)."
    )


_BridgeBase = derive_all(
    "MqttBridgeBase",
    BridgeConfig,
    doc(BridgeConfig),
    {
        BridgeRemote: BridgeRemoteSpec,
        Forward: ForwardSpec,
        BridgeSubscription: BridgeSubscriptionSpec,
        BridgeQueue: BridgeQueueSpec,
        Reconnect: ReconnectSpec,
        LoopPrevention: LoopPreventionSpec,
    },
    skip=("name",),
)


class MqttBridgeSpec(_BridgeBase):  # type: ignore[misc,valid-type]
    """A bridge from a fleet to one remote MQTT broker: forwards (egress), subscriptions (ingress)."""

    fleetRef: ObjectRef = Field(description="The BrokerFleet (same namespace) whose brokers run this bridge.")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.forwards) && size(self.forwards) > 0) || "
                    "(has(self.subscriptions) && size(self.subscriptions) > 0)",
                    "message": "a bridge needs at least one forward or subscription",
                }
            ]
        },
    )

    def bridge_config(
        self, name: str, password_file: str | None = None, tls_files: dict[str, str] | None = None
    ) -> BridgeConfig:
        """The broker's `bridges:` entry (snake_case, validated by the broker's model): the Secrets'
        files where the operator puts them (`tls_files`: cafile, certfile, keyfile, those there are)."""
        data = self.model_dump(exclude={"fleetRef"}, exclude_none=True)
        remote = data["remote"]
        remote.pop("passwordSecretRef", None)
        remote["password_file"] = password_file
        tls = remote.get("tls")
        if tls is not None:
            tls.pop("secretRef", None)
            tls |= tls_files or {}
        return BridgeConfig.model_validate({"name": name, **data})


# -------------------------------------------------------------------------------------------- MqttUser
#: a username the users file and the ACL's %u can carry: no ':' (the file's separator), no '/', '+', '#'
#: (a %u rule would reach other users' topics) and no spaces
USERNAME_PATTERN = r"^[^:/+#\s]+$"
ZONE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class MqttUserSpec(CrdModel):
    """An MQTT user of some zones of a fleet: its password (from a Secret, or generated into one), its own
    ACL rules, and the common name of its client certificate. Applied live: no pod restarts."""

    fleetRef: ObjectRef = Field(description="The BrokerFleet (same namespace) whose zones the user is in.")
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
                    "has(self.certificateCommonName)",
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
        ):
            raise ValueError(
                "a user needs a password (passwordSecretRef or generatePassword) or a certificateCommonName"
            )
        return self

    def password_ref(self, name: str) -> SecretKeyRef | None:
        """Where the password is (None: certificate only)."""
        if self.passwordSecretRef is not None:
            return self.passwordSecretRef
        return SecretKeyRef(name=f"{name}-credentials") if self.generatePassword else None


# ---------------------------------------------------------------------------------------- BrokerFleet
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        }
    ),
]


_BROKER_REQUESTS: dict[str, int | str] = {"cpu": "100m", "memory": "128Mi"}


class ResourcesSpec(CrdModel):
    """CPU and memory of each broker container (a Kubernetes ResourceRequirements)."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: _BROKER_REQUESTS.copy(), description="Resources reserved."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource ceilings.")


class GuaranteedResources(CrdModel):
    """CPU and memory of a container, reserved and capped alike (requests == limits): a pod whose every
    container is so has the Guaranteed QoS class, the last one evicted when its node runs short."""

    cpu: Quantity = Field("250m", description="CPU reserved and capped.")
    memory: Quantity = Field("256Mi", description="Memory reserved and capped.")

    def requirements(self) -> dict[str, dict[str, int | str]]:
        """As a Kubernetes ResourceRequirements."""
        both: dict[str, int | str] = {"cpu": self.cpu, "memory": self.memory}
        return {"requests": dict(both), "limits": dict(both)}


class SentinelResources(GuaranteedResources):
    """CPU and memory of a sentinel, reserved and capped alike (requests == limits: Guaranteed QoS)."""

    cpu: Quantity = Field("50m", description="CPU reserved and capped.")
    memory: Quantity = Field("64Mi", description="Memory reserved and capped.")


class SetupResources(GuaranteedResources):
    """CPU and memory of the Job that forms a managed Redis Cluster (requests == limits)."""

    cpu: Quantity = Field("50m", description="CPU reserved and capped.")
    memory: Quantity = Field("64Mi", description="Memory reserved and capped.")


class SchedulingSpec(CrdModel):
    """How pods spread over nodes, so one node failure takes one of them."""

    antiAffinity: Literal["preferred", "required", "none"] = Field(
        "preferred", description="Pod anti-affinity between pods of the fleet of one kind over topologyKey."
    )
    topologyKey: str = Field(
        "kubernetes.io/hostname", description="Node label that anti-affinity spreads over."
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods need.")


# ------------------------------------------------------------------------------------ pod templates
# What a platform team sets on the pods the operator runs (tolerations, priority, service meshes' and
# secret injectors' labels and annotations, sidecars...). Kubernetes types fleetmq does not interpret deeply
# (affinity, volumes, containers, valueFrom) are kept as given, with the keys that must be there checked
# here; the API server validates the rest when the operator applies the StatefulSet (an error there is said
# in the fleet's Degraded condition).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: a label or annotation key: an optional DNS subdomain prefix and a name
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
#: label keys the operator sets on its pods (their selectors) and the prefix it keeps for itself
OPERATOR_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
OPERATOR_PREFIX = "fleetmq.io/"


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class KubeModel(BaseModel):
    """A Kubernetes object whose required keys are checked here and the rest kept as given."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class LabelSelectorRequirement(CrdModel):
    """One requirement of a label selector."""

    key: str = Field(min_length=1, max_length=316, description="Label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In and NotIn need values; Exists and DoesNotExist take none."
    )
    values: list[str] | None = Field(None, max_length=64, description="Label values (In, NotIn).")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                    "message": "In and NotIn need values; Exists and DoesNotExist take none",
                }
            ]
        },
    )


class LabelSelector(CrdModel):
    """Which pods a constraint counts (a Kubernetes LabelSelector)."""

    matchLabels: dict[str, str] | None = Field(None, description="Labels the pods have.")
    matchExpressions: list[LabelSelectorRequirement] | None = Field(
        None, max_length=16, description="Requirements the pods' labels meet (ANDed)."
    )


class Toleration(CrdModel):
    """A node taint the pods tolerate (a Kubernetes Toleration)."""

    key: str | None = Field(
        None,
        max_length=316,
        pattern=QUALIFIED_NAME,
        description="Taint key tolerated; unset with operator Exists tolerates every taint.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        None, description="Equal (default): the taint's value is `value`; Exists: any value."
    )
    value: str | None = Field(None, max_length=63, description="Taint value tolerated (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect tolerated; unset: every effect."
    )
    tolerationSeconds: int | None = Field(
        None,
        description="With effect NoExecute: how long a pod stays on a node after the taint appears "
        "(unset: for ever; 0 or less: evicted at once).",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    "message": "a toleration with operator Exists has no value",
                },
                {
                    "rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                    "message": "a toleration without key needs operator Exists",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds needs effect NoExecute",
                },
            ]
        },
    )


class TopologySpreadConstraint(CrdModel):
    """How the pods spread over a topology domain (a Kubernetes TopologySpreadConstraint)."""

    maxSkew: int = Field(ge=1, description="Most pods a domain may have more than the emptiest one.")
    topologyKey: str = Field(
        min_length=1,
        max_length=316,
        pattern=QUALIFIED_NAME,
        description="Node label whose values are domains.",
    )
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="DoNotSchedule keeps a pod pending rather than exceed maxSkew; ScheduleAnyway prefers."
    )
    labelSelector: LabelSelector | None = Field(
        None,
        description="Pods counted; default: the pods of this StatefulSet (the operator's selector labels).",
    )
    minDomains: int | None = Field(
        None, ge=1, description="Domains counted at least (whenUnsatisfiable DoNotSchedule only)."
    )
    nodeAffinityPolicy: Literal["Honor", "Ignore"] | None = Field(
        None, description="Whether the pods' node affinity and selector limit the domains (default Honor)."
    )
    nodeTaintsPolicy: Literal["Honor", "Ignore"] | None = Field(
        None, description="Whether tainted nodes the pods do not tolerate count (default Ignore)."
    )
    matchLabelKeys: list[str] | None = Field(
        None,
        max_length=16,
        description="Pod label keys whose values narrow the pods counted (e.g. pod-template-hash).",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minDomains) || self.whenUnsatisfiable == 'DoNotSchedule'",
                    "message": "minDomains needs whenUnsatisfiable DoNotSchedule",
                }
            ]
        },
    )


class Affinity(CrdModel):
    """Node and pod (anti-)affinity, as in a Kubernetes pod spec."""

    nodeAffinity: KubeObject | None = Field(None, description="Nodes the pods prefer or need (NodeAffinity).")
    podAffinity: KubeObject | None = Field(None, description="Pods to be near (PodAffinity).")
    podAntiAffinity: KubeObject | None = Field(None, description="Pods to be apart from (PodAntiAffinity).")


class ConfigRef(CrdModel):
    """A ConfigMap or Secret of the same namespace whose keys become environment variables."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object in this namespace.")
    optional: bool | None = Field(None, description="Start the container without it when it is missing.")


class EnvFromSource(CrdModel):
    """Every key of a ConfigMap or Secret as an environment variable."""

    prefix: str | None = Field(None, max_length=253, description="Prepended to each key.")
    configMapRef: ConfigRef | None = Field(None, description="The ConfigMap (exclusive with secretRef).")
    secretRef: ConfigRef | None = Field(None, description="The Secret (exclusive with configMapRef).")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.configMapRef) != has(self.secretRef)",
                    "message": "envFrom: set exactly one of configMapRef or secretRef",
                }
            ]
        },
    )


class EnvVar(CrdModel):
    """An environment variable: a value, or valueFrom (a Kubernetes EnvVarSource: a key of a Secret or
    ConfigMap, a field of the pod, a resource of the container)."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME, description="Variable name.")
    value: str | None = Field(None, description="Its value ($(VAR) references expand).")
    valueFrom: KubeObject | None = Field(
        None, description="Where its value comes from (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "an env entry has value or valueFrom, not both",
                }
            ]
        },
    )


class Volume(KubeModel):
    """A volume of the pods (a Kubernetes Volume: configMap, secret, emptyDir, csi, projected, ...)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Volume name in the pod.")


class VolumeMount(CrdModel):
    """Where a volume of `volumes` appears in the pods' main container."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="A volume of `volumes`.")
    mountPath: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path.")
    readOnly: bool | None = Field(None, description="Mount read-only.")
    subPath: str | None = Field(None, description="Path inside the volume (default: its root).")
    subPathExpr: str | None = Field(None, description="subPath with $(VAR) references expanded.")
    mountPropagation: Literal["None", "HostToContainer", "Bidirectional"] | None = Field(
        None, description="How mounts propagate between host and container (default None)."
    )


class Container(KubeModel):
    """A container of your own in the pods (a Kubernetes Container: command, ports, resources, ...). Not
    made to follow the restricted Pod Security Standard: its securityContext is yours to set."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Container name.")
    image: str = Field(min_length=1, description="Container image.")


def _no_reserved(field: str, reserved: Reserved, message: str) -> dict[str, Any]:
    """CEL: no element of a list has a `field` the operator's pods use (in a list keyed by name the API
    server would merge the two, or refuse both)."""
    return {"rule": f"self.all(x, !x.{field}.matches('{reserved.regex}'))", "message": message}


def _names_unique(field: str = "name") -> dict[str, Any]:
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [field]}


class PodTemplate(CrdModel):
    """What the operator's pods get besides their own settings. Changing it rolls the pods."""

    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] | None = Field(
        None,
        max_length=64,
        description="Labels of the pods (service meshes, cost allocation); not the operator's own "
        "(app.kubernetes.io/name, instance, component, managed-by, fleetmq.io/...).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !(k in {_cel_list(OPERATOR_LABELS)}) && !k.startsWith('{OPERATOR_PREFIX}'))",
                    "message": "pod.labels: app.kubernetes.io/name, instance, component, managed-by and "
                    "fleetmq.io/ labels are the operator's (its selectors)",
                },
                {
                    "rule": f"self.all(k, k.matches('{QUALIFIED_NAME}'))",
                    "message": "pod.labels: keys are [DNS subdomain/]name, the name at most 63 characters",
                },
            ]
        },
    )
    annotations: dict[str, str] | None = Field(
        None,
        max_length=64,
        description="Annotations of the pods (sidecar and secret injectors, mesh settings); not "
        "fleetmq.io/ ones.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !k.startsWith('{OPERATOR_PREFIX}'))",
                    "message": "pod.annotations: fleetmq.io/ annotations are the operator's",
                },
                {
                    "rule": f"self.all(k, k.matches('{QUALIFIED_NAME}'))",
                    "message": "pod.annotations: keys are [DNS subdomain/]name, the name at most 63 characters",
                },
            ]
        },
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=32, description="Node taints the pods tolerate."
    )
    affinity: Affinity | None = Field(
        None,
        description="Node and pod (anti-)affinity of the pods. Set, it replaces the preset anti-affinity "
        "of `scheduling` ({} for none): include a podAntiAffinity to keep pods on different nodes.",
    )
    topologySpreadConstraints: list[TopologySpreadConstraint] | None = Field(
        None,
        max_length=8,
        description="How the pods spread over zones or nodes. Set, it replaces the preset (maxSkew 1 over "
        "topology.kubernetes.io/zone, ScheduleAnyway; [] for none). A constraint without labelSelector "
        "counts the pods of its StatefulSet.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(c, self.filter(d, d.topologyKey == c.topologyKey && "
                    "d.whenUnsatisfiable == c.whenUnsatisfiable).size() == 1)",
                    "message": "topologySpreadConstraints: one per topologyKey and whenUnsatisfiable",
                }
            ]
        },
    )
    priorityClassName: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN, description="PriorityClass of the pods."
    )
    serviceAccountName: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount the pods run as (default: the namespace's default). Its token is "
        "mounted only with automountServiceAccountToken.",
    )
    automountServiceAccountToken: bool | None = Field(
        None,
        description="Mount the ServiceAccount's API token into the pods (default false: fleetmq never "
        "calls the Kubernetes API; a secret injector or a sidecar may need it).",
    )
    imagePullSecrets: list[ObjectRef] | None = Field(
        None,
        max_length=16,
        description="Secrets (kubernetes.io/dockerconfigjson) to pull the images with.",
        json_schema_extra=_names_unique(),
    )
    envFrom: list[EnvFromSource] | None = Field(
        None,
        max_length=16,
        description="ConfigMaps and Secrets whose keys become environment variables of the main "
        "container(s).",
    )
    # env, volumes, volumeMounts, sidecars and initContainers: in pod_template (what is reserved differs)

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                    "self.volumes.exists(v, v.name == m.name))",
                    "message": "pod.volumeMounts: each names a volume of pod.volumes",
                }
            ]
        },
    )

    env: list[EnvVar] | None = None
    volumes: list[Volume] | None = None
    volumeMounts: list[VolumeMount] | None = None
    sidecars: list[Container] | None = None
    initContainers: list[Container] | None = None


@dataclass(frozen=True)
class Reserved:
    """Names the operator's own pods use: a regex (RE2 and Python alike) and how users read it."""

    regex: str
    text: str


@dataclass(frozen=True)
class PodNames:
    """What the operator's pods of one kind name: containers, volumes, variables, mount paths."""

    containers: Reserved
    volumes: Reserved
    env: Reserved
    mounts: Reserved


#: what the operator's own pods use (render.py; a unit test checks the rendered pods against these)
BROKER_NAMES = PodNames(
    containers=Reserved(r"^broker$", "broker"),
    volumes=Reserved(
        r"^(config|bridge-secrets|fleet-users|redis-auth|redis-sentinel-auth|tls-[0-9]+|users-[0-9]+)$",
        "config, bridge-secrets, fleet-users, redis-auth, redis-sentinel-auth, tls-N and users-N",
    ),
    env=Reserved(r"^POD_NAME$", "POD_NAME"),
    mounts=Reserved(r"^/etc/fleetmq(/.*)?$", "/etc/fleetmq and below"),
)
REDIS_NAMES = PodNames(
    containers=Reserved(r"^(redis|sentinel|create)$", "redis, sentinel and create"),
    volumes=Reserved(r"^(scripts|auth|conf|data)$", "scripts, auth, conf and data"),
    env=Reserved(r"^(POD_NAME|CLUSTER_REPLICAS|REDIS_.*|SENTINEL_.*)$", "POD_NAME, CLUSTER_REPLICAS, REDIS_* and SENTINEL_*"),
    mounts=Reserved(r"^/(scripts|etc/redis-auth|conf|data)(/.*)?$", "/scripts, /etc/redis-auth, /conf, /data and below"),
)  # fmt: skip


def _named_list(max_length: int, description: str, rule: dict[str, Any], key: str = "name") -> Any:
    """A list field keyed by `key` (as in a Kubernetes pod spec) refusing the operator's own names."""
    extra = {**_names_unique(key), "x-kubernetes-validations": [rule]}
    return Field(None, max_length=max_length, description=description, json_schema_extra=extra)


def _env(r: PodNames) -> Any:
    return _named_list(
        64,
        f"Environment variables of the main container(s); not {r.env.text} (the operator's).",
        _no_reserved("name", r.env, f"pod.env: {r.env.text} are the operator's variables"),
    )


def _volumes(r: PodNames) -> Any:
    return _named_list(
        32,
        f"Volumes added to the pods (for volumeMounts and sidecars); not named {r.volumes.text} (the "
        "operator's).",
        _no_reserved("name", r.volumes, f"pod.volumes: {r.volumes.text} are the operator's volumes"),
    )


def _mounts(r: PodNames) -> Any:
    return _named_list(
        32,
        f"Mounts of `volumes` in the main container(s); not at {r.mounts.text} (the operator's).",
        _no_reserved("mountPath", r.mounts, f"pod.volumeMounts: {r.mounts.text} are the operator's mounts"),
        key="mountPath",
    )


def _sidecars(r: PodNames) -> Any:
    return _named_list(
        8,
        "Containers of your own beside the main one(s) (a mesh proxy, a log shipper); not named "
        f"{r.containers.text}.",
        _no_reserved(
            "name", r.containers, f"pod.sidecars: {r.containers.text} are the operator's containers"
        ),
    )


def _init_containers(r: PodNames) -> Any:
    return _named_list(
        8,
        "Init containers of your own, run before the main one(s); with restartPolicy Always a native "
        f"sidecar that starts first and stops last. Not named {r.containers.text}.",
        _no_reserved(
            "name", r.containers, f"pod.initContainers: {r.containers.text} are the operator's containers"
        ),
    )


class BrokerPodTemplate(PodTemplate):
    """What the broker pods get besides the operator's settings: labels, annotations, tolerations,
    affinity, spread, priority, ServiceAccount, pull Secrets, environment, volumes, sidecars. Changing it
    rolls the pods one at a time."""

    env: list[EnvVar] | None = _env(BROKER_NAMES)
    volumes: list[Volume] | None = _volumes(BROKER_NAMES)
    volumeMounts: list[VolumeMount] | None = _mounts(BROKER_NAMES)
    sidecars: list[Container] | None = _sidecars(BROKER_NAMES)
    initContainers: list[Container] | None = _init_containers(BROKER_NAMES)


class RedisPodTemplate(PodTemplate):
    """What the managed Redis' pods get besides the operator's settings: labels, annotations,
    tolerations, affinity, spread, priority, ServiceAccount, pull Secrets, environment, volumes, sidecars.
    Changing it rolls those pods one at a time."""

    env: list[EnvVar] | None = _env(REDIS_NAMES)
    volumes: list[Volume] | None = _volumes(REDIS_NAMES)
    volumeMounts: list[VolumeMount] | None = _mounts(REDIS_NAMES)
    sidecars: list[Container] | None = _sidecars(REDIS_NAMES)
    initContainers: list[Container] | None = _init_containers(REDIS_NAMES)


HOST_PORT = r"^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$"
HostPort = Annotated[str, Field(pattern=HOST_PORT, max_length=260)]


class ExternalSentinelSpec(CrdModel):
    """An existing Redis replicated and watched by Sentinel: the brokers ask its sentinels for the primary."""

    nodes: list[HostPort] = Field(
        min_length=1, max_length=16, description=SentinelConfig.model_fields["nodes"].description
    )
    master: str = Field(min_length=1, description=SentinelConfig.model_fields["master"].description)
    secretRef: SecretKeyRef | None = Field(
        None,
        description="Secret key (default 'password') with the sentinels' own password, if they require one "
        "(the Redis password is redis.secretRef). Mounted into the broker pods as a file.",
    )


class ExternalClusterSpec(CrdModel):
    """An existing Redis Cluster: sessions spread over its shards by their hash tag."""

    nodes: list[HostPort] = Field(
        min_length=1, max_length=64, description=RedisClusterConfig.model_fields["nodes"].description
    )


REDIS_MODES = ("sentinel", "cluster", "standalone")
#: replicas per primary when redis.replicas is unset
DEFAULT_REPLICAS = {"sentinel": 2, "cluster": 1, "standalone": 0}


def _replicas_cel(obj: str) -> str:
    """CEL: the replicas per primary of `obj` (a RedisSpec), its default when unset."""
    return (
        f"(has({obj}.replicas) ? {obj}.replicas : "
        f"({obj}.mode == 'sentinel' ? 2 : ({obj}.mode == 'cluster' ? 1 : 0)))"
    )


def _same_cel(field: str) -> str:
    """CEL: an optional field of the redis spec is as it was (both unset counts)."""
    return f"(has(self.{field}) ? self.{field} : '') == (has(oldSelf.{field}) ? oldSelf.{field} : '')"


class RedisSpec(CrdModel):
    """Where the fleet keeps its sessions: a Redis the operator runs (managed: true; highly available by
    default) or an existing one (url, sentinel or cluster)."""

    managed: bool = Field(
        False,
        description="Run a Redis for this fleet: with mode sentinel (the default) a primary with replicas "
        "and sentinels that fail over, with mode cluster a Redis Cluster, with mode standalone (for "
        "development) one server. Exclusive with url, sentinel and cluster.",
    )
    mode: Literal["sentinel", "cluster", "standalone"] = Field(
        "sentinel",
        description="Topology of the managed Redis. It cannot change on an existing fleet: sessions are not "
        "moved between topologies.",
    )
    replicas: int | None = Field(
        None,
        ge=0,
        le=10,
        description="Replicas of each primary of the managed Redis: default 2 with mode sentinel (at least "
        "1), 1 with mode cluster (fixed once the cluster is formed), 0 with standalone.",
    )
    shards: int = Field(
        3, ge=3, le=100, description="Primaries of a managed Redis Cluster (mode cluster); fixed once formed."
    )
    sentinels: int = Field(
        3, ge=3, le=9, description="Sentinels of a managed Redis in mode sentinel: odd, a majority decides."
    )
    storage: str = Field(
        "1Gi",
        max_length=32,
        pattern=r"^([0-9]+(\.[0-9]+)?([KMGTPE]i?)?)?$",
        description="Size of the PersistentVolumeClaim of each managed Redis server, where its append-only "
        'file lives; "" for an emptyDir (development only: a server\'s data goes with its pod). Fixed once '
        "the fleet exists.",
    )
    storageClassName: str | None = Field(
        None,
        max_length=253,
        description="StorageClass of those claims (default: the cluster's default). Fixed once set.",
    )
    appendfsync: Literal["always", "everysec"] = Field(
        "everysec",
        description="When the managed Redis fsyncs its append-only file: always (every write, slower) or "
        "everysec (a crash of a server may lose its last second; replicas and waitReplicas cover it).",
    )
    resources: GuaranteedResources = Field(
        default_factory=GuaranteedResources,
        description="CPU and memory of each managed Redis server (requests == limits: Guaranteed QoS). "
        "Redis refuses writes (noeviction) beyond 70% of the memory, leaving room for its forks.",
    )
    sentinelResources: SentinelResources = Field(
        default_factory=SentinelResources,
        description="CPU and memory of each sentinel (requests == limits: Guaranteed QoS).",
    )
    setupResources: SetupResources = Field(
        default_factory=SetupResources,
        description="CPU and memory of the Job forming a Redis Cluster (requests == limits).",
    )
    image: str = Field("redis:7-alpine", min_length=1, description="Image of the managed Redis (Redis >= 7).")
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="How managed Redis servers (and, apart from them, sentinels) spread over nodes.",
    )
    pod: RedisPodTemplate | None = Field(
        None,
        description="What every pod of the managed Redis (servers, sentinels unless sentinelPod is set, "
        "and the Job forming a cluster, which gets no sidecars) gets besides the operator's settings: "
        "labels, annotations, tolerations, affinity, spread, priority, ServiceAccount, pull Secrets, "
        "environment, volumes, sidecars. Changing it rolls those pods one at a time.",
    )
    sentinelPod: RedisPodTemplate | None = Field(
        None, description="What the sentinels' pods get instead of redis.pod (default: redis.pod)."
    )
    url: str | None = Field(
        None,
        pattern=r"^rediss?://",
        description="URL of an existing Redis server, redis://host:port/db, without password (see "
        "secretRef).",
    )
    sentinel: ExternalSentinelSpec | None = Field(None, description=doc(ExternalSentinelSpec))
    cluster: ExternalClusterSpec | None = Field(None, description=doc(ExternalClusterSpec))
    secretRef: SecretKeyRef | None = Field(
        None,
        description="Secret key (default 'password') with the password of the existing Redis (url, "
        "sentinel or cluster). Mounted into the broker pods as a file.",
    )
    waitReplicas: int | None = Field(
        None,
        ge=0,
        description=(RedisStoreConfig.model_fields["wait_replicas"].description or "")
        + " Default: 1 for a managed Redis in mode sentinel or cluster (0 without replicas), else 0.",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.managed ? 1 : 0) + (has(self.url) ? 1 : 0) + (has(self.sentinel) ? 1 : 0)"
                    " + (has(self.cluster) ? 1 : 0) == 1",
                    "message": "redis: set exactly one of managed: true, url, sentinel or cluster",
                },
                {
                    "rule": "!self.managed || !has(self.secretRef)",
                    "message": "redis.secretRef is the password of an existing Redis (url, sentinel or "
                    "cluster); a managed one has its own",
                },
                {
                    "rule": "!self.managed || self.mode != 'sentinel' || !has(self.replicas) || self.replicas >= 1",
                    "message": "redis.replicas must be at least 1 with mode sentinel: a failover promotes a "
                    "replica",
                },
                {
                    "rule": "!self.managed || self.mode != 'standalone' || !has(self.replicas) || self.replicas == 0",
                    "message": "redis.replicas must be 0 with mode standalone: use mode sentinel for replicas",
                },
                {
                    "rule": "self.sentinels % 2 == 1",
                    "message": "redis.sentinels must be odd (3, 5, 7, 9): a majority of them decides a failover",
                },
                {
                    "rule": f"!self.managed || !has(self.waitReplicas) || self.waitReplicas <= {_replicas_cel('self')}",
                    "message": "redis.waitReplicas cannot exceed redis.replicas: acks would wait for replicas "
                    "that do not exist",
                },
                {
                    "rule": "self.managed == oldSelf.managed",
                    "message": "redis.managed cannot change on an existing fleet: moving sessions between a "
                    "managed and an existing Redis is not supported; create a new fleet",
                },
                {
                    "rule": "!self.managed || self.mode == oldSelf.mode",
                    "message": "redis.mode cannot change on an existing fleet: moving sessions between Redis "
                    "topologies is not supported; create a new fleet",
                },
                {
                    "rule": "!self.managed || self.mode != 'cluster' || (self.shards == oldSelf.shards && "
                    f"{_replicas_cel('self')} == {_replicas_cel('oldSelf')})",
                    "message": "redis.shards and redis.replicas cannot change with mode cluster: resharding "
                    "a formed Redis Cluster is not supported",
                },
                {
                    "rule": f"!self.managed || ({_same_cel('storage')} && {_same_cel('storageClassName')})",
                    "message": "redis.storage and redis.storageClassName cannot change on an existing "
                    "fleet: a StatefulSet's volume claims are fixed",
                },
            ]
        },
    )

    @property
    def replicas_per_primary(self) -> int:
        return self.replicas if self.replicas is not None else DEFAULT_REPLICAS[self.mode]

    @property
    def wait_replicas(self) -> int:
        """What broker writes wait for: as set, else one replica of a managed Redis that has replicas."""
        if self.waitReplicas is not None:
            return self.waitReplicas
        if self.managed and self.mode in ("sentinel", "cluster"):
            return min(1, self.replicas_per_primary)
        return 0


class ServiceSpec(CrdModel):
    """The client Services (one per listener)."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the Services.")


#: A Kubernetes label key (an optional DNS-subdomain prefix and "/", then a name of at most 63 characters)
#: and a label value; the API server would refuse them on the ServiceMonitor only after the fleet was accepted.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
#: the labels the operator puts on its children (render.labels): pruning and selectors rely on them
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "fleetmq.io/fleet",
)
#: a Prometheus duration as the Prometheus Operator's ServiceMonitor accepts it, and CEL's duration() parses
SCRAPE_DURATION = r"^\d+(ms|s|m|h)$"


class MetricsSpec(CrdModel):
    """Where the brokers serve /metrics, /healthz and /readyz, and the ServiceMonitor that scrapes them."""

    port: int = Field(9100, ge=1, le=65535, description="Metrics and probe port of every broker pod.")
    serviceMonitor: bool = Field(
        True, description="Create a ServiceMonitor (when the monitoring.coreos.com CRD exists)."
    )
    interval: str = Field("30s", pattern=SCRAPE_DURATION, description="Scrape interval.")
    scrapeTimeout: str | None = Field(
        None,
        pattern=SCRAPE_DURATION,
        description="Scrape timeout, at most the interval. Default: Prometheus' scrape_timeout.",
    )
    # (beside serviceMonitor, not inside it: v1alpha1 fields are only added, never retyped; README "Upgrades")
    serviceMonitorLabels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels added to the ServiceMonitor, for the Prometheus serviceMonitorSelector that must "
        "pick it up (kube-prometheus-stack's default: release: <its Helm release name>). Cannot replace the "
        "operator's own: " + ", ".join(OWN_LABELS) + ".",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches(r'{LABEL_KEY_PATTERN}'))",
                    "message": "label keys must be [prefix/]name: a DNS subdomain prefix, and a name of at most "
                    "63 alphanumerics, '-', '_' or '.' starting and ending alphanumeric",
                },
                {
                    "rule": f"!self.exists(k, k in {list(OWN_LABELS)})",
                    "message": "labels cannot replace the operator's own (" + ", ".join(OWN_LABELS) + ")",
                },
            ]
        },
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.scrapeTimeout) || duration(self.scrapeTimeout) <= duration(self.interval)",
                    "message": "scrapeTimeout cannot exceed interval (Prometheus refuses the scrape config)",
                    "fieldPath": ".scrapeTimeout",
                }
            ]
        },
    )

    @field_validator("serviceMonitorLabels")
    @classmethod
    def _label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if not re.match(LABEL_KEY_PATTERN, key):
                raise ValueError(f"label key {key!r} is not [prefix/]name")
            if key in OWN_LABELS:
                raise ValueError(f"label {key!r} is the operator's own")
        return labels

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> MetricsSpec:
        if self.scrapeTimeout is not None and parse_duration(self.scrapeTimeout) > parse_duration(
            self.interval
        ):
            raise ValueError("scrapeTimeout cannot exceed interval")
        return self


EventLogSpec = derive(
    "EventLogSpec",
    EventLogConfig,
    {"enabled": "enabled", "max_len": "maxLen", "sample": "sample", "max_rate": "maxRate"},
    "The brokers' event log (Redis Streams read by the pipeline). Changes restart the pods.",
)


class RebalanceSpec(CrdModel):
    """Moving connections from pods with more than their share to the others, a few a second. Clients stay
    on the pod they connected to, so pods added by a scale-up start empty. A rebalance starts after a
    scale-up (afterScaleUp) or when the annotation fleetmq.io/rebalance gets a new value, once every pod is
    Ready and no rollout is under way; meanwhile the pods giving connections away take no new ones, so
    the clients they let go (MQTT 5: DISCONNECT 0x9C Use another server) reconnect to the others, with
    their sessions."""

    afterScaleUp: bool = Field(False, description="Rebalance when the fleet has more Ready pods than before.")
    evictionRate: float = Field(
        50, gt=0, description="Connections per second each pod giving connections away lets go."
    )
    threshold: float = Field(
        1.1,
        ge=1,
        description="A pod gives connections away when it has more than the average per pod times this "
        "(and minConnections more than the average); it keeps the average.",
    )
    minConnections: int = Field(
        100,
        ge=0,
        description="A pod gives connections away only when it has this many more than the average.",
    )
    timeoutSeconds: int = Field(600, ge=1, description="A rebalance still running then ends (TimedOut).")


class BrokerFleetSpec(CrdModel):
    """A fleet of broker pods sharing one Redis, serving the MqttZones that point at it."""

    replicas: int = Field(3, ge=0, description="Number of broker pods (scale subresource).")
    image: str | None = Field(
        None,
        min_length=1,
        description="Broker image (runs fleetmq-broker). Unset: the operator's (its --broker-image, the "
        "chart's image), so upgrading the operator upgrades the brokers it renders configs for.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the broker containers."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description=ResourcesSpec.__doc__)
    redis: RedisSpec = Field(
        default_factory=lambda: RedisSpec(managed=True),
        description=doc(RedisSpec),
        # with the fields its rules read: the API server checks them on the default as it stands
        json_schema_extra={
            "default": RedisSpec(managed=True).model_dump(include={"managed", "mode", "shards", "sentinels"})
        },
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec, description=ServiceSpec.__doc__)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description=MetricsSpec.__doc__)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description=SchedulingSpec.__doc__)
    pod: BrokerPodTemplate | None = Field(None, description=doc(BrokerPodTemplate))
    terminationGracePeriodSeconds: int = Field(
        30,
        ge=1,
        description="Time a stopping broker has to drain: it refuses new clients, evicts connected ones at "
        "evictionRate so they reconnect to other pods, and commits pending session writes; it stops at 5 s "
        "before this deadline at the latest.",
    )
    evictionRate: float = Field(
        500,
        ge=0,
        description="Connections per second a stopping broker pod (rolling update, scale-down, node drain) "
        "tells to use another server (MQTT 5: DISCONNECT 0x9C), so its clients move to the other pods "
        "gradually, with their sessions; 0: all at once. A pod with more connections than evictionRate * "
        "(terminationGracePeriodSeconds - 5) closes the rest at its deadline.",
    )
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec, description=doc(RebalanceSpec))
    eventLog: EventLogSpec = Field(default_factory=EventLogSpec, description=EventLogSpec.__doc__)  # type: ignore[valid-type]
    logLevel: Literal["debug", "info", "warning", "error"] = Field("info", description="Broker log level.")


# ------------------------------------------------------------------------------------------- statuses
class Condition(CrdModel):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Ready, Progressing, ConfigApplied, Degraded, StoreReady, Accepted or Applied."
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    observedGeneration: int | None = Field(None, description="The generation the condition is about.")
    lastTransitionTime: str = Field(description="When status last changed (RFC 3339).")


class PodReport(CrdModel):
    """What one broker pod reports in Redis (keys.nodeinfo: fmq:nodeinfo:{<pod>})."""

    name: str
    configHash: str | None = Field(None, description="Hash of the config the broker applied.")
    connections: int = 0
    sessions: int = 0


class RebalancePodStatus(CrdModel):
    """One pod giving connections away."""

    asked: int = Field(description="Connections it was asked to let go.")
    moved: int = Field(0, description="Connections it let go so far.")


class RebalanceStatus(CrdModel):
    """The last rebalance (spec.rebalance)."""

    phase: Literal["Running", "Completed", "TimedOut", "Interrupted", "Balanced"] | None = Field(
        None,
        description="None yet; Balanced: there was nothing to move; Interrupted: a pod stopped or a "
        "rollout began.",
    )
    id: str | None = Field(None, description="The orders' id (in the brokers' logs).")
    reason: Literal["ScaleUp", "Requested"] | None = Field(None, description="Why it started.")
    requested: str | None = Field(
        None, description="The value of the fleetmq.io/rebalance annotation acted on."
    )
    replicas: int = Field(0, description="Ready pods when the fleet was last seen steady (a scale-up: more).")
    startedAt: str | None = None
    finishedAt: str | None = None
    moved: int = Field(0, description="Connections let go so far.")
    pods: dict[str, RebalancePodStatus] = Field(
        default_factory=dict, description="The pods giving connections away."
    )


class FleetZoneStatus(CrdModel):
    """One zone as this fleet serves it."""

    generation: int = Field(description="MqttZone generation in the rendered config.")
    appliedGeneration: int | None = Field(
        None, description="Generation applied by every pod (the lowest any pod runs); null if unknown."
    )
    podsApplied: int = Field(0, description="Pods running the rendered generation.")


class StoreStatus(CrdModel):
    """The fleet's Redis: its pods (managed) and what the brokers report of it."""

    mode: Literal["sentinel", "cluster", "standalone"] = Field(
        description="Topology: sentinel (replication watched by Sentinel), cluster, or standalone (one server)."
    )
    managed: bool = Field(description="Whether the operator runs it.")
    readyPods: int | None = Field(None, description="Managed Redis pods (servers and sentinels) ready.")
    wantedPods: int | None = Field(None, description="Managed Redis pods (servers and sentinels) wanted.")
    primary: str | None = Field(
        None, description="HOST:PORT the brokers write to (the most of them, if they disagree for a moment)."
    )
    failovers: int = Field(0, description="Most failovers a broker saw since it started.")
    replicasInSync: int | None = Field(
        None, description="Replicas in sync with the primary, the fewest any broker saw; null if unknown."
    )


class BrokerFleetStatus(CrdModel):
    """Observed state of the fleet."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(0, description="Broker pods that exist.")
    readyReplicas: int = Field(0, description="Broker pods that are ready.")
    selector: str = Field("", description="Label selector of the broker pods (scale subresource).")
    configHash: str | None = Field(None, description="Hash of the rendered config the pods should report.")
    zoneCount: int = Field(0, description="Zones served.")
    zones: dict[str, FleetZoneStatus] = Field(default_factory=dict, description="Per zone generations.")
    pods: list[PodReport] = Field(default_factory=list, description="Per pod applied config and load.")
    connections: int = Field(0, description="Client connections over all pods.")
    sessions: int = Field(0, description="Sessions over all pods.")
    store: StoreStatus | None = Field(None, description=doc(StoreStatus))
    rebalance: RebalanceStatus | None = Field(None, description=doc(RebalanceStatus))


class MqttBridgeStatus(CrdModel):
    """Observed state of the bridge, from the broker pods' reports."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    leader: str | None = Field(None, description="The broker pod forwarding the bridge.")
    connected: bool = Field(False, description="Whether the leader's connection to the remote is up.")
    queueMessages: int = Field(0, description="Messages waiting for the remote (the leader's count).")
    forwarded: int = Field(
        0, description="Messages the remote acknowledged, over all pods since they started."
    )
    dropped: dict[str, int] = Field(default_factory=dict, description="Messages not passed on, by reason.")
    lastError: str | None = Field(None, description="Why the last connection to the remote ended or failed.")


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


class MqttZoneStatus(CrdModel):
    """Observed state of the zone."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    appliedGeneration: int | None = Field(None, description="Generation applied by every pod of the fleet.")
    podGenerations: dict[str, int] = Field(default_factory=dict, description="Generation each pod applied.")
