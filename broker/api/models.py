"""What the management API takes and answers: pydantic models that validate requests, shape answers and
make the OpenAPI document (api.openapi), so the three cannot disagree."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
