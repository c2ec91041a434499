"""Connections to the session store's Redis, whatever its topology (config.RedisStoreConfig), as shards: a
primary and the hash slots it serves.

- One server (url): one shard, every slot.
- A primary with replicas watched by Sentinel: one shard, whose client asks the sentinels for the primary
  on every new connection, so a node follows a failover without a restart.
- A Redis Cluster: one shard per primary, from CLUSTER SHARDS, each with a client of its own. The map is
  read again when a shard answers MOVED or goes away (a replica took over), and a primary that moved is a
  failover, logged and counted.

The store sends each shard its own pipeline (one MULTI/EXEC per slot on a cluster, with WAIT on the
same connection), which is why this is not redis-py's cluster client: that one cannot wait for replicas
after a transaction, and retries what may already have run. Every connection is named after the node
(CLIENT LIST shows which node holds it) and never retries a command on its own: a command whose reply
was lost may have run, and only the caller knows whether running it again is harmless.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisError,
    TryAgainError,
)
from redis.maint_notifications import MaintNotificationsConfig

from ..config import RedisStoreConfig
from . import keys

log = logging.getLogger("fleetmq.redis")

SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0


def read_secret(path: str | None) -> str | None:
    """A password from its file (a mounted Secret), without the trailing newline editors leave."""
    if path is None:
        return None
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as e:
        raise ValueError(f"cannot read the password file {path}: {e.strerror}") from e


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def connection_kwargs(cfg: RedisStoreConfig, name: str) -> dict[str, Any]:
    """What every connection to the store's Redis servers is opened with."""
    kwargs: dict[str, Any] = {
        "decode_responses": False,
        "health_check_interval": 1,  # (a pooled connection idle that long is PINGed first: a reset one is replaced, not failed on)
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),  # (redis-py's default for Redis(host=...) retries 3 times)
        "client_name": name,
        # Maintenance notifications are Redis Enterprise's and Cloud's. Left on ("auto"), redis-py 8.1
        # stops checking a pooled connection before handing it out (redis/redis-py#4252): one Redis
        # closed while it sat idle (a restart, a failover, a proxy in between) fails the next command
        # sent on it, a commit whose clients are then disconnected for nothing.
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    password = read_secret(cfg.password_file)
    if password is not None:
        kwargs["password"] = password
    if cfg.username is not None:
        kwargs["username"] = cfg.username
    return kwargs


@dataclass(eq=False)
class Shard:
    """A primary of the store and the client that talks to it."""

    address: str
    redis: aioredis.Redis


class ClusterMapError(RedisError):
    """No node of the cluster could say which primary serves which slots."""


class StoreConnections:
    """The shards of the store's Redis and the channels its messages travel on (keys.Channels)."""

    @classmethod
    def of_url(cls, url: str, name: str) -> StoreConnections:
        """One Redis server (not the store's: the event log's own, say)."""
        return cls(RedisStoreConfig(kind="redis", url=url), name)

    def __init__(self, cfg: RedisStoreConfig, name: str) -> None:
        self.config = cfg
        self.topology = cfg.topology
        self.channels = keys.Channels(sharded=cfg.cluster is not None)
        self._kwargs = connection_kwargs(cfg, name)
        self.sentinel: Sentinel | None = None
        self.failovers = 0
        self._primaries: tuple[str, ...] = ()
        self._clients: dict[str, aioredis.Redis] = {}
        self._shards: list[Shard] = []
        self._slot_shard = array("H", bytes(2 * keys.SLOTS))  # slot -> index in _shards
        self._refreshing: asyncio.Task[bool] | None = None
        if cfg.sentinel is not None:
            s = cfg.sentinel
            sentinel_kwargs: dict[str, Any] = {
                "socket_connect_timeout": CONNECT_TIMEOUT,
                "socket_timeout": SOCKET_TIMEOUT,
                "client_name": name,
            }
            sentinel_password = read_secret(s.password_file)
            if sentinel_password is not None:
                sentinel_kwargs["password"] = sentinel_password
            self.sentinel = Sentinel(  # type: ignore[no-untyped-call]  # unannotated in redis-py
                [_address(n) for n in s.nodes], sentinel_kwargs=sentinel_kwargs, db=cfg.db, **self._kwargs
            )
            self._shards = [Shard(s.master, self.sentinel.master_for(s.master))]
        elif cfg.url is not None:
            client = aioredis.from_url(cfg.url, **self._kwargs)
            kw = client.connection_pool.connection_kwargs  # (the address without the URL's password)
            where = f"{kw['host']}:{kw.get('port', 6379)}" if "host" in kw else str(kw.get("path", "redis"))
            self._shards = [Shard(where, client)]

    # -- shards ----------------------------------------------------------------------------------
    @property
    def sharded(self) -> bool:
        return self.channels.sharded

    async def open(self) -> None:
        """Read the cluster's slot map (a single Redis has its one shard already)."""
        if self.sharded:
            await self.refresh()

    @property
    def shards(self) -> list[Shard]:
        return self._shards

    @property
    def redis(self) -> aioredis.Redis:
        """The client of a Redis that is one shard (standalone, Sentinel)."""
        assert not self.sharded, "a Redis Cluster has one client per shard"
        return self._shards[0].redis

    def shard_of_slot(self, slot: int) -> Shard:
        return self._shards[self._slot_shard[slot]]

    def shard_for(self, key: str | bytes) -> Shard:
        """The shard serving `key` (as of the last map)."""
        if not self.sharded:
            return self._shards[0]
        return self._shards[self._slot_shard[keys.slot_of(key)]]

    def slots_of(self, shard: Shard) -> list[int]:
        """The slots a shard serves (as of the last map)."""
        if not self.sharded:
            return [0]
        i = self._shards.index(shard)
        return [s for s in range(keys.SLOTS) if self._slot_shard[s] == i]

    async def refresh(self) -> bool:
        """Read the cluster's map again (once, whoever else asks meanwhile); True if a primary moved."""
        if not self.sharded:
            return False
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> bool:
        assert self.config.cluster is not None
        seeds = [*self._primaries, *self.config.cluster.nodes]
        shards = None
        error: Exception | None = None
        for address in dict.fromkeys(seeds):
            client = self._clients.get(address) or self._client(address)
            try:
                shards = await command(client, "CLUSTER SHARDS")
                break
            except (RedisError, OSError) as e:
                error = e
            finally:
                if address not in self._clients:
                    await client.aclose()
        if shards is None:
            raise ClusterMapError(f"no node of the Redis Cluster answered CLUSTER SHARDS: {error}")
        return self._adopt(shards)

    def _adopt(self, reply: list[Any]) -> bool:
        before = [self._shards[i].address for i in self._slot_shard] if self._shards else None
        primaries: list[str] = []
        slot_shard = array("H", bytes(2 * keys.SLOTS))
        for shard in reply:
            info = _pairs(shard)
            ranges = [int(s) for s in info[b"slots"]]
            if not ranges:
                continue
            address = _primary_address(info[b"nodes"])
            for a, b in zip(ranges[::2], ranges[1::2], strict=True):
                for slot in range(a, b + 1):
                    # a shard being failed over has no primary online: its slots stay where they were
                    # (their writes fail until the next map names the replica that took over)
                    where = address or (before[slot] if before else None)
                    if where is None:
                        continue
                    if where not in primaries:
                        primaries.append(where)
                    slot_shard[slot] = primaries.index(where)
        if not primaries:
            raise ClusterMapError("the Redis Cluster names no primary")
        self._shards = [Shard(a, self._clients.get(a) or self._client(a, keep=True)) for a in primaries]
        self._slot_shard = slot_shard
        moved = before is not None and any(before[s] != primaries[slot_shard[s]] for s in range(keys.SLOTS))
        if moved:
            self.failovers += 1
            log.warning(
                "the Redis Cluster's primaries are now %s (were %s)",
                ", ".join(primaries),
                ", ".join(self._primaries),
            )
        self._primaries = tuple(primaries)
        return moved

    def _client(self, address: str, keep: bool = False) -> aioredis.Redis:
        host, port = _address(address)
        client = aioredis.Redis(host=host, port=port, **self._kwargs)
        if keep:
            self._clients[address] = client
        return client

    # -- what the node reports ------------------------------------------------------------------
    def primaries(self) -> list[str]:
        """The primaries this node writes to (HOST:PORT), as far as it knows. On Sentinel, a change of
        primary is a failover: counted and logged (a cluster's are when its map is read)."""
        if self.sharded:
            return list(self._primaries)
        pool = self._shards[0].redis.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            address = pool.master_address
            current = f"{address[0]}:{address[1]}" if address else None
        else:
            kw = pool.connection_kwargs
            current = (
                f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}" if "host" in kw else kw.get("path")
            )
        if current is not None and (current,) != self._primaries:
            if self._primaries:
                self.failovers += 1
                log.warning("the store's primary moved from %s to %s", self._primaries[0], current)
            self._primaries = (current,)
        return list(self._primaries)

    def on_primary(self, connection: Any) -> bool:
        """Whether a long-lived connection (an event stream's) is still to the primary. On Sentinel, one
        made before a failover stays with the old primary, now a replica: it still answers PINGs, but
        what is published on the new primary reaches it late or never."""
        if self.sentinel is None or connection is None or getattr(connection, "host", None) is None:
            return True
        primaries = self.primaries()
        return not primaries or f"{connection.host}:{connection.port}" in primaries

    def new_pool(self, shard: Shard) -> ConnectionPool:
        """A separate pool to a shard's primary, for connections of one's own (the event log's): a slow
        batch there never delays the store's writes."""
        pool = shard.redis.connection_pool
        if self.sentinel is not None:
            assert self.config.sentinel is not None
            kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
            return SentinelConnectionPool(  # type: ignore[no-untyped-call]  # unannotated in redis-py
                self.config.sentinel.master, self.sentinel, **kwargs
            )
        return ConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)

    async def close(self) -> None:
        clients = {id(s.redis): s.redis for s in self._shards} | {id(c): c for c in self._clients.values()}
        for client in clients.values():
            await client.aclose()


#: error replies that say a command did not run where it was sent (the cluster's map changed, or is changing):
#: send it again once the map is read again. redis-py parses them into these classes, MOVED's and ASK's
#: without their prefix (str() is "SLOT HOST:PORT"), so a reply is told by its class, never its text.
REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)


def redirected(reply: Any) -> bool:
    return isinstance(reply, REDIRECTS)


def in_transition(reply: Any) -> bool:
    """A redirect that says to wait a moment first (a failover or a slot migration under way)."""
    return isinstance(reply, TryAgainError | ClusterDownError)


async def command(client: aioredis.Redis, *args: Any) -> Any:
    """One command as Redis replies to it (redis-py leaves execute_command unannotated)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


def _primary_address(nodes: list[Any]) -> str | None:
    """HOST:PORT of the online primary among a shard's nodes (its announced endpoint, else its IP)."""
    for node in map(_pairs, nodes):
        if node[b"role"] == b"master" and node[b"health"] == b"online":
            host = node.get(b"endpoint") or b""
            if host in (b"", b"?"):
                host = node[b"ip"]
            return f"{host.decode()}:{int(node[b'port'])}"
    return None


def _pairs(reply: list[Any] | dict[Any, Any]) -> dict[bytes, Any]:
    """A map in a reply (redis-py parses CLUSTER SHARDS into dicts; a flat list of field, value, ...
    otherwise) with its fields as bytes."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {k if isinstance(k, bytes) else str(k).encode(): v for k, v in items}
