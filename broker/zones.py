"""Zones: named groups of session settings bound to listeners (EMQX's zones).

These pydantic models are the single source of truth for configuration: the broker validates its config file
with them and the operator generates the CRD schemas from them. Names and defaults follow EMQX.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Accept EMQX-style durations ("30s", "2h", "500ms") or plain numbers of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '30s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"invalid duration {value!r}: use seconds or a string like '30s', '5m', '2h'")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]


class AclRule(BaseModel):
    """One access rule; %u and %c in the filter stand for the username and the client id."""

    model_config = ConfigDict(extra="forbid")

    permission: Literal["allow", "deny"] = Field(description="What a matching rule decides.")
    action: Literal["publish", "subscribe", "all"] = Field("all", description="The action the rule is about.")
    filter: str = Field(
        min_length=1,
        description="Topic filter the rule applies to (%u, %c and %a, the client's address, substituted)",
    )


class UsersFile(BaseModel):
    """One more users file of a zone, optionally pinned to the content it was rendered with."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="File of users and salted password hashes.")
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 of the content the config expects: until the file has it (a mounted Secret "
        "arrives after the ConfigMap, or before), the node keeps the config it runs, so a config and its "
        "users are applied together.",
    )


JwtAlgorithm = Literal["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512"]


def _asymmetric() -> list[JwtAlgorithm]:
    return ["RS256", "ES256"]


class JwtAuthentication(BaseModel):
    """A JSON Web Token in the CONNECT's password (or username), checked against keys the zone is given
    (EMQX's jwt authenticator). A token that verifies allows the client; one that does not denies it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mechanism: Literal["jwt"] = Field(description="jwt: a JSON Web Token checked against keys.")
    from_: Literal["password", "username"] = Field(
        "password", alias="from", description="Which CONNECT field carries the token."
    )
    algorithms: list[JwtAlgorithm] = Field(
        default_factory=_asymmetric,
        min_length=1,
        max_length=9,
        description="Signature algorithms accepted (the token's header must name one of them).",
    )
    secret_file: str | None = Field(None, description="File holding the HMAC secret of HS* tokens.")
    public_key_file: str | None = Field(None, description="PEM public key of RS*/ES* tokens.")
    jwks_file: str | None = Field(
        None, description="JSON Web Key Set file; read again when it changes (a rotated key set, no restart)."
    )
    jwks_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="JSON Web Key Set URL: fetched, kept, and fetched again every jwks_refresh, and at once "
        "for a token whose key id it does not hold (at most once a jwks_refresh_min).",
    )
    jwks_refresh: Duration = Field(300.0, gt=0, description="How often jwks_url is fetched again.")
    jwks_refresh_min: Duration = Field(
        10.0, ge=0, description="Least time between two fetches of jwks_url (an unknown key id asks for one)."
    )
    verify_claims: dict[str, str] = Field(
        default_factory=dict,
        description="Claims that must be present and equal these values (%c: the client id, %u: the "
        "username), e.g. {sub: '%c'}.",
    )
    acl_claim: str | None = Field(
        None,
        description="Claim holding the client's own ACL rules (the acl rule shape), matched before the zone's.",
    )
    disconnect_after_expire: bool = Field(
        True, description="End the connection when the token expires (MQTT 5: DISCONNECT 0x87)."
    )
    leeway: Duration = Field(0.0, ge=0, description="Clock skew allowed on exp and nbf.")

    @model_validator(mode="after")
    def _keys(self) -> JwtAuthentication:
        hmac = [a for a in self.algorithms if a.startswith("HS")]
        public = [a for a in self.algorithms if not a.startswith("HS")]
        if hmac and self.secret_file is None:
            raise ValueError(f"algorithms {hmac} need secret_file")
        if public and not (self.public_key_file or self.jwks_file or self.jwks_url):
            raise ValueError(f"algorithms {public} need public_key_file, jwks_file or jwks_url")
        if self.secret_file is not None and not hmac:
            raise ValueError("secret_file is for HS* algorithms: list one in algorithms")
        return self


class HttpAuthentication(BaseModel):
    """An HTTP service of the platform asked "may this client connect?" (EMQX's http authenticator). It
    answers JSON {"result": "allow" | "deny" | "ignore", "is_superuser": bool, "acl": [rules]}."""

    model_config = ConfigDict(extra="forbid")

    mechanism: Literal["http"] = Field(description="http: a request to an authentication service.")
    url: str = Field(pattern=r"^https?://", description="Where the request goes.")
    method: Literal["post", "get"] = Field(
        "post", description="post: the body as JSON; get: the body's fields as query parameters."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Headers sent as written.")
    header_files: dict[str, str] = Field(
        default_factory=dict,
        description="Headers whose value is read from a file (a mounted Secret: an API key never sits in "
        "the config), read again when it changes.",
    )
    body: dict[str, str] = Field(
        default_factory=lambda: {"clientid": "%c", "username": "%u", "password": "%P", "peerhost": "%a"},
        description="Fields sent; %c client id, %u username, %P password, %a the client's address.",
    )
    timeout: Duration = Field(
        2.0, gt=0, description="A request not answered by then counts as the service unavailable: denied."
    )
    cache_ttl: Duration = Field(
        0.0,
        ge=0,
        description="How long an answer is reused for the same client id and credentials; 0 = not reused.",
    )
    cache_size: int = Field(10000, ge=1, description="Answers kept at most (the oldest go first).")
    acl_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Where the clients this service allowed are authorized: asked (method, headers and timeout "
        "as above) once per action and topic, with the fields clientid, username, peerhost, action "
        '(publish or subscribe) and topic; it answers JSON {"result": "allow" | "deny" | "ignore"} '
        "(ignore: the ACL rules decide). Answers are reused for cache_ttl. One that cannot answer denies.",
    )


Authentication = Annotated[JwtAuthentication | HttpAuthentication, Field(discriminator="mechanism")]


class UserQuota(BaseModel):
    """One user's quotas, in place of the zone's (an MqttUser's quotas; Strimzi's KafkaUser has them)."""

    model_config = ConfigDict(extra="forbid")

    max_publish_rate: float | None = Field(None, ge=0, description="PUBLISH packets a second a connection.")
    max_publish_bytes_rate: float | None = Field(
        None, ge=0, description="PUBLISH payload bytes a second a connection."
    )
    max_subscriptions: int | None = Field(None, ge=0, description="Subscriptions a client.")
    max_connections: int | None = Field(
        None, ge=0, description="Connections of this user at once, over the whole fleet."
    )


class ZoneSettings(BaseModel):
    """Session and keep-alive settings of one zone; every field has EMQX's default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_inflight: int = Field(
        32,
        ge=0,
        le=65535,
        description="Inflight Window length: unacknowledged QoS1/2 deliveries to one client. 0 = no limit. "
        "For MQTT 5 the window is min(max_inflight, the client's Receive Maximum).",
    )
    max_mqueue_len: int = Field(
        1000,
        ge=0,
        description="Message Queue length per session. 0 = no limit. When full, one message goes (mqueue_overflow).",
    )
    max_mqueue_bytes: int = Field(
        0,
        ge=0,
        description="Bytes the Message Queue holds at most (its messages' payloads and topics; in Redis, "
        "as stored); 0 = no limit. Beyond it, messages go as mqueue_overflow says.",
    )
    mqueue_overflow: Literal["dropOldest", "dropNew"] = Field(
        "dropOldest",
        description="Which message goes when the Message Queue is full: the oldest (EMQX's way) or the new one.",
    )
    mqueue_store_qos0: bool = Field(True, description="Queue QoS0 messages for offline persistent sessions.")
    retry_interval: Duration = Field(
        30.0,
        description="Resend an unacknowledged PUBLISH (DUP=1) or PUBREL after this long (MQTT 3.1.1 sessions; "
        "MQTT 5 only with retry_v5).",
    )
    retry_v5: bool = Field(
        False,
        description="Also resend on a timer to MQTT 5 clients (the spec forbids it [MQTT-4.4.0-1]; opt-in).",
    )
    max_awaiting_rel: int = Field(
        100,
        ge=0,
        description="Incoming QoS2 packet ids awaiting PUBREL per client; 0 = no limit. Beyond it a PUBLISH "
        "is refused (MQTT 5: PUBREC 0x93).",
    )
    await_rel_timeout: Duration = Field(
        300.0, description="An incoming QoS2 message awaiting PUBREL longer than this is discarded."
    )
    server_keepalive: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="If set, overrides the client's Keep Alive (sent as Server Keep Alive in an MQTT 5 CONNACK).",
    )
    keepalive_backoff: float = Field(
        0.75,
        gt=0,
        description="The connection closes after keepalive * backoff * 2 seconds of silence (0.75 = 1.5x).",
    )
    session_expiry_interval: Duration = Field(
        7200.0,
        description="Cap on the session expiry a client may ask for; MQTT 3 persistent sessions expire after it.",
    )
    max_packet_size: int = Field(
        1024 * 1024, ge=64, le=268435455, description="Larger packets are refused (MQTT 5: DISCONNECT 0x95)."
    )
    max_topic_alias: int = Field(
        65535, ge=0, le=65535, description="Topic Alias Maximum announced to MQTT 5 clients."
    )
    max_clientid_len: int = Field(65535, ge=23, le=65535, description="Longest accepted client identifier.")
    receive_maximum: int = Field(
        65535,
        ge=1,
        le=65535,
        description="Receive Maximum announced to MQTT 5 clients: concurrent QoS1/2 PUBLISHes they may send us.",
    )
    idle_timeout: Duration = Field(
        15.0, gt=0, description="Close a connection that sends no CONNECT this long."
    )
    allow_anonymous: bool = Field(True, description="Accept connections without a username.")
    max_connections: int = Field(0, ge=0, description="Connections per node in this zone; 0 = no limit.")
    max_conn_rate: float = Field(
        0.0, ge=0, description="CONNECTs per second per node in this zone; 0 = no limit."
    )
    max_publish_rate: float = Field(
        0.0, ge=0, description="PUBLISH packets per second per connection; 0 = no limit."
    )
    max_publish_bytes_rate: float = Field(
        0.0,
        ge=0,
        description="PUBLISH payload bytes per second per connection; 0 = no limit. Beyond it MQTT 5 "
        "publishes are refused (0x97), MQTT 3 clients are slowed down.",
    )
    max_subscriptions: int = Field(
        0, ge=0, description="Subscriptions per client; 0 = no limit. Beyond it a filter is refused (0x97)."
    )
    max_connections_per_user: int = Field(
        0,
        ge=0,
        description="Connections of one username at once, over the whole fleet; 0 = no limit. Beyond it a "
        "CONNECT is refused (0x97; MQTT 3: server unavailable). Clients without a username are not counted.",
    )
    users_file: str | None = Field(
        None,
        description="File of users and salted password hashes (fleetmq-broker passwd); a mounted Secret.",
    )
    users_files: list[UsersFile] = Field(
        default_factory=list,
        description="More users files, read after users_file; a username in several counts as the last "
        "file has it. The operator renders its MqttUsers into one.",
    )
    acl: list[AclRule] = Field(
        default_factory=list, description="Ordered access rules; the first match wins."
    )
    user_acl: dict[str, list[AclRule]] = Field(
        default_factory=dict,
        description="Rules of single users (by username), matched before the zone's acl (first match wins).",
    )
    user_quotas: dict[str, UserQuota] = Field(
        default_factory=dict,
        description="Quotas of single users (by username), in place of the zone's max_publish_rate, "
        "max_publish_bytes_rate, max_subscriptions and max_connections_per_user (0: no limit).",
    )
    cert_users: dict[str, str] = Field(
        default_factory=dict,
        description="Username of a client whose verified certificate has this common name, on listeners "
        "with peer_cert_as_username: cn (a common name not listed is the username itself).",
    )
    certificate_users: Literal["any", "known"] = Field(
        "any",
        description="any: a verified certificate is the user its common name maps to, known or not. known: "
        "only a user the zone knows (in cert_users, or a username of its users files); another certificate "
        "is refused (0x87), and a connected client whose certificate's user goes away in a reload is "
        "disconnected (0x87): removing the user revokes the certificate.",
    )
    acl_default: Literal["allow", "deny"] = Field("allow", description="Permission when no ACL rule matches.")
    authentication: list[Authentication] = Field(
        default_factory=list,
        description="Authenticators tried in order at CONNECT; each allows, denies or passes to the next. "
        "When every one passes (or there is none), users_file, users_files and certificates decide as "
        "before. One that cannot answer denies.",
    )

    def quota(self, username: str | None) -> tuple[float, float, int]:
        """(max_publish_rate, max_publish_bytes_rate, max_subscriptions) for a client of this user."""
        q = self.user_quotas.get(username) if username is not None else None
        if q is None:
            return self.max_publish_rate, self.max_publish_bytes_rate, self.max_subscriptions
        return (
            self.max_publish_rate if q.max_publish_rate is None else q.max_publish_rate,
            self.max_publish_bytes_rate if q.max_publish_bytes_rate is None else q.max_publish_bytes_rate,
            self.max_subscriptions if q.max_subscriptions is None else q.max_subscriptions,
        )

    def connections_quota(self, username: str | None) -> int:
        """How many connections this username may have at once in the fleet (0: no limit, and none for
        a client without a username)."""
        if username is None:
            return 0
        q = self.user_quotas.get(username)
        if q is None or q.max_connections is None:
            return self.max_connections_per_user
        return q.max_connections

    def keepalive_timeout(self, keepalive: int) -> float:
        """Seconds of silence after which a connection with this Keep Alive is closed (0 = never)."""
        return keepalive * self.keepalive_backoff * 2


#: EMQX's two stock zones; a config that omits a field of these gets these values.
DEFAULT_ZONES: dict[str, dict[str, Any]] = {
    "default": {},
    "external": {"max_inflight": 32, "max_mqueue_len": 1000},
    "internal": {"max_inflight": 128, "max_mqueue_len": 10000},
}


def zone_defaults(name: str) -> dict[str, Any]:
    return dict(DEFAULT_ZONES.get(name, {}))
