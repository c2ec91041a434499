"""A store connection Redis reset while it sat in the pool is reconnected before use, not failed on."""

from __future__ import annotations

import asyncio

import pytest
from fleetmq.broker.config import RedisStoreConfig
from fleetmq.broker.store.connections import StoreConnections, command


@pytest.mark.parametrize("idle", [0.2, 1.5], ids=["before-health-check", "after-health-check"])
def test_a_pooled_connection_reset_while_idle_is_reconnected_not_failed_on(redis_proxy, idle):
    async def run() -> None:
        conns = StoreConnections(RedisStoreConfig(kind="redis", url=redis_proxy.url), "resets-test")
        await conns.open()
        try:
            redis = conns.redis
            pipe = redis.pipeline(transaction=False)
            pipe.set(b"k", b"1")
            pipe.get(b"k")
            assert await pipe.execute() == [True, b"1"]
            redis_proxy.drop_all()  # (an RST to the pooled connection, as a restarted Redis or proxy gives)
            await asyncio.sleep(idle)
            pipe = redis.pipeline(transaction=False)
            pipe.incr(b"n")
            assert await pipe.execute() == [1]  # sent once, on a fresh connection
            assert await command(redis, "GET", b"n") == b"1"
        finally:
            await conns.close()

    asyncio.run(run())
