"""The application message as it travels from a publisher through the broker to subscribers.

A message is immutable once published: every subscriber gets the same object. Per-subscriber details
(QoS, packet id, DUP, retain-as-published, subscription ids, topic alias) are applied when it is encoded.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from .codec import MQTT5, Prop, Publish, encode_properties, encode_publish, publish_parts

# Properties a broker forwards unchanged from publisher to subscriber [MQTT-3.3.2-*]. Topic alias and
# subscription identifiers are per connection; message expiry is rewritten with the time left.
FORWARDED_PROPS: tuple[Prop, ...] = (
    Prop.PAYLOAD_FORMAT_INDICATOR,
    Prop.CONTENT_TYPE,
    Prop.RESPONSE_TOPIC,
    Prop.CORRELATION_DATA,
    Prop.USER_PROPERTY,
)

# Unique per message across the fleet (the journal of a session keys its deliveries by it).
_ids = itertools.count(random.getrandbits(62) | 1)


class Message:
    """One published application message."""

    __slots__ = (
        "_parts",
        "_plain",
        "_props_b",
        "expires_at",
        "msg_id",
        "payload",
        "props",
        "qos",
        "receipt",
        "retain",
        "sender",
        "sender_epoch",
        "topic",
        "topic_b",
        "ts",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        props: dict[int, Any] | None = None,
        sender: str = "",
        expiry: float | None = None,
        ts: float | None = None,
        msg_id: int = 0,
        topic_b: bytes | None = None,
    ) -> None:
        self.topic = topic
        self.topic_b = topic_b if topic_b is not None else topic.encode()
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.props = props or None  # forwarded v5 properties only
        self.sender = sender
        #: the publisher's session epoch when it was routed from a journaled session (0: none): a store
        #: refuses to queue it once that session is another node's (a fenced publisher sends it again)
        self.sender_epoch = 0
        #: a QoS 2 message of a journaled publisher on a store without cross-slot transactions: (the
        #: publisher session's incarnation, its receipt number), stored with its awaiting-PUBREL record
        #: before it is routed; a session keeps the highest it got per incarnation and drops repeats
        self.receipt: tuple[str, int] | None = None
        self.ts = ts if ts is not None else time.time()
        self.expires_at = self.ts + expiry if expiry is not None else None
        self.msg_id = msg_id or next(_ids)
        self._props_b: bytes | None = None
        #: encodings made once for every subscriber alike: a QoS 0 packet, a QoS 1/2 packet's header
        #: and property block around its packet id (codec.publish_parts), by variant (_variant)
        self._plain: dict[int, bytes] | None = None
        self._parts: dict[int, tuple[bytes, bytes]] | None = None

    @classmethod
    def from_publish(
        cls,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        props: dict[int, Any],
        sender: str,
        ts: float,
        topic_b: bytes | None = None,
    ) -> Message:
        """The message a PUBLISH (or a will) carries, received at wall-clock time `ts`."""
        forwarded = None
        expiry = None
        if props:
            forwarded = {k: v for k, v in props.items() if k in FORWARDED_PROPS} or None
            expiry = props.get(Prop.MESSAGE_EXPIRY_INTERVAL)
        return cls(topic, payload, qos, retain, forwarded, sender, expiry, ts, 0, topic_b)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def encode(
        self,
        version: int,
        qos: int,
        retain: bool,
        packet_id: int = 0,
        dup: bool = False,
        sub_ids: tuple[int, ...] | None = None,
        now: float = 0.0,
        alias: int = 0,
        alias_new: bool = True,
    ) -> bytes:
        """The PUBLISH bytes for one subscriber: what is the same for every subscriber is encoded once per
        message (a QoS 0 packet; a QoS 1/2 packet but its packet id)."""
        if version < MQTT5 or (sub_ids is None and self.expires_at is None and not alias):
            key = _variant(version, qos, retain, dup)
            if qos == 0:
                cache = self._plain  # (the cache hit, inline: every subscriber after the first takes it)
                if cache is not None:
                    data = cache.get(key)
                    if data is not None:
                        return data
                return self._cached(version, retain)
            parts = self._parts
            if parts is None:
                parts = self._parts = {}
            else:
                hit = parts.get(key)
                if hit is not None:
                    head, block = hit
                    data = head + packet_id.to_bytes(2, "big")
                    return data + block + self.payload if block else data + self.payload
            encoded = self.props_bytes() if version >= MQTT5 else None
            head, block = parts[key] = publish_parts(
                self.topic_b, len(self.payload), qos, retain, dup, encoded, version
            )
            return head + packet_id.to_bytes(2, "big") + block + self.payload
        props: dict[int, Any] = dict(self.props) if self.props else {}
        if self.expires_at is not None:
            props[Prop.MESSAGE_EXPIRY_INTERVAL] = max(0, int(self.expires_at - (now or time.time())))
        if sub_ids:
            props[Prop.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)
        topic_b = self.topic_b
        if alias:
            props[Prop.TOPIC_ALIAS] = alias
            if not alias_new:
                topic_b = b""
        return encode_publish(
            topic_b, self.payload, qos, retain, dup, packet_id, encode_properties(props), version
        )

    def publish(self, qos: int, retain: bool, packet_id: int, dup: bool) -> Publish:
        """The PUBLISH for an in-process client (a bridge's link): the packet itself, never encoded."""
        props = self.props or {}
        if self.expires_at is not None:
            props = {**props, Prop.MESSAGE_EXPIRY_INTERVAL: max(0, int(self.expires_at - time.time()))}
        return Publish(self.topic, self.payload, qos, retain, dup, packet_id, props)

    def props_bytes(self) -> bytes:
        if self._props_b is None:
            self._props_b = encode_properties(self.props) if self.props else b""
        return self._props_b

    def drop_encodings(self) -> None:
        """Forget the encodings cached for its subscribers (a retained message, which may stay in the
        retained store for long: kept, they would double what the store holds)."""
        self._plain = None
        self._parts = None

    def _cached(self, version: int, retain: bool) -> bytes:
        key = _variant(version, 0, retain, False)
        cache = self._plain
        if cache is None:
            cache = self._plain = {}
        else:
            data = cache.get(key)
            if data is not None:
                return data
        props = self.props_bytes() if version >= MQTT5 else None
        data = cache[key] = encode_publish(self.topic_b, self.payload, 0, retain, False, 0, props, version)
        return data

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {self.payload[:32]!r}, qos={self.qos}, retain={self.retain}, id={self.msg_id})"


def _variant(version: int, qos: int, retain: bool, dup: bool) -> int:
    """The key of a cached encoding: what, besides the packet id, makes two subscribers' packets differ."""
    return version << 4 | qos << 2 | (2 if retain else 0) | (1 if dup else 0)


class Delivery:
    """One message on its way to one session: what the Message Queue and the Inflight Window hold.

    `qos` is the granted QoS (min of publish and subscription); `stage` is 0 while a PUBLISH awaits
    PUBACK/PUBREC and 1 once PUBREL was sent and PUBCOMP is awaited.
    """

    __slots__ = ("msg", "order", "packet_id", "qos", "retain", "sent_at", "stage", "sub_ids")

    def __init__(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...] | None = None) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.packet_id = 0
        self.stage = 0
        self.sent_at = 0.0
        self.order = -1  # position in its session's delivery order (for a journaled session's store)

    def __repr__(self) -> str:
        return f"Delivery({self.msg!r}, qos={self.qos}, pid={self.packet_id}, stage={self.stage})"


class Will:
    """A will on its way to being published, with what decides whether it still may be when it is due:
    its client's zone and username (the client id is the message's sender)."""

    __slots__ = ("msg", "username", "zone")

    def __init__(self, msg: Message, zone: str, username: str | None) -> None:
        self.msg = msg
        self.zone = zone
        self.username = username

    def __repr__(self) -> str:
        return f"Will({self.msg!r}, zone={self.zone!r}, username={self.username!r})"
