"""What a fleet reports about itself: event kinds, the fields of an event record, and why messages drop.

One vocabulary for the broker's metrics and event log, the PySpark pipeline and the Grafana dashboards:
they import it (never the writer), and tests fail when one of them knows a drop reason the others don't.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

CONNECT = "connect"
DISCONNECT = "disconnect"
TAKEOVER = "takeover"
PUBLISH_IN = "publish_in"
DELIVER = "deliver"
ACK = "ack"
RETRANSMIT = "retransmit"
DROP = "drop"
INFLIGHT_FULL = "inflight_full"
KEEPALIVE_TIMEOUT = "keepalive_timeout"
AWAITING_REL_TIMEOUT = "awaiting_rel_timeout"
#: a bridge's connection to its remote ended or failed (reason: BridgeCloseReason; zone: the bridge's
#: session, ``$bridge:<name>``, whose ``ack`` events are its forwarded messages and whose ``drop`` events
#: carry a BridgeDropReason when the bridge, not its queue, dropped one)
BRIDGE_RECONNECT = "bridge_reconnect"
#: the zone (and client id) of a bridge's session: this prefix, then the bridge's name
BRIDGE_ZONE_PREFIX = "$bridge:"
#: written by the log itself at start, every ``config_interval`` and on ``set_zones``: a zone's limits
ZONE_CONFIG = "zone_config"
EVENTS = (
    CONNECT,
    DISCONNECT,
    TAKEOVER,
    PUBLISH_IN,
    DELIVER,
    ACK,
    RETRANSMIT,
    DROP,
    INFLIGHT_FULL,
    KEEPALIVE_TIMEOUT,
    AWAITING_REL_TIMEOUT,
    BRIDGE_RECONNECT,
    ZONE_CONFIG,
)
#: per-message events, sampled together by msg_id
SAMPLED_EVENTS = frozenset({PUBLISH_IN, DELIVER, ACK, RETRANSMIT})

#: Fields of a stream entry, in order. Absent fields are left out of the entry (None when read).
#: eid: unique event id ("<run>-<seq>", run random per EventLog); ts_ms: epoch milliseconds with a
#: fractional part (sub-ms latencies matter); client: CLIENT_HASH of the client id.
FIELDS = (
    "eid",
    "ts_ms",
    "node",
    "zone",
    "event",
    "client",
    "msg_id",
    "topic",
    "qos",
    "packet_id",
    "bytes",
    "reason",
    "inflight_len",
    "mqueue_len",
    "max_inflight",
    "max_mqueue_len",
    "sample",
)


def client_hash(client_id: str) -> str:
    """Stable across nodes and restarts, so one client's events join; the id itself never leaves the node."""
    return hashlib.blake2b(client_id.encode(), digest_size=8).hexdigest()


#: A message is kept when ``(msg_id * SAMPLE_MIX) & SAMPLE_MASK`` is below the threshold: a node numbers its
#: messages in sequence and multiplying by 2^16 / golden ratio spreads any run of ids evenly over the 16 bits
#: (a Weyl sequence), so every stretch of traffic is sampled at the same rate; a lower threshold keeps a
#: subset of what a higher one keeps; and the data path's test is a multiply, an AND and a comparison.
SAMPLE_MIX = 40503
SAMPLE_MASK = 0xFFFF
SAMPLE_ALL = SAMPLE_MASK + 1


def sample_threshold(sample: float) -> int | None:
    """The bound under which a message id's low bits are kept; None keeps everything."""
    if not 0.0 <= sample <= 1.0:
        raise ValueError(f"event log sample must be within 0..1, got {sample!r}")
    return None if sample >= 1.0 else int(sample * SAMPLE_ALL)


def sampled(msg_id: int, threshold: int | None) -> bool:
    """Whether a message's events are kept: a pure function of msg_id, so every node agrees."""
    return threshold is None or ((msg_id * SAMPLE_MIX) & SAMPLE_MASK) < threshold


class DropReason(StrEnum):
    """Why a message did not reach a subscriber (or was not accepted from a publisher): the ``reason``
    label of ``fleetmq_messages_dropped_total`` and of ``drop`` events."""

    QUEUE_FULL = "queue_full"
    EXPIRED = "expired"
    TOO_LARGE = "too_large"
    AWAITING_REL_TIMEOUT = "awaiting_rel_timeout"
    QOS0_OFFLINE = "qos0_offline"
    NO_SUBSCRIBERS = "no_subscribers"
    NOT_AUTHORIZED = "not_authorized"
    AWAITING_REL_FULL = "awaiting_rel_full"
    RATE_LIMITED = "rate_limited"
    PAYLOAD_FORMAT_INVALID = "payload_format_invalid"

    @property
    def lost(self) -> bool:
        """Whether the drop loses a message the broker had accepted for a subscriber (the alerting kind),
        rather than refusing a publish (the publisher is told, or not acknowledged) or finding nobody to
        deliver to (no subscribers, or none allowed to read it)."""
        return self in _LOST

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


class BridgeDropReason(StrEnum):
    """Why a bridge did not pass a message on: the ``reason`` label of
    ``fleetmq_bridge_messages_dropped_total`` and of ``bridge_drop`` events."""

    QUEUE_FULL = "queue_full"  # the bridge's queue was full (its overflow policy chose this one)
    EXPIRED = "expired"  # its message expiry passed while it waited for the remote
    LOOP = "loop"  # it went through the destination before (path, hop count)
    TOO_LARGE = "too_large"  # larger than the remote's Maximum Packet Size
    QOS0_OFFLINE = "qos0_offline"  # QoS 0 while the remote was away and storeQos0 is off
    # persist: false (everything goes as QoS 0): it came while the remote was away and storeQos0 is off
    NOT_PERSISTED = "not_persisted"
    EXCLUDED = "excluded"  # matched an exclude, or no forward any more (a changed config)
    UNMAPPED = "unmapped"  # fewer topic levels than its destination template takes
    REMOTE_REFUSED = "remote_refused"  # the remote acknowledged it with an error reason code


#: Bridge drops that lose a message someone meant to pass on (loop and excluded are by design).
BRIDGE_LOST = frozenset(set(BridgeDropReason) - {BridgeDropReason.LOOP, BridgeDropReason.EXCLUDED})


class BridgeCloseReason(StrEnum):
    """Why a bridge's connection to its remote ended or failed: the ``reason`` label of
    ``fleetmq_bridge_reconnects_total`` and of ``bridge_reconnect`` events."""

    CONNECT_ERROR = "connect_error"  # the remote could not be reached
    REFUSED = "refused"  # it refused the connection (CONNACK reason)
    REMOTE_CLOSED = "remote_closed"  # it closed the connection or sent DISCONNECT
    ACK_TIMEOUT = "ack_timeout"  # it stopped acknowledging (ack_timeout)
    KEEPALIVE_TIMEOUT = "keepalive_timeout"  # it went silent
    PROTOCOL_ERROR = "protocol_error"
    FLEET = "fleet"  # the bridge's session in the fleet went away (store trouble, another leader)
    STOPPED = "stopped"  # this node stopped leading the bridge, or stopped


_LOST = frozenset(
    {
        DropReason.QUEUE_FULL,
        DropReason.EXPIRED,
        DropReason.TOO_LARGE,
        DropReason.AWAITING_REL_TIMEOUT,
        DropReason.QOS0_OFFLINE,
    }
)
_DESCRIPTIONS = {
    DropReason.QUEUE_FULL: "Message Queue full, the oldest dropped",
    DropReason.EXPIRED: "message expiry passed before delivery",
    DropReason.TOO_LARGE: "larger than the client's Maximum Packet Size",
    DropReason.AWAITING_REL_TIMEOUT: "incoming QoS 2 awaited PUBREL longer than await_rel_timeout",
    DropReason.QOS0_OFFLINE: "QoS 0 for an offline session that does not queue it",
    DropReason.NO_SUBSCRIBERS: "no subscription matched",
    DropReason.NOT_AUTHORIZED: "ACL: a publish, a will or a delivery denied",
    DropReason.AWAITING_REL_FULL: "incoming QoS 2 refused, max_awaiting_rel reached",
    DropReason.RATE_LIMITED: "publish refused over max_publish_rate or max_publish_bytes_rate",
    DropReason.PAYLOAD_FORMAT_INVALID: "payload not UTF-8 although the publisher said it was",
}
