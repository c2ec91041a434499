"""Every Redis key and pub/sub channel name of a fleet, in one place for Python and Lua alike.

A session's keys share the hash tag ``{client_id}`` so that they live in one Redis Cluster slot and one
script can change them together; everything else is fleet-wide, spread over slots where it is busy
(retained messages in buckets, the event log in partitions). Other programs read some of these (the operator a node's report, the
pipeline the event log), so they import this module, not the broker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

PREFIX = "fmq"
SLOTS = REDIS_CLUSTER_HASH_SLOTS

#: the retained message of each topic (hash topic -> packed message), in buckets by topic, so that a
#: Redis Cluster spreads them (and their writes) over its shards
RETAINED_BUCKETS = 64
#: where retained messages were kept before the buckets (moved into them at start)
RETAINED = f"{PREFIX}:retained"


def retained_bucket(topic: str) -> str:
    return retained_buckets()[key_slot(topic.encode()) % RETAINED_BUCKETS]


@functools.cache
def retained_buckets() -> tuple[str, ...]:
    return tuple(f"{PREFIX}:retained:{{r{n}}}" for n in range(RETAINED_BUCKETS))


def slot_of(key: str | bytes) -> int:
    """The Redis Cluster slot of a key (its hash tag's, if it has one)."""
    return int(key_slot(key.encode() if isinstance(key, str) else key))


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """For every slot, a short hash tag that lands in it (found once by trying t0, t1, ...)."""
    tags: list[str | None] = [None] * SLOTS
    missing, i = SLOTS, 0
    while missing:
        tag = f"t{i}"
        slot = slot_of("{" + tag + "}")
        if tags[slot] is None:
            tags[slot] = tag
            missing -= 1
        i += 1
    return tuple(t for t in tags if t is not None)


@dataclass(frozen=True)
class Channels:
    """Where a fleet's pub/sub messages go.

    On one Redis (standalone or Sentinel), classic channels: fleet events (wire.FleetEvent) on ``EVENTS``,
    a node's messages (wire.NodeMessage) on ``fmq:node:<node>``. On a Redis Cluster, sharded ones (Redis 7
    SPUBLISH, served by the shard of their slot, never broadcast over the cluster bus): a script runs in
    its session's slot and may publish only in that slot, so fleet events go to that slot's channel
    ``fmq:ev:{<tag>}`` and wakes to ``fmq:w:{<tag>}:<node>`` (the tag lands in the slot), which every
    node subscribes to on every shard; messages a node sends itself (handovers) go to ``fmq:node:{<node>}``.
    """

    sharded: bool

    @property
    def publish(self) -> str:
        """The command that publishes to these channels."""
        return "SPUBLISH" if self.sharded else "PUBLISH"

    def events(self, slot: int) -> str:
        return f"{PREFIX}:ev:{{{_slot_tags()[slot]}}}" if self.sharded else EVENTS

    def wakes(self, slot: int) -> str:
        """Prefix of the channel the node a session is connected to is woken on (the script appends it)."""
        return f"{PREFIX}:w:{{{_slot_tags()[slot]}}}:" if self.sharded else NODE_CHANNEL_PREFIX

    def node(self, node_id: str) -> str:
        return f"{NODE_CHANNEL_PREFIX}{{{node_id}}}" if self.sharded else NODE_CHANNEL_PREFIX + node_id

    def of_session(self, client_id: str) -> list[str]:
        """The two channels a session's scripts publish to, as they take them: events, wakes prefix."""
        slot = slot_of(session_keys(client_id)[META])
        return [self.events(slot), self.wakes(slot)]

    def subscriptions(self, node_id: str, slots: range | list[int]) -> list[str]:
        """What a node listens to for the given slots (on one Redis: every slot, the two channels)."""
        if not self.sharded:
            return [EVENTS, self.node(node_id)]
        return [c for s in slots for c in (self.events(s), self.wakes(s) + node_id)]

    def to_node(self, channel: bytes) -> bool:
        """Whether a message on `channel` is addressed to one node (a wake, a handover), not the fleet."""
        return channel.startswith(b"fmq:w:") or channel.startswith(NODE_CHANNEL_PREFIX.encode())


#: fleet-wide pub/sub channel of route, session and retained changes on one Redis (Channels)
EVENTS = f"{PREFIX}:events"
#: the ids of the nodes that registered (set); a member whose alive key lapsed is dead
NODES = f"{PREFIX}:nodes"
#: the fleet's bans (hash: <as>:<who> -> banned.Ban as JSON); every node reads it with its heartbeat
BANNED = f"{PREFIX}:banned"
#: the fleet's packet traces (hash: name -> trace.TraceSpec as JSON); every node reads it with its heartbeat
TRACES = f"{PREFIX}:traces"


def trace_stream(name: str) -> str:
    """What a trace recorded, as JSON lines from every node (a stream, trimmed to trace.STREAM_MAX)."""
    return f"{PREFIX}:trace:{{{name}}}"


# The five keys of one session, in the order the store's scripts take them.
SESSION_PARTS = ("m", "s", "q", "i", "r")
META, SUBSCRIPTIONS, QUEUE, JOURNAL, AWAITING_REL = range(5)


def session_keys(client_id: str) -> list[str]:
    """``m`` meta hash (epoch, owner node, zone, limits, will), ``s`` subscriptions (filter -> packed
    options), ``q`` deliveries queued by other nodes, ``i`` the journal (message id -> order, packet id,
    stage, message), ``r`` incoming QoS 2 packet ids awaiting PUBREL."""
    tag = f"{PREFIX}:{{{client_id}}}"
    return [f"{tag}:{part}" for part in SESSION_PARTS]


#: SCAN pattern of every session's subscriptions (the fleet's route table at start)
SUBSCRIPTIONS_PATTERN = f"{PREFIX}:{{*}}:s"


#: SCAN pattern of every session's meta hash (the management API's list of sessions)
META_PATTERN = f"{PREFIX}:{{*}}:m"


def client_of_meta_key(key: str) -> str:
    return key[len(PREFIX) + 2 : key.rindex("}:m")]


def client_of_subscriptions_key(key: str) -> str:
    """The client id in a key that SUBSCRIPTIONS_PATTERN matched."""
    return key[len(PREFIX) + 2 : key.rindex("}:s")]


#: prefix of a node's own pub/sub channel (wire.NodeMessage: wakes, handovers; see Channels)
NODE_CHANNEL_PREFIX = f"{PREFIX}:node:"


# A node's own keys share the hash tag {<node>}: one slot (its channel's on a Redis Cluster, Channels.node).
def alive(node_id: str) -> str:
    """A node's heartbeat: set with a TTL, refreshed while the node runs."""
    return f"{PREFIX}:alive:{{{node_id}}}"


def nodeinfo(node_id: str) -> str:
    """What a node reports to the operator (hash: config_hash, connections, sessions, store_primary,
    store_failovers, store_replicas_in_sync, ts_ms)."""
    return f"{PREFIX}:nodeinfo:{{{node_id}}}"


def rebalance(node_id: str) -> str:
    """The operator's order to a node to move some of its clients elsewhere (rebalance.Order, with a TTL)."""
    return f"{PREFIX}:rebalance:{{{node_id}}}"


def node_sessions(node_id: str) -> str:
    """The clients whose sessions a node owns (set), for releasing them if it dies."""
    return f"{PREFIX}:nodesess:{{{node_id}}}"


def reap_lock(node_id: str) -> str:
    """Taken by the one node that cleans up after a dead one."""
    return f"{PREFIX}:reap:{{{node_id}}}"


def user_connections(zone: str, username: str) -> str:
    """One user's connections in a zone, over the fleet (hash: client id -> the node instance holding it;
    store.SessionStore.take_connection). One key, one slot, whatever the username holds."""
    return f"{PREFIX}:uconn:{{{zone}\0{username}}}"


#: prefix of a fleet's event log (``fmq:events`` is the pub/sub channel above, hence another name)
EVENT_STREAM_PREFIX = f"{PREFIX}:eventlog:"
#: the streams a fleet's event log is split into: enough that each primary of a cluster gets its share of
#: the fleet's busiest writes, few enough that a batch still takes few EVALs and a reader few calls
EVENT_PARTITIONS = 16


@functools.cache
def event_streams(fleet: str) -> tuple[str, ...]:
    """The fleet's event log: EVENT_PARTITIONS streams ``fmq:eventlog:<fleet>:{<tag>}``, partition p's tag
    landing in slot (2p + 1) * SLOTS / (2 * EVENT_PARTITIONS), so the partitions sit evenly over the slot
    range and any even split of it (a Redis Cluster's) gives each primary its share. None takes the name
    of the single stream of old (``event_stream``): that name hashes to a slot picked by the fleet's name,
    and a reader of it alone would quietly see a sixteenth of the events."""
    event_stream(fleet)  # (checks the name)
    if "{" in fleet or "}" in fleet:
        raise ValueError(f"a fleet name has no braces (it goes in front of a hash tag), got {fleet!r}")
    tags = _slot_tags()
    step = SLOTS // EVENT_PARTITIONS
    return tuple(
        f"{EVENT_STREAM_PREFIX}{fleet}:{{{tags[p * step + step // 2]}}}" for p in range(EVENT_PARTITIONS)
    )


def event_stream(fleet: str) -> str:
    """The fleet's event log as it was before partitions, one stream: readers drain what older brokers left
    there."""
    if not fleet:
        raise ValueError(
            f"the event log needs a fleet name (its streams are {EVENT_STREAM_PREFIX}<fleet>:...)"
        )
    return EVENT_STREAM_PREFIX + fleet
