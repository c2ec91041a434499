"""A bridge's lease (broker.bridge.runtime.Lease) against a real redis-server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

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
