"""What the management API takes and answers: pydantic models that validate requests, shape answers and
make the OpenAPI document (api.openapi), so the three cannot disagree."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..banned import Ban, BanKind

MAX_LIMIT = 1000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(_Model):
    """RFC 9457 problem details: every error of the API."""

    type: str = Field("about:blank", description="A URI naming the kind of problem")
    title: str = Field(description="The HTTP status's phrase")
    status: int
    detail: str = Field(description="What was wrong, naming the field or parameter")
    instance: str = Field("", description="The request's path")


class Node(_Model):
    node: str
    status: Literal["running", "unreachable"] = Field(
        description="running: its heartbeat lasts; unreachable: registered, heartbeat lapsed"
    )
    connections: int
    sessions: int
    version: str
    config_hash: str = Field(description="The hash of the config it applied")
    uptime_s: float | None = Field(None, description="Seconds since it started, as it last reported")
    delivered: int = Field(0, description="Messages delivered since it started (a rate between two reads)")
    reported_at: float | None = Field(None, description="Unix time of the figures")


class NodeList(_Model):
    data: list[Node]


class Page(_Model):
    page: int = Field(ge=1)
    limit: int = Field(ge=1, le=MAX_LIMIT)
    count: int = Field(ge=0, description="Matching items over all pages")


class Client(_Model):
    """A client of the fleet: connected, or a persistent session waiting for it."""

    clientid: str
    username: str | None
    node: str | None = Field(description="The node it is connected to (none: offline)")
    zone: str
    connected: bool
    peerhost: str | None = Field(description="Its address (the PROXY protocol's, if the listener has it)")
    proto_ver: int | None = Field(description="3, 4 (3.1.1) or 5")
    keepalive: int | None
    connected_at: float | None = Field(description="Unix time of its CONNECT")
    subscriptions_cnt: int
    inflight_cnt: int = Field(description="Deliveries sent and not acknowledged yet (offline: 0)")
    mqueue_len: int = Field(description="Deliveries waiting (offline: all the session keeps)")
    expiry_interval: float = Field(description="Session expiry interval, seconds")


class ClientList(_Model):
    data: list[Client]
    meta: Page


class Delivery(_Model):
    topic: str
    qos: int
    packet_id: int | None = Field(description="Of a delivery in flight")
    payload_size: int


class Subscription(_Model):
    topic: str = Field(description="The topic filter")
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


class SubscriptionList(_Model):
    data: list[Subscription]


class ClientDetail(Client):
    """A client with its session: what it is sent (inflight), what waits (queue), and the QoS 2 packet
    ids it sent that await PUBREL; lists cut at 100 entries."""

    awaiting_rel_cnt: int
    subscriptions: list[Subscription]
    inflight: list[Delivery]
    mqueue: list[Delivery]


class ClientQuery(_Model):
    """GET /api/v1/clients: filters, then a page of the result in client id order."""

    zone: str | None = None
    username: str | None = None
    node: str | None = None
    connected: bool | None = None
    clientid: str | None = Field(None, description="A prefix of the client id")
    page: int = Field(1, ge=1)
    limit: int = Field(100, ge=1, le=MAX_LIMIT)


class KickQuery(_Model):
    session: Literal["keep", "discard"] = Field(
        "keep", description="discard: the session ends too (its next CONNECT gets session present 0)"
    )


def query_schema(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model as OpenAPI parameters."""
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema["properties"].items()
    ]


class Subscriber(_Model):
    clientid: str
    qos: int
    no_local: bool
    retain_as_published: bool
    subscription_id: int | None
    shared: bool = Field(description="Through a shared subscription (one member of its group gets it)")


class SubscriberList(_Model):
    data: list[Subscriber]


class TopicQuery(_Model):
    topic: str = Field(min_length=1, description="A topic name: who would receive a message on it")

    @field_validator("topic")
    @classmethod
    def _name(cls, v: str) -> str:
        if "+" in v or "#" in v:
            raise ValueError("a topic name, not a filter: no + or #")
        return v


class RetainedQuery(_Model):
    topic: str = Field("#", min_length=1, description="A topic filter")
    page: int = Field(1, ge=1)
    limit: int = Field(100, ge=1, le=MAX_LIMIT)


class RetainedMessage(_Model):
    topic: str
    qos: int
    payload: str = Field(description="base64")
    payload_size: int
    published_at: float = Field(description="Unix time")
    expires_at: float | None


class RetainedList(_Model):
    data: list[RetainedMessage]
    meta: Page


class PublishProperties(_Model):
    """The MQTT 5 properties a publisher may give (forwarded as a client's would be)."""

    payload_format_indicator: Literal[0, 1] | None = None
    message_expiry_interval: int | None = Field(None, ge=0, le=2**32 - 1)
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: str | None = Field(None, description="base64")
    user_properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("response_topic")
    @classmethod
    def _response_topic(cls, v: str | None) -> str | None:
        if v is not None and (not v or "+" in v or "#" in v):
            raise ValueError("a topic name: not empty, no + or #")
        return v

    @field_validator("correlation_data")
    @classmethod
    def _b64(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                base64.b64decode(v, validate=True)
            except binascii.Error as e:
                raise ValueError(f"not base64: {e}") from e
        return v


class PublishRequest(_Model):
    """POST /api/v1/publish. For QoS 1 and 2 the answer comes once the message is stored, with the
    guarantee a client's PUBACK has; a request sent again is another message."""

    topic: str = Field(min_length=1, max_length=65535)
    payload: str = ""
    payload_encoding: Literal["plain", "base64"] = "plain"
    qos: Literal[0, 1, 2] = 0
    retain: bool = False
    properties: PublishProperties = Field(default_factory=PublishProperties)

    @field_validator("topic")
    @classmethod
    def _name(cls, v: str) -> str:
        if "+" in v or "#" in v:
            raise ValueError("a topic name, not a filter: no + or #")
        if v.startswith("$"):
            raise ValueError("topics starting with $ are the server's (MQTT 4.7.2)")
        if "\0" in v:
            raise ValueError("no NUL character")
        return v

    @model_validator(mode="after")
    def _payload(self) -> PublishRequest:
        if self.payload_encoding == "base64":
            try:
                base64.b64decode(self.payload, validate=True)
            except binascii.Error as e:
                raise ValueError(f"payload: not base64: {e}") from e
        return self

    def payload_bytes(self) -> bytes:
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode()


class Published(_Model):
    matched: int = Field(description="Sessions the message was routed to")


class BanRequest(_Model):
    """POST /api/v1/banned: `until` (Unix time) or `duration` (seconds), or neither for a ban without end."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: BanKind = Field(alias="as")
    who: str = Field(min_length=1, max_length=65535)
    reason: str = Field("", max_length=1024)
    until: float | None = Field(None, gt=0)
    duration: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_end(self) -> BanRequest:
        if self.until is not None and self.duration is not None:
            raise ValueError("until or duration, not both")
        return self

    def ban(self, by: str, now: float) -> Ban:
        until = self.until if self.until is not None else (now + self.duration if self.duration else None)
        if until is not None and until <= now:
            raise ValueError(f"until: {until} is in the past")
        return Ban(kind=self.kind, who=self.who, reason=self.reason, by=by, at=now, until=until)


class BannedList(_Model):
    data: list[Ban]


class TraceRequest(_Model):
    """POST /api/v1/traces: a client id's packets, or the PUBLISHes on a topic filter, for `duration`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    clientid: str | None = Field(None, min_length=1)
    topic: str | None = Field(None, min_length=1, description="A topic filter")
    duration: float = Field(300, gt=0, le=24 * 3600, description="Seconds")
    payload_limit: int = Field(256, ge=0, le=65536, description="Payload bytes kept per packet")

    @model_validator(mode="after")
    def _one_target(self) -> TraceRequest:
        if (self.clientid is None) == (self.topic is None):
            raise ValueError("clientid or topic, one of them")
        return self


class Trace(_Model):
    name: str
    kind: Literal["clientid", "topic"]
    filter: str
    start: float
    end: float
    payload_limit: int
    status: Literal["running", "stopped"]
    records: int = Field(description="Records kept (JSON lines at GET /api/v1/traces/{name})")


class TraceList(_Model):
    data: list[Trace]


class NodeZones(_Model):
    node: str
    config_hash: str
    zones: dict[str, dict[str, Any]] = Field(description="Each zone's settings as applied (secrets hidden)")


class ZonesAnswer(_Model):
    data: list[NodeZones]


class Bridge(_Model):
    bridge: str
    node: str
    leader: bool
    connected: bool
    queue: int
    forwarded: int
    last_error: str | None
    dropped: dict[str, int]


class BridgeList(_Model):
    data: list[Bridge]
