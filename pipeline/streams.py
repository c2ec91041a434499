"""A fleet's event log as its readers see it: the brokers' partition streams (``keys.event_streams``) and
the single stream brokers wrote before partitions (``keys.event_stream``), on one Redis or spread over a
Redis Cluster's shards. Each stream is read on its own (a cluster serves them from different primaries,
and no command may name keys of two slots); stream ids order entries within one stream only."""

from __future__ import annotations

from typing import Any

import redis
from fleetmq.broker.store import keys
from redis.cluster import RedisCluster

Client = redis.Redis | RedisCluster


def log_keys(fleet: str) -> tuple[str, ...]:
    """The stream of old first (what an upgraded fleet left there is read too), then the partitions."""
    return (keys.event_stream(fleet), *keys.event_streams(fleet))


def part_name(fleet: str, key: str) -> str:
    """A stream's short, stable name for file names: ``p00``..``p15``; "" for the stream of old (its files
    keep the names an earlier exporter gave them)."""
    partitions = keys.event_streams(fleet)
    return f"p{partitions.index(key):02d}" if key in partitions else ""


def connect(url: str, **kwargs: Any) -> Client:
    """A client of the Redis at ``url``: a cluster client when that server is a Redis Cluster node (any
    node's URL will do), so readers need no other setting than the URL the brokers' pipeline was given."""
    client = redis.Redis.from_url(url, **kwargs)
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except BaseException:
        client.close()
        raise
    if not enabled:
        return client
    client.close()
    return RedisCluster.from_url(url, **kwargs)
