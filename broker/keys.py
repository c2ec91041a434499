"""Every Redis key and pub/sub channel name of a fleet, in one place for Python and Lua alike.

A session's keys share the hash tag ``{client_id}`` so that they live in one Redis Cluster slot and one
script can change them together; everything else is fleet-wide. Other programs read some of these (the
operator a node's report, the pipeline the event stream), so they import this module, not the broker.
"""

from __future__ import annotations

PREFIX = "fmq"

#: fleet-wide: the retained message of each topic (hash topic -> packed message)
RETAINED = f"{PREFIX}:retained"
#: fleet-wide pub/sub channel of route, session and retained changes (wire.FleetEvent)
EVENTS = f"{PREFIX}:events"
#: the ids of the nodes that registered (set); a member whose alive key lapsed is dead
NODES = f"{PREFIX}:nodes"

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


def client_of_subscriptions_key(key: str) -> str:
    """The client id in a key that SUBSCRIPTIONS_PATTERN matched."""
    return key[len(PREFIX) + 2 : key.rindex("}:s")]


#: prefix of a node's own pub/sub channel (wire.NodeMessage: wakes, handovers)
NODE_CHANNEL_PREFIX = f"{PREFIX}:node:"


def node_channel(node_id: str) -> str:
    return NODE_CHANNEL_PREFIX + node_id


def alive(node_id: str) -> str:
    """A node's heartbeat: set with a TTL, refreshed while the node runs."""
    return f"{PREFIX}:alive:{node_id}"


def nodeinfo(node_id: str) -> str:
    """What a node reports to the operator (hash: config_hash, connections, sessions, ts_ms)."""
    return f"{PREFIX}:nodeinfo:{node_id}"


def node_sessions(node_id: str) -> str:
    """The clients whose sessions a node owns (set), for releasing them if it dies."""
    return f"{PREFIX}:nodesess:{node_id}"


def reap_lock(node_id: str) -> str:
    """Taken by the one node that cleans up after a dead one."""
    return f"{PREFIX}:reap:{node_id}"


#: prefix of a fleet's event stream (``fmq:events`` is the pub/sub channel above, hence another name)
EVENT_STREAM_PREFIX = f"{PREFIX}:eventlog:"


def event_stream(fleet: str) -> str:
    if not fleet:
        raise ValueError(f"the event log needs a fleet name (the stream is {EVENT_STREAM_PREFIX}<fleet>)")
    return EVENT_STREAM_PREFIX + fleet
