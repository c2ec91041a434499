"""Bridges' settings: a fleet forwarding to and from one remote MQTT broker each (docs/design.md "Bridges").

Like zones.py, these models are the single source of truth: the broker validates the `bridges:` list of
its config file with them, and the operator derives the MqttBridge CRD from them. Defaults follow the
seed (HiveMQ Edge) where it has one; the queue is bounded where HiveMQ Edge's in-memory tier is not.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .eventschema import BRIDGE_ZONE_PREFIX
from .topic import valid_filter
from .topicmap import TEMPLATE_PATTERN, Template
from .zones import Duration, ZoneSettings

_DEFAULT_PORTS = {"tcp": 1883, "tls": 8883, "ws": 80, "wss": 443}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _filter(value: str) -> str:
    if not valid_filter(value):
        raise ValueError(f"{value!r} is not a valid MQTT topic filter")
    return value


#: The API server checks templates as Template.parse does (but for a range's order): a pattern in the
#: schema only (pydantic's own message would not say which placeholder is wrong; `_template` does).
_TEMPLATE_SCHEMA: dict[str, Any] = {"pattern": TEMPLATE_PATTERN}


def _template(value: str) -> str:
    Template.parse(value)
    return value


class BridgeTls(_Model):
    """TLS towards the remote (tls and wss transports)."""

    cafile: str | None = Field(
        None, description="PEM CA bundle to verify the remote against (default: system)"
    )
    certfile: str | None = Field(None, description="PEM client certificate, for remotes that require one")
    keyfile: str | None = Field(None, description="PEM private key of the client certificate")
    verify: bool = Field(True, description="Verify the remote's certificate and host name")
    server_name: str | None = Field(None, description="Host name to verify and send as SNI (default: host)")

    @model_validator(mode="after")
    def _pair(self) -> BridgeTls:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        return self


class BridgeRemote(_Model):
    """The remote broker and the bridge's MQTT session there (always resumed: Clean Start 0)."""

    host: str = Field(min_length=1, description="Host name or address of the remote broker")
    port: int | None = Field(
        None, ge=1, le=65535, description="Port (default: 1883, 8883, 80 or 443 by transport)"
    )
    transport: Literal["tcp", "tls", "ws", "wss"] = Field(
        "tcp", description="MQTT over TCP, TLS, WebSocket or WSS"
    )
    path: str = Field("/mqtt", pattern=r"^/\S*$", description="URL path of a ws/wss remote")
    mqtt_version: Literal[4, 5] = Field(5, description="4 for MQTT 3.1.1, 5 for MQTT 5.0")
    client_id: str | None = Field(
        None,
        min_length=1,
        max_length=65535,
        description="Client id at the remote (default: <fleet>-<bridge name>)",
    )
    session_expiry: Duration = Field(
        3600.0,
        description="Session Expiry Interval asked of an MQTT 5 remote (how long it keeps the session)",
    )
    keepalive: Duration = Field(60.0, ge=0, le=65535, description="Keep Alive sent in CONNECT")
    username: str | None = Field(None, description="User name at the remote")
    password_file: str | None = Field(
        None, description="File holding the password (the operator mounts a Secret)"
    )
    tls: BridgeTls | None = Field(None, description=BridgeTls.__doc__)
    peer_id: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^,]+$",
        description="The remote fleet's name in loop prevention's path (default: HOST:PORT)",
    )

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port or _DEFAULT_PORTS[self.transport]

    @property
    def peer(self) -> str:
        return self.peer_id or "{}:{}".format(*self.address)


class Forward(_Model):
    """Egress: local messages matching `filter` (and no exclude) go to the remote under `destination`."""

    filter: str = Field(min_length=1, description="Local topic filter of the messages to forward")
    excludes: list[str] = Field(
        default_factory=list, description="Local topic filters of messages not to forward"
    )
    destination: str = Field(
        "{#}",
        max_length=1024,
        json_schema_extra=_TEMPLATE_SCHEMA,
        description="Remote topic: text with {#} (the whole topic), {n} (level n), {n-m} and {n-#} placeholders",
    )
    max_qos: Literal[0, 1, 2] = Field(
        2, description="Highest QoS forwarded with (min of this and the published QoS)"
    )
    preserve_retain: bool = Field(True, description="Forward the retain flag as published")
    user_properties: dict[str, str] = Field(
        default_factory=dict, description="User properties added to every forwarded message (MQTT 5 remotes)"
    )

    _check_filter = field_validator("filter")(_filter)
    _check_destination = field_validator("destination")(_template)

    @field_validator("excludes")
    @classmethod
    def _check_excludes(cls, value: list[str]) -> list[str]:
        for f in value:
            _filter(f)
        return value


class Subscription(_Model):
    """Ingress: the bridge subscribes to `filter` at the remote and publishes what comes locally under
    `destination` (No Local, Retain As Published on MQTT 5 remotes)."""

    filter: str = Field(min_length=1, description="Remote topic filter to subscribe to")
    destination: str = Field(
        "{#}",
        max_length=1024,
        json_schema_extra=_TEMPLATE_SCHEMA,
        description="Local topic: text with {#} (the whole topic), {n} (level n), {n-m} and {n-#} placeholders",
    )
    max_qos: Literal[0, 1, 2] = Field(2, description="QoS subscribed with at the remote")

    _check_filter = field_validator("filter")(_filter)
    _check_destination = field_validator("destination")(_template)


class BridgeQueue(_Model):
    """What waits for the remote: one durable queue in the store, bounded, every drop counted."""

    max_length: int = Field(100_000, ge=1, description="Messages the queue holds at most")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Payload bytes the queue holds at most")
    overflow: Literal["dropOldest", "dropNew"] = Field(
        "dropOldest", description="Which message goes when the queue is full"
    )
    store_qos0: bool = Field(
        False,
        description="Keep QoS 0 messages (all messages when persist is false) in the queue while the "
        "remote is away, instead of dropping them",
    )


class Reconnect(_Model):
    """Attempt n waits min(initial_delay * 2^(n-1), max_delay) plus a random share up to `jitter` of it;
    the count resets once a connection stayed up `stable_after`."""

    initial_delay: Duration = Field(1.0, gt=0, description="Delay before the first reconnect attempt")
    max_delay: Duration = Field(120.0, gt=0, description="Longest delay between attempts")
    jitter: float = Field(0.25, ge=0.0, le=1.0, description="Random extra share of each delay (0 to 1)")
    stable_after: Duration = Field(30.0, ge=0, description="Connected this long, the delay starts over")


class LoopPrevention(_Model):
    hop_count_limit: int = Field(
        1, ge=0, description="Drop a message whose hmq-bridge-hop-count reached this (HiveMQ's; 0: no limit)"
    )


class BridgeConfig(_Model):
    """One bridge to one remote broker."""

    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="Bridge name"
    )
    remote: BridgeRemote = Field(description=BridgeRemote.__doc__)
    forwards: list[Forward] = Field(
        default_factory=list, max_length=64, description="Egress: local to remote"
    )
    subscriptions: list[Subscription] = Field(
        default_factory=list, max_length=64, description="Ingress: remote to local"
    )
    persist: bool = Field(
        True,
        description="Keep QoS 1/2 messages in the store until the remote has them; false sends everything "
        "as QoS 0 (best effort: what comes while the remote is away is dropped unless queue.storeQos0)",
    )
    queue: BridgeQueue = Field(default_factory=BridgeQueue, description=BridgeQueue.__doc__)
    max_inflight: int = Field(
        32, ge=1, le=65535, description="QoS 1/2 messages sent and not yet acknowledged"
    )
    ack_timeout: Duration = Field(
        30.0, gt=0, description="An unacknowledged message this old means the remote is stuck: reconnect"
    )
    reconnect: Reconnect = Field(default_factory=Reconnect, description=Reconnect.__doc__)
    loop_prevention: LoopPrevention = Field(default_factory=LoopPrevention, description="Loop prevention")

    @model_validator(mode="after")
    def _some_traffic(self) -> BridgeConfig:
        if not self.forwards and not self.subscriptions:
            raise ValueError("a bridge needs at least one forward or subscription")
        if self.reconnect.max_delay < self.reconnect.initial_delay:
            raise ValueError("reconnect.max_delay: shorter than reconnect.initial_delay")
        return self

    def client_id(self, fleet: str) -> str:
        return self.remote.client_id or f"{fleet}-{self.name}"

    def zone(self) -> ZoneSettings:
        """The settings of the bridge's session in the fleet: its window and queue are the bridge's (the
        link reacts to a stuck remote itself: no timed resends), and it never expires."""
        return ZoneSettings(
            max_inflight=self.max_inflight,
            max_mqueue_len=self.queue.max_length,
            max_mqueue_bytes=self.queue.max_bytes,
            mqueue_overflow=self.queue.overflow,
            mqueue_store_qos0=self.queue.store_qos0,
            retry_v5=False,
            max_awaiting_rel=0,
            session_expiry_interval=float(0xFFFFFFFF),
            max_packet_size=268435455,
        )

    @property
    def session_id(self) -> str:
        """The bridge's session in the store: clients cannot connect with a '$' client id here."""
        return f"{BRIDGE_ZONE_PREFIX}{self.name}"


def check_bridges(bridges: list[BridgeConfig], fleet: str) -> None:
    """Rules across bridges: unique names, and one session per remote and client id (two bridges sharing
    one would take the session from each other at the remote, forever)."""
    names: set[str] = set()
    sessions: dict[tuple[str, int, str], str] = {}
    for i, b in enumerate(bridges):
        if b.name in names:
            raise ValueError(f"bridges.{i}.name: duplicate bridge name {b.name!r}")
        names.add(b.name)
        key = (*b.remote.address, b.client_id(fleet))
        if key in sessions:
            raise ValueError(
                f"bridges.{i}.remote.client_id: bridge {sessions[key]!r} already connects to "
                f"{key[0]}:{key[1]} as {key[2]!r}"
            )
        sessions[key] = b.name
