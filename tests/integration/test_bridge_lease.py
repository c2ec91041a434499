"""A bridge's lease (broker.bridge.runtime.Lease) against a real redis-server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from broker.bridge.runtime import LEASE_TTL, Lease, lease_key
from broker.bridges import BridgeConfig

CFG = BridgeConfig.model_validate(
    {"name": "cloud", "remote": {"host": "127.0.0.1", "port": 1}, "forwards": [{"filter": "up/#"}]}
)


async def test_a_lease_found_held_by_this_node_is_renewed_before_it_leads(redis_server):
    """The node's own SET whose reply timed out (or a restart within the TTL) leaves the lease with this
    node's id and moments to live: it leads only once it renewed it, so the first renewal a second later
    finds it still there and the bridge is not dropped the moment it starts (seen under load in CI)."""
    client = aioredis.Redis(port=redis_server.port)
    try:
        key = lease_key(CFG)
        await client.set(key, "node-a", px=300)
        lease = Lease(CFG, "node-a", lambda _key: client)
        await asyncio.wait_for(lease.hold(), 5)
        assert await client.pttl(key) > (LEASE_TTL - 1) * 1000
        await asyncio.sleep(0.5)  # past the 300 ms it had
        assert await client.get(key) == b"node-a"

        await client.set(key, "node-b", px=60_000)  # another node's: not taken
        other = asyncio.ensure_future(lease.hold())
        await asyncio.sleep(1.5)
        assert not other.done()
        await client.delete(key)
        await asyncio.wait_for(other, 10)
        assert await client.get(key) == b"node-a"
    finally:
        await client.aclose()


async def test_a_lease_whose_set_replies_time_out_is_still_taken_before_it_lapses(redis_server, monkeypatch):
    """Every SET NX of the lease reaches Redis only after the client gave up on it (a slow store): the
    lease lands, lives one TTL, and the node must see its own id there in time. It looked only after a
    lease period's sleep, so each SET landed and lapsed unseen, forever (CI, under load); now it looks
    every RENEW_EVERY and leads. Scaled: TTL 1 s, looks every 0.2 s, replies given up after 0.5 s, SETs
    landing after 1 s."""
    from broker.bridge import runtime
    from broker.store import keys
    from tests.redisproxy import RedisProxy

    monkeypatch.setattr(runtime, "LEASE_TTL", 1.0)
    monkeypatch.setattr(runtime, "RENEW_EVERY", 0.2)
    proxy = RedisProxy(redis_server.port)
    # (no retries, as the broker's connections: store.connections.connection_kwargs)
    client = aioredis.Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    direct = aioredis.Redis(port=redis_server.port)
    try:
        # another node is the bridge's preferred one: this one takes a free lease after a lease period
        other = next(
            n for n in (f"node-{i}" for i in range(100)) if runtime.preferred("cloud", ["node-a", n]) == n
        )
        await direct.sadd(keys.NODES, "node-a", other)
        proxy.delay(1.0, b":lease", b"NX")
        lease = Lease(CFG, "node-a", lambda _key: client)
        await asyncio.wait_for(lease.hold(), 10)
        assert await direct.get(lease_key(CFG)) == b"node-a"
        keeper = asyncio.ensure_future(lease.keep())
        await asyncio.sleep(2.5)  # renewals (not delayed) keep it
        assert not lease.lost.is_set() and await direct.get(lease_key(CFG)) == b"node-a"
        keeper.cancel()
    finally:
        await client.aclose()
        await direct.aclose()
        proxy.close()
