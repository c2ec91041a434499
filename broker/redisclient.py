"""Connections to the session store's Redis, whatever its topology (config.RedisStoreConfig): one server
(url), or a primary with replicas watched by Sentinel, whose current primary every new connection asks the
sentinels for, so a node follows a failover without a restart.

Every connection is named after the node (CLIENT LIST shows which node holds it) and never retries a
command on its own: a command whose reply was lost may have run, and only the caller knows whether running
it again is harmless (RedisStore._execute).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from .config import RedisStoreConfig

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
        raise ValueError(f"cannot read the Redis password file {path}: {e.strerror}") from e


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def connection_kwargs(cfg: RedisStoreConfig, name: str) -> dict[str, Any]:
    """What every connection to the store's Redis servers is opened with."""
    kwargs: dict[str, Any] = {
        "decode_responses": False,
        "health_check_interval": 5,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "retry_on_timeout": False,
        "client_name": name,
    }
    password = read_secret(cfg.password_file)
    if password is not None:
        kwargs["password"] = password
    if cfg.username is not None:
        kwargs["username"] = cfg.username
    return kwargs


class StoreConnections:
    """The client of the store's Redis and, for Sentinel, where its primary is."""

    def __init__(self, cfg: RedisStoreConfig, name: str) -> None:
        self.config = cfg
        self.topology = cfg.topology
        self._primary: str | None = None
        self.failovers = 0
        kwargs = connection_kwargs(cfg, name)
        self.sentinel: Sentinel | None = None
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
                [_address(n) for n in s.nodes], sentinel_kwargs=sentinel_kwargs, db=cfg.db, **kwargs
            )
            self.redis: aioredis.Redis = self.sentinel.master_for(s.master)
        elif cfg.url is not None:
            self.redis = aioredis.from_url(cfg.url, **kwargs)
        else:
            raise ValueError("store.cluster: not supported by this client")

    @property
    def pool(self) -> ConnectionPool:
        return self.redis.connection_pool

    def new_pool(self) -> ConnectionPool:
        """A separate pool to the same primary (the event log's own connection)."""
        if self.sentinel is not None:
            assert self.config.sentinel is not None
            kwargs = {k: v for k, v in self.pool.connection_kwargs.items() if k != "connection_pool"}
            return SentinelConnectionPool(  # type: ignore[no-untyped-call]  # unannotated in redis-py
                self.config.sentinel.master, self.sentinel, **kwargs
            )
        return ConnectionPool(connection_class=self.pool.connection_class, **self.pool.connection_kwargs)

    def primary(self) -> str | None:
        """The primary this node writes to (HOST:PORT), as far as it knows; None before it first asked.
        A change from one primary to another is a failover: counted and logged."""
        if isinstance(self.pool, SentinelConnectionPool):
            address = self.pool.master_address
            current = f"{address[0]}:{address[1]}" if address else None
        else:
            kw = self.pool.connection_kwargs
            current = (
                f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}" if "host" in kw else kw.get("path")
            )
        if current is not None and current != self._primary:
            if self._primary is not None:
                self.failovers += 1
                log.warning("the store's primary moved from %s to %s", self._primary, current)
            self._primary = current
        return self._primary

    async def close(self) -> None:
        await self.redis.aclose()
