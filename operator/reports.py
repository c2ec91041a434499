"""Reading what the broker pods report in the fleet's Redis (`fmq:nodeinfo:{<pod>}`), connected the way a
broker is: the store section of the rendered config, one server (url) or a primary found through Sentinel
(the broker's own StoreConnections), or a Redis Cluster (redis-py's cluster client).

The config names password files inside the broker pods; the operator has the passwords from the Secrets,
so it writes them to a private temporary file for as long as the client reads them at its creation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetmq.broker.config import RedisStoreConfig
from fleetmq.broker.rebalance import Order
from fleetmq.broker.store import keys
from fleetmq.broker.store.connections import StoreConnections
from redis.asyncio.cluster import ClusterNode, RedisCluster

TIMEOUT = 10.0  # one read of every report: the fleet's status does not wait longer


@contextlib.contextmanager
def password_file(password: str | None) -> Iterator[str | None]:
    """A file holding `password`, readable by this process only, removed on exit (None: no password)."""
    if password is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="fleetmq-operator-") as tmp:
        path = Path(tmp) / "password"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password)
        yield str(path)


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


class ReportReader:
    """A client of one fleet's Redis that reads the brokers' reports."""

    def __init__(self, store: dict[str, Any], password: str | None, sentinel_password: str | None, name: str):
        self.key = self.key_of(store, password, sentinel_password)
        self.cluster: RedisCluster | None = None
        self.conns: StoreConnections | None = None
        if store.get("cluster"):
            self.cluster = RedisCluster(
                startup_nodes=[ClusterNode(*_address(n)) for n in store["cluster"]["nodes"]],
                password=password,
                client_name=name,
                socket_timeout=2,
                socket_connect_timeout=2,
            )
            return
        with password_file(password) as pw, password_file(sentinel_password) as spw:
            cfg = {k: v for k, v in store.items() if k not in ("password_file", "cluster")}
            cfg["password_file"] = pw
            if cfg.get("sentinel"):
                cfg["sentinel"] = {**cfg["sentinel"], "password_file": spw}
            self.conns = StoreConnections(RedisStoreConfig.model_validate(cfg), name)

    @staticmethod
    def key_of(store: dict[str, Any], password: str | None, sentinel_password: str | None) -> str:
        """What a reader is for: a changed store or password takes a new one."""
        blob = json.dumps([store, password, sentinel_password], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    async def read(self, pods: list[str]) -> dict[str, dict[str, str]]:
        """pod -> its report, for the pods that have one."""
        replies = await asyncio.wait_for(self._hgetall([keys.nodeinfo(pod) for pod in pods]), TIMEOUT)
        return {
            pod: {_text(k): _text(v) for k, v in reply.items()}
            for pod, reply in zip(pods, replies, strict=True)
            if reply
        }

    async def order(self, pod: str, order: Order | None, now: float) -> None:
        """Write a pod's rebalance order (kept until it runs out), or delete it."""
        client: Any = self.cluster if self.cluster is not None else self.conns.redis  # type: ignore[union-attr]
        name = keys.rebalance(pod)
        if order is None:
            await asyncio.wait_for(client.delete(name), TIMEOUT)
        else:
            ttl = max(1, int((order.until - now) * 1000))
            await asyncio.wait_for(client.set(name, order.encode(), px=ttl), TIMEOUT)

    async def _hgetall(self, names: list[str]) -> list[dict[Any, Any]]:
        client: Any = self.cluster if self.cluster is not None else self.conns.redis  # type: ignore[union-attr]
        async with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(name)
            return list(await pipe.execute())

    async def close(self) -> None:
        if self.cluster is not None:
            await self.cluster.aclose()
        if self.conns is not None:
            await self.conns.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
