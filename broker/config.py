"""The broker config file: the contract between the operator and a broker node.

One YAML file validated by these models; `--listen HOST:PORT` is shorthand for one tcp listener in zone
`default`. Errors name the field path (``zones.external.max_inflight``) so a bad file is fixed at a glance.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .bridges import BridgeConfig, check_bridges
from .zones import DEFAULT_ZONES, Duration, ZoneSettings, zone_defaults


class ConfigError(Exception):
    """A config file that cannot be used; the message names every offending field path."""


def parse_bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryStoreConfig(_Model):
    kind: Literal["memory"] = "memory"


def _host_port(value: str) -> str:
    host, port = parse_bind(value)
    if not value.rpartition(":")[0]:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return f"{host}:{port}"


class SentinelConfig(_Model):
    """Redis replication watched by Sentinel: the nodes write to the primary the sentinels name, and follow
    it through a failover without a restart."""

    nodes: list[str] = Field(min_length=1, description="Sentinels to ask for the primary, HOST:PORT each")
    master: str = Field(min_length=1, description="Name the sentinels monitor the primary under")
    password_file: str | None = Field(
        None, description="File holding the sentinels' own password, if they require one"
    )

    @field_validator("nodes")
    @classmethod
    def _check_nodes(cls, nodes: list[str]) -> list[str]:
        return [_host_port(n) for n in nodes]


class RedisClusterConfig(_Model):
    """A Redis Cluster: sessions spread over its shards by their hash tag."""

    nodes: list[str] = Field(
        min_length=1, description="Some nodes of the cluster, HOST:PORT each (the rest is discovered)"
    )

    @field_validator("nodes")
    @classmethod
    def _check_nodes(cls, nodes: list[str]) -> list[str]:
        return [_host_port(n) for n in nodes]


class RedisStoreConfig(_Model):
    """Sessions in Redis: one server (url), a primary with replicas watched by Sentinel, or a Redis
    Cluster; exactly one of the three."""

    kind: Literal["redis"]
    url: str | None = Field(
        None, pattern=r"^(rediss?|unix)://", description="One Redis server: redis://[:password@]host:port/db"
    )
    sentinel: SentinelConfig | None = Field(None, description=SentinelConfig.__doc__)
    cluster: RedisClusterConfig | None = Field(None, description=RedisClusterConfig.__doc__)
    db: int = Field(
        0, ge=0, description="Database number with sentinel (a url names its own; a cluster has only 0)"
    )
    username: str | None = Field(None, min_length=1, description="Redis ACL user (default: the default user)")
    password_file: str | None = Field(
        None,
        description="File holding the Redis password (mounted from a Secret; never inline in the config)",
    )
    wait_replicas: int = Field(0, ge=0, description="Acks also wait for this many Redis replicas (WAIT).")
    wait_timeout_ms: int = Field(
        1000, ge=1, description="How long a write waits for wait_replicas; past it, it counts as failed"
    )
    connect_wait_ms: int = Field(
        5000,
        ge=0,
        description="How long a CONNECT waits for a store that does not answer (restarting, failing over) "
        "before the client is refused as server unavailable; 0 refuses at once",
    )

    @model_validator(mode="after")
    def _one_topology(self) -> RedisStoreConfig:
        given = [name for name in ("url", "sentinel", "cluster") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "store: set exactly one of url, sentinel, cluster"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.cluster is not None and self.db:
            raise ValueError("store.db: a Redis Cluster has only database 0")
        return self

    @property
    def topology(self) -> Literal["standalone", "sentinel", "cluster"]:
        if self.sentinel is not None:
            return "sentinel"
        return "cluster" if self.cluster is not None else "standalone"


class ListenerConfig(_Model):
    name: str = Field(min_length=1, description="Listener name, unique in the config")
    zone: str = Field("default", description="Zone whose settings the listener's clients get")
    bind: str = Field(description="HOST:PORT to listen on")
    protocol: Literal["tcp", "ws", "tls", "wss"] = Field(
        "tcp", description="MQTT over TCP, WebSocket, TLS or WebSocket over TLS"
    )
    path: str = Field("/mqtt", pattern=r"^/\S*$", description="URL path of a ws/wss listener")
    certfile: str | None = Field(None, description="PEM certificate (chain) of a tls/wss listener")
    keyfile: str | None = Field(None, description="PEM private key of a tls/wss listener")
    cafile: str | None = Field(None, description="PEM CA bundle to verify client certificates against")
    verify_peer: bool = Field(False, description="Require a client certificate signed by cafile")
    peer_cert_as_username: Literal["cn"] | None = Field(
        None,
        description="cn: a client with a verified certificate is authenticated by it, as the user its common "
        "name maps to (the zone's cert_users, else the common name itself); its CONNECT username and "
        "password are not used",
    )
    proxy_protocol: bool = Field(
        False,
        description="Expect a PROXY protocol header (v1 or v2, from a load balancer) before the client's "
        "bytes (on tls and wss listeners, before the TLS handshake): the client's address is the one it "
        "carries.",
    )
    proxy_protocol_timeout: Duration = Field(
        3.0, gt=0, description="A connection whose PROXY header has not come by then is closed."
    )
    transport: Literal["auto", "epoll", "loop"] = Field(
        "auto",
        description="What carries a connection's bytes. epoll: fleetmq's own transport, one epoll set for "
        "the node's sockets (about 0.3 KB of memory per connection, against 1.2 KB for the event loop's; "
        "tcp and ws listeners, on Linux); loop: the event loop's transports; auto: epoll where it can, "
        "the loop's for tls and wss listeners and where the platform has no epoll.",
    )

    @model_validator(mode="after")
    def _check_transport(self) -> ListenerConfig:
        if self.transport == "epoll" and self.protocol in ("tls", "wss"):
            raise ValueError(
                f"transport epoll carries tcp and ws listeners only, not {self.protocol}: TLS is the event "
                "loop's (transport auto or loop)"
            )
        return self

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, value: str) -> str:
        parse_bind(value)
        return value

    @property
    def address(self) -> tuple[str, int]:
        return parse_bind(self.bind)


def _optional_bind(value: str | None) -> str | None:
    if value is not None:
        parse_bind(value)
    return value


#: a HOST:PORT to serve on, or none (off)
OptionalBind = Annotated[str | None, AfterValidator(_optional_bind)]


class MetricsConfig(_Model):
    bind: OptionalBind = Field(None, description="HOST:PORT serving /metrics, /healthz, /readyz")


class ApiConfig(_Model):
    """The management API and web console (docs/api.md): any node answers for the whole fleet. Every
    request carries an API key of `keys_file` (`fleetmq-broker apikey`); there is no anonymous access."""

    bind: OptionalBind = Field(None, description="HOST:PORT serving /api/v1 and the console at /; none: off")
    keys_file: str | None = Field(
        None, description="The API keys (YAML, hashes only); read again when it changes"
    )

    @model_validator(mode="after")
    def _keys_with_bind(self) -> ApiConfig:
        if self.bind is not None and not self.keys_file:
            raise ValueError("keys_file: needed with bind (the API has no anonymous access)")
        return self


class FlappingConfig(_Model):
    """Flapping detection (EMQX's flapping_detect): a client id that connects more than `max_count`
    times within `window` on one node is banned fleet-wide for `ban_time` (CONNACK 0x8A; in the
    management API's banned list, by `flapping`). Off by default."""

    enabled: bool = False
    max_count: int = Field(15, ge=1, description="CONNECTs allowed within the window")
    window: Duration = Field(60.0, gt=0, description="The sliding window CONNECTs are counted over")
    ban_time: Duration = Field(300.0, gt=0, description="How long a flapping client id stays banned")


class ShutdownConfig(_Model):
    """How a stopping node lets its clients go (SIGTERM: a rolling upgrade, a scale-down, a node drain).

    Evicting them all at once sends every client to the other nodes in the same second, where they all
    take their sessions over at once; a paced eviction (EMQX's connection eviction rate) spreads that out.
    Read when the node stops: a change needs no restart."""

    eviction_rate: float = Field(
        0,
        ge=0,
        description="Connections per second told to use another server (MQTT 5: DISCONNECT 0x9C) while the "
        "node stops; 0: all at once (0x8B Server shutting down)",
    )
    timeout: Duration = Field(
        10.0,
        gt=0,
        description="How long a stopping node may take; clients still connected then are closed (0x8B)",
    )


class WriteBuffersConfig(_Model):
    """What a node holds for clients that read slower than it writes to them: bytes handed to a connection
    that its socket has not taken yet. Past either limit a client counts as congested: QoS 0 deliveries to
    it are dropped (counted, reason queue_full), QoS 1/2 wait in its Message Queue (max_mqueue_len), the
    retained messages of its new subscriptions wait, until its socket drains. Applies at the next restart."""

    connection: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes buffered for one connection beyond which it is congested (the socket's "
        "high-water mark; it is free again once under a quarter of it)",
    )
    node: int = Field(
        128 * 1024 * 1024,
        ge=1024 * 1024,
        description="Bytes buffered for all the node's connections together beyond which every connection "
        "still holding bytes is congested, until the total is under three quarters of it",
    )


class EventLogConfig(_Model):
    enabled: bool = Field(
        False, description="Append events to the fleet's Redis Streams (read by the pipeline)"
    )
    max_len: int = Field(1_000_000, ge=1, description="Approximate length the stream is trimmed to")
    sample: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Fraction of messages whose per-message events (publish_in, deliver, ack, retransmit) "
        "are kept; the same messages on every node, so their events stay together",
    )
    max_rate: float = Field(
        2_000,
        ge=0,
        description="Per-message events a second a node logs at most: past it, fewer messages are sampled "
        "(zone_config records carry the rate in force) so the log never slows delivery; 0 = no cap",
    )
    fleet: str = Field(
        "fleetmq",
        min_length=1,
        pattern=r"^[^{}]+$",
        description="Fleet name; the log is the Redis streams fmq:eventlog:<fleet>:{<tag>}, one a partition",
    )
    redis_url: str | None = Field(
        None, description="Redis holding the streams (default: the session store's)"
    )


class BrokerConfig(_Model):
    node_id: str = Field(default_factory=socket.gethostname, min_length=1)
    store: MemoryStoreConfig | RedisStoreConfig = Field(
        default_factory=MemoryStoreConfig, discriminator="kind"
    )
    zones: dict[str, ZoneSettings] = Field(default_factory=lambda: _default_zones())
    listeners: list[ListenerConfig] = Field(default_factory=list)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    api: ApiConfig = Field(default_factory=ApiConfig, description=ApiConfig.__doc__)
    flapping: FlappingConfig = Field(default_factory=FlappingConfig, description=FlappingConfig.__doc__)
    event_log: EventLogConfig = Field(default_factory=EventLogConfig)
    bridges: list[BridgeConfig] = Field(default_factory=list, description="Bridges to remote brokers")
    shutdown: ShutdownConfig = Field(default_factory=ShutdownConfig, description=ShutdownConfig.__doc__)
    write_buffers: WriteBuffersConfig = Field(
        default_factory=WriteBuffersConfig, description=WriteBuffersConfig.__doc__
    )

    @field_validator("zones", mode="before")
    @classmethod
    def _zone_defaults(cls, zones: Any) -> Any:
        """A zone named like one of EMQX's stock zones starts from that zone's defaults."""
        if not isinstance(zones, dict):
            return zones
        merged = {name: dict(zone_defaults(name)) for name in DEFAULT_ZONES}
        for name, settings in zones.items():
            if isinstance(settings, dict):
                merged[name] = {**zone_defaults(name), **settings}
            elif settings is None:
                merged[name] = zone_defaults(name)
            else:
                merged[name] = settings
        return merged

    @model_validator(mode="after")
    def _check_listeners(self) -> BrokerConfig:
        names: set[str] = set()
        binds: set[tuple[str, int]] = set()
        for i, listener in enumerate(self.listeners):
            if listener.zone not in self.zones:
                raise ValueError(
                    f"listeners.{i}.zone: unknown zone {listener.zone!r} (known: {sorted(self.zones)})"
                )
            if listener.name in names:
                raise ValueError(f"listeners.{i}.name: duplicate listener name {listener.name!r}")
            if listener.address in binds:
                raise ValueError(f"listeners.{i}.bind: {listener.bind} is already used by another listener")
            if listener.protocol in ("tls", "wss") and not (listener.certfile and listener.keyfile):
                raise ValueError(f"listeners.{i}: protocol {listener.protocol} needs certfile and keyfile")
            if listener.verify_peer and not listener.cafile:
                raise ValueError(
                    f"listeners.{i}.verify_peer: needs cafile to verify client certificates against"
                )
            if listener.peer_cert_as_username and not listener.cafile:
                raise ValueError(
                    f"listeners.{i}.peer_cert_as_username: needs cafile to verify client certificates against"
                )
            names.add(listener.name)
            binds.add(listener.address)
        return self

    @model_validator(mode="after")
    def _check_bridges(self) -> BrokerConfig:
        check_bridges(self.bridges, self.fleet)
        return self

    @property
    def fleet(self) -> str:
        """The fleet's name: its event log's, and the one bridges use at remotes (client ids, loop
        prevention's path)."""
        return self.event_log.fleet

    @model_validator(mode="after")
    def _check_event_log(self) -> BrokerConfig:
        if self.event_log.enabled and self.event_log.redis_url is None and self.store.kind != "redis":
            raise ValueError(
                "event_log.redis_url: the event log is Redis Streams: set event_log.redis_url or use the "
                "Redis session store"
            )
        return self

    def event_log_url(self) -> str | None:
        """Where the event log goes if not to the session store's Redis (None: there, or it is off)."""
        return self.event_log.redis_url if self.event_log.enabled else None

    def config_hash(self) -> str:
        """A stable digest of the applied config, so an operator can tell which pods run which version.

        Left out: the node id (every pod of a fleet runs one rendered config under its own name, and the
        operator computes the same digest from what it rendered) and the store, which applies only at a
        restart and whose URL may carry a password the operator injects from a Secret.
        """
        blob = json.dumps(self.model_dump(mode="json", exclude={"node_id", "store"}), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _default_zones() -> dict[str, ZoneSettings]:
    return {name: ZoneSettings(**settings) for name, settings in DEFAULT_ZONES.items()}


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"] if p not in ("memory", "redis"))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {msg}" if path and not msg.startswith(path) else msg)
    return "\n".join(lines)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def load_config(
    path: str | Path | None = None, *, overrides: dict[str, Any] | None = None, empty_ok: bool = True
) -> BrokerConfig:
    """Read and validate a config file; raise ConfigError naming each bad field. An empty file is the
    defaults, unless not `empty_ok` (a reload: the file may have been caught mid-write)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from e
        if loaded is None and not empty_ok:
            # (a file caught mid-write by a reload reads empty: applied, its defaults would close every
            # configured listener; the last good config stays instead)
            raise ConfigError(f"{path}: the file is empty (kept the running config)")
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    overrides = dict(overrides or {})
    store = overrides.pop("store", None)
    event_log = overrides.pop("event_log", None)
    data.update(overrides)
    if event_log is not None:  # --event-log turns the file's event log on, keeping its settings
        data["event_log"] = {**_mapping(data.get("event_log")), **event_log}
    if store is not None:  # --redis-url / --redis-wait-replicas refine the file's store, not replace it
        base = _mapping(data.get("store"))
        data["store"] = {**base, **store} if base.get("kind", "redis") == "redis" else store
    try:
        return BrokerConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from e
