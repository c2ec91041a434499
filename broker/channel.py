"""The channel (EMQX's emqx_channel): one client's MQTT protocol state machine.

Sans-I/O: it is fed bytes (`data_received`) and told what happened around it (its session opened or was
refused, the socket closed or congested, a message routed to it, its zone changed); it writes packets
through the `ChannelIO` it is given, and asks its `ChannelHost` for what lies beyond one client: opening
its session (credentials, connection limits, takeover and the store are awaited there), routing a
publish, keeping a subscription, and waiting until what a packet changed is stored before answering it.
It never awaits, runs no executor and reads no clock but the `Clock` it is given (its timers too).

It applies the EMQX delivery rules with its session: QoS 0 goes out at once, QoS 1/2 through the Inflight
Window with the Message Queue behind it, retransmission in original order. Every observable fact goes to
its zone's telemetry, once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Literal, Protocol, cast

from .auth import Access, Asked, ClientAcl
from .authn.chain import Identity
from .clock import Clock, Timer
from .codec import (
    MQTT5,
    PINGRESP_BYTES,
    RC,
    Auth,
    Connack,
    Connect,
    Disconnect,
    PacketType,
    Parser,
    Pingreq,
    Prop,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    encode,
    encode_ack,
)
from .eventschema import DropReason
from .keepalive import KeepAlive
from .limiter import TokenBucket
from .message import Delivery, Message
from .negotiation import INTERNAL, NEVER_EXPIRE, V3_CONNACK, Negotiated, Refusal, negotiate
from .router import Subscription, plain_subscription
from .session import AwaitingRelFull, Session
from .topic import is_sys, parse_share, valid_filter
from .trace import Outgoing, Tracer
from .zone import Zone
from .zones import ZoneSettings

log = logging.getLogger("fleetmq.channel")

PUBACK, PUBREC, PUBREL, PUBCOMP = PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP


# What a channel's reply waits for the store with (Channel._replies): a kind, then its data. Replies are
# held as data, in the order their packets came, not as a closure per packet.
_ACK = 0  # ptype, packet id, reason code: a publisher's PUBACK, PUBREC or PUBCOMP (counted in _acks_pending)
_ROUTE = 1  # message, packet id: a QoS 2 message whose receipt is being stored; routed, then PUBREC'd
_SEND = 2  # bytes: PUBREL, UNSUBACK
_PUBLISH = 3  # bytes, delivery, inflight: a QoS 2 PUBLISH once its packet id is stored
_SUBACK = 4  # bytes, the retained messages due: SUBACK, then those


def reason_name(code: int) -> str:
    try:
        return RC(code).name.lower()
    except ValueError:
        return f"0x{code:02x}"


class ChannelIO(Protocol):
    """What a channel needs from its transport (connection.Connection; a fake in unit tests)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class ChannelHost(Protocol):
    """What a channel asks of the broker around it (cm.ChannelManager)."""

    @property
    def durable(self) -> bool:
        """Whether writes outlive the process: then replies that depend on them wait for `after_commit`."""

    @property
    def receipts_first(self) -> bool:
        """Whether a journaled publisher's QoS 2 message is routed only once its receipt is stored
        (Message.receipt: a store whose commits are not one transaction)."""

    def open_session(self, ch: Channel, request: Negotiated) -> None:
        """Open (or take over, or resume) the session of an accepted CONNECT; answers later with
        `ch.session_opened(...)` or `ch.refuse(...)`."""

    def closed(self, ch: Channel) -> None:
        """The connection is gone: its session is parked, ended or already someone else's."""

    def publish(self, msg: Message, zone: str) -> tuple[int, bool]:
        """Route a message: (sessions matched, whether the publisher's ack must await a commit)."""

    def subscribe(self, ch: Channel, topic_filter: str, sub: Subscription) -> None: ...

    def unsubscribe(self, ch: Channel, topic_filter: str) -> None: ...

    def retained(self, topic_filter: str) -> Iterable[Message | None]:
        """The live retained messages a new subscription gets, found as they are taken (None: nothing
        found yet, a step of the search; Retained.scan)."""

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        """Call back once every write made so far is stored (True) or failed (False)."""

    def new_client_id(self) -> str:
        """An id for a client that sent none (unique in the fleet)."""

    def authorize(self, ch: Channel, asks: list[tuple[str, str]]) -> None:
        """Ask the client's authorization service (its identity's authorizer) about these (action,
        topic) pairs; answers later with `ch.authorized(...)`, a service that cannot answer denying."""


class State:
    NEW: Final = 0
    CONNECTING: Final = 1
    CONNECTED: Final = 2
    CLOSED: Final = 3


# -- publish admission: each check returns why a PUBLISH is refused, or None ------------------------------
Refused = tuple[int, DropReason, str]  # v5 reason code, drop reason, log text


def _check_payload_format(ch: Channel, p: Publish, topic: str) -> Refused | None:
    if p.properties.get(Prop.PAYLOAD_FORMAT_INDICATOR) == 1:
        try:
            p.payload.decode()
        except UnicodeDecodeError:
            return RC.PAYLOAD_FORMAT_INVALID, DropReason.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8"
    return None


def _check_publish_rate(ch: Channel, p: Publish, topic: str) -> Refused | None:
    """v5 is refused and told (v3 cannot be told, so it is slowed down instead: Channel._dispatch)."""
    bucket = ch.publish_rate
    if bucket is not None and bucket.take(ch.clock.time()):
        return RC.QUOTA_EXCEEDED, DropReason.RATE_LIMITED, "publish rate exceeded"
    return None


def _check_publish_bytes(ch: Channel, p: Publish, topic: str) -> Refused | None:
    """The zone's max_publish_bytes_rate, as _check_publish_rate does for packets."""
    bucket = ch.publish_bytes
    if bucket is not None and bucket.take(ch.clock.time(), len(p.payload)):
        return RC.QUOTA_EXCEEDED, DropReason.RATE_LIMITED, "publish bytes rate exceeded"
    return None


def _check_acl(ch: Channel, p: Publish, topic: str) -> Refused | None:
    acl = ch.acl
    if acl is not None and not acl.can_publish(topic):
        return RC.NOT_AUTHORIZED, DropReason.NOT_AUTHORIZED, "not authorized"
    return None


def _check_sys(ch: Channel, p: Publish, topic: str) -> Refused | None:
    """_check_acl for a client whose rules allow every publish but those on $SYS (no rule to match); only
    a client that published on a '$' topic gets it (Channel._bind_rules), so the others pay nothing."""
    if is_sys(topic):
        return RC.NOT_AUTHORIZED, DropReason.NOT_AUTHORIZED, "not authorized ($SYS)"
    return None


PublishCheck = Callable[["Channel", Publish, str], Refused | None]


def publish_checks(
    settings: ZoneSettings,
    acl: ClientAcl | None,
    version: int,
    dollar: bool = False,
    username: str | None = None,
) -> tuple[PublishCheck, ...]:
    """The checks a client's PUBLISH goes through: only those its zone, its user's quotas and its protocol
    call for (`dollar`: on a topic starting with '$')."""
    checks: list[PublishCheck] = []
    if version >= MQTT5:
        checks.append(_check_payload_format)
        rate, volume, _ = settings.quota(username)
        if rate:
            checks.append(_check_publish_rate)
        if volume:
            checks.append(_check_publish_bytes)
    if acl is not None and not acl.publish_open:
        checks.append(_check_acl)  # (it refuses $SYS too)
    elif acl is not None and dollar:
        checks.append(_check_sys)
    found = tuple(checks)
    return _CHECKS.setdefault(found, found)  # (one tuple per combination, not one per client)


#: every combination of publish checks made so far (a few: one per zone, quota and ACL shape)
_CHECKS: dict[tuple[PublishCheck, ...], tuple[PublishCheck, ...]] = {}


#: retained messages (or steps of their search) a new subscription gets per loop turn, and their bytes: a
#: subscription to '#' over a large retained store must not keep the node from answering everyone else, nor
#: put more than this in one turn's write buffer before its socket can say it is full
RETAINED_BATCH = 64
RETAINED_BATCH_BYTES = 256 * 1024


class RetainedRun:
    """The retained messages a new subscription still has to get: the search over the retained store,
    taken as the client takes them (Channel._pump_retained); no message is copied meanwhile."""

    __slots__ = ("guarded", "messages", "sub", "sub_ids", "topic_filter")

    def __init__(
        self, topic_filter: str, sub: Subscription, messages: Iterator[Message | None], guarded: bool
    ) -> None:
        self.topic_filter = topic_filter
        self.sub = sub
        self.messages = messages
        self.guarded = guarded  # read access is checked per message (a deny rule reaches the filter)
        self.sub_ids = (sub.sub_id,) if sub.sub_id else None


class Channel:
    __slots__ = (
        "_acks_pending",
        "_aliases_in",
        "_aliases_out",
        "_asked",
        "_backlog",
        "_checks",
        "_dollar_checks",  # the checks of a client that publishes on '$' topics
        "_expiry_timer",
        "_gated",
        "_holding",
        "_in_process",
        "_ka_timer",
        "_on_commit",
        "_rel_timer",
        "_replies",
        "_retained",
        "_retained_timer",
        "_retry_timer",
        "_stash",
        "_v3_limited",
        "_write",
        "acl",
        "cert_name",
        "clean_start",
        "client_alias_max",
        "client_id",
        "client_max_packet",
        "clock",
        "close_reason",
        "congested",
        "connected_at",
        "counted",
        "host",
        "identity",
        "io",
        "keepalive",
        "last_recv",
        "listener",
        "max_subscriptions",
        "parser",
        "peer",
        "publish_bytes",
        "publish_rate",
        "read_guard",
        "retry",
        "session",
        "settings",
        "state",
        "telemetry",
        "tracers",
        "username",
        "version",
        "will",
        "will_delay",
        "write_publish",
        "zone",
        "zone_name",
    )

    def __init__(
        self,
        host: ChannelHost,
        zone: Zone,
        io: ChannelIO,
        clock: Clock,
        peer: str = "",
        listener: str = "",
    ) -> None:
        self.host = host
        self.zone = zone
        self.zone_name = zone.name
        self.settings = zone.settings  # as this channel applied them (apply_zone takes a change)
        self.telemetry = zone.telemetry
        self.io = io
        self.clock = clock
        # An in-process client (a bridge's link) takes its PUBLISH packets as they are: no encoding here
        # for it to parse again (its IO's write_packet keeps them in order with the bytes of the rest).
        packet_out = getattr(io, "write_packet", None)
        self._in_process = packet_out is not None
        write = self._write = io.write  # (bound once: no method lookup per ack)
        self.write_publish = cast(Callable[[bytes | Publish], None], packet_out or write)
        self.peer = peer
        self.listener = listener
        self.parser = Parser(max_packet_size=self.settings.max_packet_size)
        self.state = State.NEW
        self.version = 0
        self.client_id = ""
        self.username: str | None = None
        #: the verified client certificate's common name, on a listener with peer_cert_as_username
        self.cert_name: str | None = None
        self.clean_start = True
        self.session: Session | None = None
        self.will: Message | None = None
        self.will_delay = 0.0
        self.keepalive: KeepAlive | None = None
        self.client_max_packet = 0
        self.client_alias_max = 0
        self.retry = False
        self.congested = False
        self.counted = False  # in its zone's connection count (the host counts and uncounts)
        self.close_reason: str | None = None
        self.last_recv = clock.time()
        self.connected_at = 0.0
        self.acl: ClientAcl | None = None  # the zone's rules bound to this client at CONNECT
        self.identity: Identity | None = None  # what an authenticator of the zone's chain said of it
        # Whether deliveries on the local path are checked for read access: set once a subscription
        # whose filter a deny rule reaches is made, and kept until the rules are bound again (so messages
        # already on their way through such a filter are still checked after an UNSUBSCRIBE).
        self.read_guard = False
        self.tracers: list[Tracer] | None = None  # the packet traces of this client (trace.py)
        self.publish_rate: TokenBucket | None = None
        self.publish_bytes: TokenBucket | None = None
        self._v3_limited = False  # an MQTT 3 client with a publish rate: slowed down, not refused
        self._asked: Asked | None = None  # its authorization service's answers (an identity's authorizer)
        self._gated = False  # either of those two: packets wait at _dispatch for the rate or the service
        self.max_subscriptions = 0  # the zone's, or its user's quota (0: no limit)
        self._checks: tuple[PublishCheck, ...] = ()
        self._dollar_checks: tuple[PublishCheck, ...] = ()
        self._holding = False  # catching up after opening here (Session.hold_back): nothing new goes out
        self._backlog: list[Any] | None = None  # packets held back by the publish rate
        self._aliases_in: dict[int, str] | None = None
        self._aliases_out: dict[str, int] | None = None
        self._acks_pending = 0  # publisher acks waiting in _replies
        # (made by the first reply that waits: an empty deque is a 760-byte block, and most connections
        # of a fleet are idle subscribers that never wait for the store)
        self._replies: deque[tuple[int, Any, Any, Any]] | None = None
        # (bound at the first reply that waits, then kept: the host is handed it per reply; dropped at
        # close, so that a closed channel is not kept by its own cycle until a full collection)
        self._on_commit: Callable[[bool], None] | None = None
        self._stash: list[Any] | None = None
        self._ka_timer: Timer | None = clock.call_later(self.settings.idle_timeout, self._connect_timeout)
        self._retry_timer: Timer | None = None
        self._rel_timer: Timer | None = None
        self._retained: deque[RetainedRun] | None = None  # new subscriptions' retained messages still due
        self._retained_timer: Timer | None = None
        self._expiry_timer: Timer | None = None  # its credentials' end (a token's exp)

    # ---------------------------------------------------------------------------------------------
    # input
    # ---------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.state == State.CLOSED:
            return
        self.last_recv = self.clock.time()
        error: ProtocolError | None = None
        try:
            packets = self.parser.feed(data)
        except ProtocolError as e:
            error, packets = e, e.packets  # packets before the bad one still count
        if self.parser.dollar and self._checks is not self._dollar_checks:
            self._checks = self._dollar_checks  # it publishes on '$' topics: checked from now on
        if self.tracers is not None:
            self.traced("in", packets)
        self._received(packets)
        if error is not None:
            self.protocol_error(error.reason, error.message)

    def packets_received(self, packets: list[Any]) -> None:
        """Packets from an in-process client (a bridge's link), already parsed: they skip the codec."""
        if self.state == State.CLOSED:
            return
        self.last_recv = self.clock.time()
        self._received(packets)

    def _received(self, packets: list[Any]) -> None:
        if self._backlog is not None:  # throttled: these wait behind the ones already held back
            self._backlog.extend(packets)
            return
        self._dispatch(packets)

    def _dispatch(self, packets: list[Any]) -> None:
        for i, packet in enumerate(packets):
            state = self.state
            if state == State.CONNECTED:
                if self._gated:
                    if self._asked is not None and (asks := self._asks(packet)):
                        # its authorization service is asked first; nothing more is read meanwhile
                        self._backlog = packets[i:]
                        self.io.pause_reading()
                        self.host.authorize(self, asks)
                        return
                    if self._v3_limited and type(packet) is Publish and (wait := self._v3_wait(packet)):
                        # over the zone's publish rates: v3 cannot be told, so it is slowed down
                        self._hold_back(packets[i:], wait)
                        return
                # (the packets of the per-message path first, called directly: compiled, a call
                # through the table is a generic Python call)
                t = type(packet)
                if t is Publish:
                    self._on_publish(packet)
                elif t is Puback:
                    self._on_puback(packet)
                elif t is Pubrec:
                    self._on_pubrec(packet)
                elif t is Pubcomp:
                    self._on_pubcomp(packet)
                elif t is Pubrel:
                    self._on_pubrel(packet)
                else:
                    handler = _HANDLERS.get(t)
                    if handler is None:
                        self.protocol_error(RC.PROTOCOL_ERROR, f"unexpected {t.__name__} from a client")
                        return
                    handler(self, packet)
            elif state == State.CONNECTING:
                assert self._stash is not None
                self._stash.append(packet)
            elif state == State.NEW:
                if type(packet) is not Connect:
                    self.protocol_error(RC.PROTOCOL_ERROR, "the first packet must be CONNECT")
                    return
                self._on_connect(packet)
            else:
                return

    def _asks(self, packet: Any) -> list[tuple[str, str]]:
        """What the client's authorization service is to be asked before this packet is handled: a
        PUBLISH's topic, a SUBSCRIBE's filters (without $share/group/), whose answers are missing or
        expired. A topic alias is looked up, not registered (the handler does that)."""
        asked = self._asked
        assert asked is not None
        now = self.clock.time()
        t = type(packet)
        if t is Publish:
            topic = packet.topic
            if not topic and self._aliases_in is not None:
                topic = self._aliases_in.get(packet.properties.get(Prop.TOPIC_ALIAS), "")
            return [("publish", topic)] if topic and asked.due("publish", topic, now) else []
        if t is Subscribe:
            asks: list[tuple[str, str]] = []
            for topic_filter, _ in packet.subscriptions:
                real = parse_share(topic_filter)[1]
                ask = ("subscribe", real)
                if valid_filter(topic_filter) and ask not in asks and asked.due(*ask, now):
                    asks.append(ask)
            return asks
        return []

    def authorized(self, answers: list[tuple[str, str, bool | None]]) -> None:
        """The authorization service's answers (True allow, False deny, None: the rules decide): the
        packets that waited are handled."""
        if self._asked is None or self.state == State.CLOSED:
            return
        self._asked.put(answers, self.clock.time())
        self._release_backlog()
        if self._asked is not None:
            self._asked.settle()

    def _v3_wait(self, packet: Publish) -> float:
        """Seconds until the zone's publish rates let this packet in (0: now; it is counted)."""
        now = self.clock.time()
        rate, volume = self.publish_rate, self.publish_bytes
        if rate is not None and (wait := rate.take(now)):
            return wait
        if volume is not None and (wait := volume.take(now, len(packet.payload))):
            if rate is not None:
                rate.tokens += 1.0  # (not let in after all: it is taken again when it is)
            return wait
        return 0.0

    def _hold_back(self, packets: list[Any], wait: float) -> None:
        """Read nothing more and handle `packets` once the publish rate allows (TCP backpressure then
        slows the client down; nothing is dropped)."""
        self._backlog = packets
        self.io.pause_reading()
        self.clock.call_later(wait, self._release_backlog)

    def _release_backlog(self) -> None:
        packets, self._backlog = self._backlog or [], None
        if self.state == State.CLOSED:
            return
        self.io.resume_reading()
        self._dispatch(packets)

    def protocol_error(self, reason: int, message: str) -> None:
        """Malformed input or a protocol violation: tell a v5 client why, count it, close."""
        if self.state == State.CLOSED:
            return
        log.info("closing %s (%s): %s", self.client_id or self.peer, reason_name(reason), message)
        if self.state == State.NEW and reason == RC.UNSUPPORTED_PROTOCOL_VERSION:
            # [MQTT-3.1.2-2]: answer CONNACK 0x01 (v3) / 0x84 and close.
            level = self.parser.version or 4
            if level >= MQTT5:
                self.io.write(encode(Connack(reason_code=reason), MQTT5))
            else:
                self.io.write(encode(Connack(reason_code=1), 4))
            self._close(reason_name(reason))
            return
        self.disconnect(reason, reason_name(reason), message if self.version >= MQTT5 else None)

    def disconnect(self, reason: int, why: str, reason_string: str | None = None) -> None:
        """Server-initiated close; v5 clients get a DISCONNECT with the reason code first."""
        if self.state == State.CLOSED:
            return
        if self.version >= MQTT5 and self.state == State.CONNECTED:
            props: dict[int, Any] = {Prop.REASON_STRING: reason_string} if reason_string else {}
            self.io.write(encode(Disconnect(reason, props), MQTT5))
        self._close(why)

    def _close(self, why: str) -> None:
        self.close_reason = why
        self.telemetry.disconnected(self.client_id, why, self.state == State.CONNECTED)
        self.state = State.CLOSED
        self._cancel_timers()
        self.io.close()

    def connection_lost(self) -> None:
        """The socket is gone (for whatever reason): the host takes care of the session."""
        if self.close_reason is None:
            self.close_reason = "sock_closed"
            self.telemetry.disconnected(self.client_id, "sock_closed", self.state == State.CONNECTED)
        self.state = State.CLOSED
        self._cancel_timers()
        self._on_commit = None  # (replies still waiting hold their own reference)
        self.host.closed(self)

    def _cancel_timers(self) -> None:
        for t in (
            self._ka_timer,
            self._retry_timer,
            self._rel_timer,
            self._retained_timer,
            self._expiry_timer,
        ):
            if t is not None:
                t.cancel()
        self._ka_timer = self._retry_timer = self._rel_timer = self._retained_timer = self._expiry_timer = (
            None
        )
        self._retained = None

    # ---------------------------------------------------------------------------------------------
    # CONNECT
    # ---------------------------------------------------------------------------------------------
    def refuse(self, reason: int, why: str, reason_string: str | None = None) -> None:
        """Turn the CONNECT down (CONNACK with the reason) and close."""
        if self.state == State.CLOSED:
            return
        if self.version >= MQTT5:
            props: dict[int, Any] = {Prop.REASON_STRING: reason_string} if reason_string else {}
            self.io.write(encode(Connack(reason_code=reason, properties=props), MQTT5))
        else:
            self.io.write(encode(Connack(reason_code=V3_CONNACK.get(reason, 3)), self.version))
        self._close(why)

    def _on_connect(self, p: Connect) -> None:
        self.version = p.proto_level
        result = negotiate(
            p,
            self.settings,
            self.host.new_client_id,
            self.clock.wall(),
            self.listener == INTERNAL,
            self.cert_name,
        )
        if isinstance(result, Refusal):
            return self.refuse(result.reason, result.why, result.reason_string)
        self.client_id = result.client_id
        self.username = result.username
        self.clean_start = result.clean_start
        self.will, self.will_delay = result.will, result.will_delay
        self.keepalive = result.keepalive
        self.client_max_packet = result.client_max_packet
        self.client_alias_max = result.client_alias_max
        self.retry = result.retry
        self._bind_rules()
        self.state = State.CONNECTING
        self._stash = []
        self.host.open_session(self, result)

    def authenticated(self, identity: Identity) -> None:
        """An authenticator of the zone's chain allowed the client: its own rules apply (before the
        zone's), and its credentials' expiry once the session is open."""
        self.identity = identity
        self._bind_rules()

    def _bind_rules(self) -> None:
        """This client's view of its zone's rules and limits (at CONNECT and after a live change)."""
        zone = self.zone
        identity = self.identity
        if identity is not None and identity.superuser:
            self.acl = ClientAcl.superuser()
            self._asked = None
        else:
            own = identity.rules if identity is not None else ()
            authorizer = identity.authorizer if identity is not None else None
            if authorizer is None:
                self._asked = None
            elif self._asked is None or self._asked.ttl != authorizer.ttl:
                self._asked = Asked(authorizer.ttl)
            peerhost = self.peer.rpartition(":")[0]
            self.acl = zone.acl.bind(self.username, self.client_id, own, peerhost, self._asked)
        rate, volume, self.max_subscriptions = self.settings.quota(self.username)
        if not rate:
            self.publish_rate = None
        elif self.publish_rate is None or self.publish_rate.rate != rate:
            self.publish_rate = TokenBucket(rate, self.clock.time())
        if not volume:
            self.publish_bytes = None
        elif self.publish_bytes is None or self.publish_bytes.rate != volume:
            self.publish_bytes = TokenBucket(volume, self.clock.time())
        self._v3_limited = self.version < MQTT5 and (rate > 0 or volume > 0)
        self._gated = self._v3_limited or self._asked is not None
        # Publishes on $SYS are refused unless a rule allows them. That is checked only for a client that
        # sent a '$' topic (its parser tells), so the others pay nothing for it; a bridge's link (in
        # process, set up by the operator) may bring the remote's $SYS in.
        self._checks = publish_checks(self.settings, self.acl, self.version, False, self.username)
        self._dollar_checks = publish_checks(
            self.settings, self.acl, self.version, not self._in_process, self.username
        )
        if self.parser.dollar:
            self._checks = self._dollar_checks

    def session_opened(self, session: Session, present: bool, connack_props: dict[int, Any]) -> None:
        """The host opened the session: CONNACK, resend what was unacknowledged, then what queued."""
        if self.state == State.CLOSED:  # the socket went away while the host worked
            self.session = session
            self.host.closed(self)
            return
        self.session = session
        self.state = State.CONNECTED
        self.connected_at = self.clock.time()
        self._holding = session.held_from is not None
        unreadable = self._guard_session()
        self.io.write(encode(Connack(present, 0, connack_props), self.version))
        self._arm_keepalive()
        if self.identity is not None and self.identity.expires_at is not None:
            left = max(0.0, self.identity.expires_at - self.clock.wall())
            self._expiry_timer = self.clock.call_later(left, self._credentials_expired)
        self.telemetry.connected(self.client_id, present, session)
        now = self.clock.time()
        if present:
            for d in session.pending_resend(now):
                self._resend(d)
        if unreadable:
            self.telemetry.dropped_all(DropReason.NOT_AUTHORIZED, self.client_id, unreadable, session)
        self._send_deliveries(*session.refill(now))
        self._arm_retry()
        if session.awaiting_rel:
            self._arm_rel_timer()
        stash, self._stash = self._stash or [], None
        for packet in stash:
            if self.state != State.CONNECTED:
                break
            handler = _HANDLERS.get(type(packet))
            if handler is None or type(packet) is Connect:
                self.protocol_error(RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
                break
            handler(self, packet)

    def _credentials_expired(self) -> None:
        self._expiry_timer = None
        self.disconnect(RC.NOT_AUTHORIZED, "credentials_expired", "the token expired")

    def _connect_timeout(self) -> None:
        self._ka_timer = None
        if self.state == State.NEW:
            log.info("closing %s: no CONNECT within %ss", self.peer, self.settings.idle_timeout)
            self._close("connect_timeout")

    # ---------------------------------------------------------------------------------------------
    # keep alive, retransmission and awaiting-PUBREL timers (lazy: re-armed for the time still left)
    # ---------------------------------------------------------------------------------------------
    def _arm_keepalive(self) -> None:
        if self._ka_timer is not None:
            self._ka_timer.cancel()
            self._ka_timer = None
        ka = self.keepalive
        if ka is not None and ka.enabled:
            self._ka_timer = self.clock.call_later(ka.timeout, self._check_keepalive)

    def _check_keepalive(self) -> None:
        self._ka_timer = None
        if self.state != State.CONNECTED or self.keepalive is None:
            return
        left = self.keepalive.remaining(self.last_recv, self.clock.time())
        if left > 0:
            self._ka_timer = self.clock.call_later(left, self._check_keepalive)
            return
        self.telemetry.keepalive_timeout(self.client_id)
        log.info("keep alive timeout for %r after %.1fs of silence", self.client_id, self.keepalive.timeout)
        self.disconnect(RC.KEEP_ALIVE_TIMEOUT, "keepalive_timeout")

    def _arm_retry(self) -> None:
        if not self.retry or self._retry_timer is not None or self.session is None:
            return
        due = self.session.next_retry(self.settings.retry_interval)
        if due is not None:
            self._retry_timer = self.clock.call_later(max(0.0, due - self.clock.time()), self._on_retry)

    def _on_retry(self) -> None:
        self._retry_timer = None
        if self.state != State.CONNECTED or self.session is None:
            return
        for d in self.session.retry_due(self.clock.time(), self.settings.retry_interval):
            self._resend(d)
        self._arm_retry()

    def _arm_rel_timer(self) -> None:
        if self._rel_timer is not None or self.session is None:
            return
        due = self.session.next_awaiting_rel_expiry()
        if due is not None:
            self._rel_timer = self.clock.call_later(max(0.0, due - self.clock.time()), self._on_rel_timer)

    def _on_rel_timer(self) -> None:
        self._rel_timer = None
        if self.state != State.CONNECTED or self.session is None:
            return
        n = self.session.expire_awaiting_rel(self.clock.time())
        if n:
            self.telemetry.awaiting_rel_timeout(self.client_id, n)
        self._arm_rel_timer()

    # ---------------------------------------------------------------------------------------------
    # PUBLISH from the client
    # ---------------------------------------------------------------------------------------------
    def _on_publish(self, p: Publish) -> None:
        """Admission first (topic alias, then the client's checks), then the path of its QoS."""
        topic = p.topic
        if p.properties and self.version >= MQTT5:
            topic = self._resolve_alias(p)
            if not topic:
                return
        if self._checks:  # (most clients have none: no loop to start)
            for check in self._checks:
                refused = check(self, p, topic)
                if refused is not None:
                    rc, reason, _why = refused
                    self.telemetry.dropped(reason, self.client_id, None, p.qos)
                    return self._publish_refused(p, rc)
        qos = p.qos
        if qos == 1:
            self._publish_qos1(p, topic)
        elif qos == 2:
            self._publish_qos2(p, topic)
        else:
            msg = Message.from_publish(
                topic, p.payload, 0, p.retain, p.properties, self.client_id, self.clock.wall()
            )
            self.telemetry.received(self.client_id, msg, 0, self.session)
            self.host.publish(msg, self.zone_name)

    def _resolve_alias(self, p: Publish) -> str:
        """The topic a v5 PUBLISH names, through its topic alias if it has one ("" after a protocol error)."""
        topic = p.topic
        alias = p.properties.get(Prop.TOPIC_ALIAS)
        if alias is None:
            return topic
        if alias > self.settings.max_topic_alias:
            self.protocol_error(RC.TOPIC_ALIAS_INVALID, f"topic alias {alias} above maximum")
            return ""
        aliases = self._aliases_in
        if aliases is None:
            aliases = self._aliases_in = {}
        if topic:
            aliases[alias] = topic
            return topic
        topic = aliases.get(alias, "")
        if not topic:
            self.protocol_error(RC.PROTOCOL_ERROR, f"unknown topic alias {alias}")
        return topic

    def _over_receive_maximum(self, session: Session, packet_id: int) -> bool:
        """A v5 client sent more unacknowledged QoS 1/2 PUBLISH than the Receive Maximum we gave it (a
        resend of a packet id awaiting PUBREL is not a new one): a protocol error, closed."""
        if (
            self.version >= MQTT5
            and len(session.awaiting_rel) + self._acks_pending >= self.settings.receive_maximum
            and packet_id not in session.awaiting_rel
        ):
            self.protocol_error(RC.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged PUBLISH than allowed")
            return True
        return False

    def _publish_qos1(self, p: Publish, topic: str) -> None:
        """Route, then PUBACK: once stored if routing wrote to the store (a publisher confirm), or if an
        earlier ack still waits for a commit (acks go out in order)."""
        session = self.session
        assert session is not None
        if self._over_receive_maximum(session, p.packet_id):
            return
        msg = Message.from_publish(
            topic, p.payload, 1, p.retain, p.properties, self.client_id, self.clock.wall()
        )
        self.telemetry.received(self.client_id, msg, p.packet_id, session)
        matched, needs_commit = self.host.publish(msg, self.zone_name)
        rc = 0 if matched or self.version < MQTT5 else RC.NO_MATCHING_SUBSCRIBERS
        if needs_commit or self._acks_pending:
            self._ack_when_stored(PUBACK, p.packet_id, rc)
        else:
            self._send_ack(PUBACK, p.packet_id, rc)

    def _publish_qos2(self, p: Publish, topic: str) -> None:
        """Record the packet id as awaiting PUBREL (a resend before PUBREL is answered, not routed again),
        route, then PUBREC. A journaled session on a store that routes by receipt stores the receipt
        first (`_route_once_received`)."""
        session = self.session
        assert session is not None
        packet_id = p.packet_id
        if self._over_receive_maximum(session, packet_id):
            return
        receipt = session.journal is not None and self.host.receipts_first
        try:
            fresh = session.await_rel(packet_id, self.clock.time(), receipt)
        except AwaitingRelFull:
            self.telemetry.dropped(DropReason.AWAITING_REL_FULL, self.client_id, None, 2)
            if self.version >= MQTT5:  # refused, and the client can see it was
                self._send_ack(PUBREC, packet_id, RC.RECEIVE_MAXIMUM_EXCEEDED)
            else:  # a v3 PUBREC cannot say "refused": close unacked so the client resends later
                self.protocol_error(RC.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS2 messages awaiting PUBREL")
            return
        if not fresh and (not receipt or session.receipt_of(packet_id) is None):
            self._send_ack(PUBREC, packet_id, 0)  # a resent PUBLISH before PUBREL: delivered once
            return
        if self._rel_timer is None:
            self._arm_rel_timer()
        msg = Message.from_publish(
            topic, p.payload, 2, p.retain, p.properties, self.client_id, self.clock.wall()
        )
        if receipt:
            # Its receipt first, then its routing: a resend finding the receipt routes it again under
            # it, and whoever got it already drops the repeat (Message.receipt).
            msg.receipt = session.receipt_of(packet_id)
            if fresh:
                self.telemetry.received(self.client_id, msg, packet_id, session)
            self._acks_pending += 1
            self._when_stored(_ROUTE, msg, packet_id)
            return
        self.telemetry.received(self.client_id, msg, packet_id, session)
        matched, needs_commit = self.host.publish(msg, self.zone_name)
        rc = 0 if matched or self.version < MQTT5 else RC.NO_MATCHING_SUBSCRIBERS
        # A journaled QoS2 receipt (awaiting PUBREL) must be stored before PUBREC says "got it".
        if needs_commit or self._acks_pending or session.journal is not None:
            self._ack_when_stored(PUBREC, packet_id, rc)
        else:
            self._send_ack(PUBREC, packet_id, rc)

    def _publish_refused(self, p: Publish, rc: int) -> None:
        """Not accepted: v5 clients learn why from the ack's reason code; v3 acks cannot say it (EMQX's
        default, acl_deny_action = ignore). Behind the acks still waiting for a commit, as any ack: they go
        out in the order their PUBLISHes came [MQTT-4.6.0-2, -3]."""
        if p.qos:
            ptype = PUBACK if p.qos == 1 else PUBREC
            if self._acks_pending:
                self._ack_when_stored(ptype, p.packet_id, rc)
            else:
                self._send_ack(ptype, p.packet_id, rc)

    def _send_ack(self, ptype: int, packet_id: int, rc: int) -> None:
        self._write(encode_ack(ptype, packet_id, rc if self.version >= MQTT5 else 0, self.version))

    def _ack_when_stored(self, ptype: int, packet_id: int, rc: int) -> None:
        """Publisher confirm: the ack waits until the message is stored for every persistent session.
        If that fails, the client resends on its next connection. The session keeps what it recorded
        (a QoS 2 packet id awaiting PUBREL, its receipt): a failed commit's outcome is unknown, and if
        this session's own record was in it, the session resynchronises from the store anyway
        (ChannelManager.resync); forgetting a record the store does hold would route the resend again
        under a new receipt, a second copy for every subscriber."""
        self._acks_pending += 1
        self._when_stored(_ACK, ptype, packet_id, rc)

    def _on_pubrel(self, p: Pubrel) -> None:
        assert self.session is not None
        found = self.session.release(p.packet_id)
        rc = 0 if found else RC.PACKET_IDENTIFIER_NOT_FOUND
        if self._acks_pending or self.session.journal is not None:
            self._ack_when_stored(PUBCOMP, p.packet_id, rc)
        else:
            self._send_ack(PUBCOMP, p.packet_id, rc)

    # ---------------------------------------------------------------------------------------------
    # acks of our deliveries
    # ---------------------------------------------------------------------------------------------
    def _on_puback(self, p: Puback) -> None:
        session = self.session
        assert session is not None
        d = session.puback(p.packet_id)
        if d is None:
            return  # unknown or duplicate ack: harmless
        self.telemetry.acked(self.client_id, d, session)
        if session.mqueue:
            self._send_deliveries(*session.refill(self.clock.time()))

    def _on_pubrec(self, p: Pubrec) -> None:
        session = self.session
        assert session is not None
        failed = p.reason_code >= 0x80
        d = session.pubrec(p.packet_id, self.clock.time(), failed)
        if d is None:
            self._send_ack(PUBREL, p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND)
            return
        if failed:
            if session.mqueue:
                self._send_deliveries(*session.refill(self.clock.time()))
            return
        if session.journal is not None:
            # The PUBREL stage must be stored before PUBREL goes out: a node taking over after a crash
            # would otherwise resend the PUBLISH, which the client (having released the id) takes as new.
            self._reply_when_stored(_SEND, encode_ack(PUBREL, p.packet_id, 0, self.version))
        else:
            self._send_ack(PUBREL, p.packet_id, 0)

    def _on_pubcomp(self, p: Pubcomp) -> None:
        session = self.session
        assert session is not None
        d = session.pubcomp(p.packet_id)
        if d is None:
            return
        self.telemetry.acked(self.client_id, d, session)
        if session.mqueue:
            self._send_deliveries(*session.refill(self.clock.time()))

    # ---------------------------------------------------------------------------------------------
    # read access (the subscriber's zone rules decide, whatever filter matched and wherever it came from)
    # ---------------------------------------------------------------------------------------------
    def _may_read(self, msg: Message, qos: int) -> bool:
        acl = self.acl
        if acl is None or acl.can_read(msg.topic):
            return True
        self.telemetry.dropped(DropReason.NOT_AUTHORIZED, self.client_id, msg, qos, self.session)
        return False

    def _guard_session(self) -> list[Delivery]:
        """Apply this client's rules to its session: which subscriptions need deliveries checked, and
        out of the queue what it may no longer read (returned, taken out; queued while it was away or
        before the rules changed)."""
        session, acl = self.session, self.acl
        self.read_guard = False
        if session is None or acl is None or not acl.guards_read:
            return []
        for topic_filter in session.subscriptions:
            if acl.subscribe_access(parse_share(topic_filter)[1]) is not Access.ALLOWED:
                self.read_guard = True
                break
        return session.take_queued(lambda d: not acl.can_read(d.msg.topic))

    # ---------------------------------------------------------------------------------------------
    # deliveries to the client
    # ---------------------------------------------------------------------------------------------
    def deliver_stored(self, d: Delivery) -> None:
        """A delivery pulled from the store (already placed in the session's order if journaled).

        Another node queued it without knowing this client's rules: read access is checked here.
        """
        acl = self.acl
        session = self.session
        if (
            d.msg.receipt is not None
            and session is not None
            and not session.admit(d.msg.receipt, d.order, stored=True)
        ):
            # A publisher's resend, routed here under the same receipt before the store learnt that this
            # session got it (its commit was on the way when the store queued this copy): a repeat.
            if d.order >= 0:
                session.forget(d)  # the pull journaled it
            return
        if acl is not None and acl.guards_read and not acl.can_read(d.msg.topic):
            if session is not None and d.order >= 0:
                session.forget(d)  # the pull journaled it
            self.telemetry.dropped_all(DropReason.NOT_AUTHORIZED, self.client_id, [d], session)
            return
        if (
            self._holding
            and session is not None
            and session.held_from is not None
            and 0 <= d.order < session.held_from
        ):
            # routed here through the store before the session opened here: ahead of what was held back
            dropped = session.insert(d)
            if dropped:
                self.telemetry.dropped_all(DropReason.QUEUE_FULL, self.client_id, dropped, session)
            return
        if d.qos == 0:
            self.deliver(d.msg, 0, d.retain, d.sub_ids)
            if session is not None and d.order >= 0:
                session.forget(d)  # it was journaled by the pull; now it is sent
            return
        self._deliver(d)

    def deliver(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...] | None) -> None:
        """A message routed to this client: QoS0 at once, QoS1/2 through the Inflight Window.

        While the socket cannot keep up (`congested`), QoS1/2 wait in the Message Queue, bounded by
        max_mqueue_len, and QoS0 is dropped: a slow subscriber never grows the node's memory unbounded.
        """
        if self.read_guard and not self._may_read(msg, qos):
            return
        if qos == 0 and not self._holding:
            if self.congested:
                self.telemetry.dropped(DropReason.QUEUE_FULL, self.client_id, msg, 0, self.session)
                return
            # (MQTT 3 has no aliases or size limit to apply: the message's own encoding, one call less)
            version = self.version
            data = (
                msg.encode(version, 0, retain)
                if version < MQTT5
                else self._encode(msg, 0, retain, 0, False, sub_ids)
            )
            if data is not None:
                self.write_publish(data)
                self.telemetry.delivered(self.client_id, msg, 0, 0, self.session)
            return
        self._deliver(Delivery(msg, qos, retain, sub_ids))

    def retract(self, msg: Message) -> None:
        """Take back a QoS 2 message routed here for a publisher whose session the commit found fenced
        (another node owns it now): the client has not seen it yet (its PUBLISH waits for that commit), and
        the publisher sends it again to the new owner, which routes it here once more."""
        session = self.session
        if session is None:
            return
        for d in [d for d in session.inflight.values() if d.msg is msg]:
            session.drop(d.packet_id)
        session.take_queued(lambda d: d.msg is msg)
        if session.mqueue and not session.inflight.full():
            self._send_deliveries(*session.refill(self.clock.time()))

    def _deliver(self, d: Delivery) -> None:
        session = self.session
        assert session is not None
        sent, dropped = session.deliver(d, self.clock.time(), hold=self.congested)
        if sent is not None:
            if not self._send_publish(sent) and session.mqueue:
                self._send_deliveries(*session.refill(self.clock.time()))
            elif self._retry_timer is None and self.retry:
                self._arm_retry()
        else:
            if not self._holding:
                self.telemetry.inflight_full(self.client_id, d.msg, d.qos, session)
            if dropped:
                self.telemetry.dropped_all(DropReason.QUEUE_FULL, self.client_id, dropped, session)

    def _encode(
        self, msg: Message, qos: int, retain: bool, packet_id: int, dup: bool, sub_ids: tuple[int, ...] | None
    ) -> bytes | Publish | None:
        version = self.version
        if version < MQTT5:
            return msg.encode(version, qos, retain, packet_id, dup)
        if self._in_process:
            return msg.publish(qos, retain, packet_id, dup)
        alias = 0
        alias_new = True
        if self.client_alias_max:
            aliases = self._aliases_out
            if aliases is None:
                aliases = self._aliases_out = {}
            alias = aliases.get(msg.topic, 0)
            if alias:
                alias_new = False
            elif len(aliases) < self.client_alias_max:
                alias = aliases[msg.topic] = len(aliases) + 1
        data = msg.encode(version, qos, retain, packet_id, dup, sub_ids, 0.0, alias, alias_new)
        if self.client_max_packet and len(data) > self.client_max_packet:
            # [MQTT-3.1.2-25]: never send a client a packet bigger than it accepts; drop it instead.
            self.telemetry.dropped(DropReason.TOO_LARGE, self.client_id, msg, qos, self.session)
            return None
        return data

    def _send_publish(self, d: Delivery, dup: bool = False) -> bool:
        """Write a PUBLISH; False if it was too large for the client and left the window unsent."""
        data = self._encode(d.msg, d.qos, d.retain, d.packet_id, dup, d.sub_ids)
        session = self.session
        assert session is not None
        if data is None:
            session.drop(d.packet_id)
            return False
        self.telemetry.delivered(self.client_id, d.msg, d.qos, d.packet_id, session, dup)
        if d.qos == 2 and not dup and session.journal is not None:
            # Exactly once across a crash: the packet id must be stored before the client sees it, or a
            # node taking over could give that id to another message, which the client would take for a
            # resend of this one. (Unless it was taken back meanwhile: `retract`.)
            self._reply_when_stored(_PUBLISH, data, d, session.inflight)
        else:
            self.write_publish(data)
        return True

    def _send_deliveries(self, sent: list[Delivery], expired: list[Delivery]) -> None:
        """Write what a refill moved into the window; a slot freed by a dropped delivery refills again."""
        session = self.session
        assert session is not None
        while True:
            freed = False
            for d in sent:
                if d.qos == 0:
                    data = self._encode(d.msg, 0, d.retain, 0, False, d.sub_ids)
                    if data is not None:
                        self.write_publish(data)
                        self.telemetry.delivered(self.client_id, d.msg, 0, 0, session)
                elif not self._send_publish(d):
                    freed = True
            if expired:
                self.telemetry.dropped_all(DropReason.EXPIRED, self.client_id, expired, session)
            if not (freed and session.mqueue):
                break
            sent, expired = session.refill(self.clock.time())
        if self._retry_timer is None and self.retry and session.inflight:
            self._arm_retry()
        if self._retained is not None and not session.mqueue:
            self._pump_retained_soon()  # the queue emptied: retained messages still due may follow

    def _resend(self, d: Delivery) -> None:
        if d.stage == 0:
            self._send_publish(d, dup=True)
        else:
            self._send_ack(PUBREL, d.packet_id, 0)
            self.telemetry.pubrel_resent(self.client_id, d, self.session)

    # ---------------------------------------------------------------------------------------------
    # SUBSCRIBE / UNSUBSCRIBE / PING / DISCONNECT
    # ---------------------------------------------------------------------------------------------
    def _on_subscribe(self, p: Subscribe) -> None:
        session = self.session
        assert session is not None
        sub_id = p.properties.get(Prop.SUBSCRIPTION_IDENTIFIER) if p.properties else None
        codes: list[int] = []
        retained: list[tuple[str, Subscription, bool]] = []  # filter, options, read-checked
        for topic_filter, opts in p.subscriptions:
            if not valid_filter(topic_filter):
                codes.append(RC.TOPIC_FILTER_INVALID if self.version >= MQTT5 else 0x80)
                continue
            group, real = parse_share(topic_filter)
            access = self.acl.subscribe_access(real) if self.acl is not None else Access.ALLOWED
            if access is Access.DENIED:
                codes.append(RC.NOT_AUTHORIZED if self.version >= MQTT5 else 0x80)
                continue
            limit = self.max_subscriptions
            if limit and topic_filter not in session.subscriptions and len(session.subscriptions) >= limit:
                self.telemetry.counters.quota_refusals["subscriptions"] += 1
                codes.append(RC.QUOTA_EXCEEDED if self.version >= MQTT5 else 0x80)
                continue
            guarded = access is Access.FILTERED
            if guarded:
                self.read_guard = True
            if group is not None and opts.no_local and self.version >= MQTT5:
                return self.protocol_error(RC.PROTOCOL_ERROR, "no local on a shared subscription")
            if group is None and sub_id is None:
                sub = plain_subscription(
                    opts.qos, opts.no_local, opts.retain_as_published, opts.retain_handling
                )
            else:  # (its own: the router marks a shared one with its group)
                sub = Subscription(
                    opts.qos, opts.no_local, opts.retain_as_published, opts.retain_handling, sub_id
                )
            existed = topic_filter in session.subscriptions
            session.subscriptions[topic_filter] = sub
            self.host.subscribe(self, topic_filter, sub)
            codes.append(opts.qos)
            if group is None and (opts.retain_handling == 0 or (opts.retain_handling == 1 and not existed)):
                retained.append((topic_filter, sub, guarded))
        self._reply_when_stored(_SUBACK, encode(Suback(p.packet_id, codes), self.version), retained)

    def _subscribed(self, suback: bytes, retained: list[tuple[str, Subscription, bool]]) -> None:
        """The subscriptions are stored: SUBACK, then the retained messages of those that get them."""
        self.io.write(suback)
        if not retained:
            return
        runs = self._retained
        if runs is None:
            runs = self._retained = deque()
        for topic_filter, sub, guarded in retained:
            runs.append(RetainedRun(topic_filter, sub, iter(self.host.retained(topic_filter)), guarded))
        if self._retained_timer is None:
            self._pump_retained()  # a first batch at once (a few retained messages: all of them)

    def _pump_retained(self) -> None:
        """Deliver new subscriptions' retained messages, a batch per loop turn (RETAINED_BATCH messages,
        RETAINED_BATCH_BYTES), as fast as the client takes them: only while its socket is not congested and
        nothing waits in its Message Queue (QoS 1/2 go through the Inflight Window, which paces them as the
        client acks). Resumed when the socket drains (set_congested) or the queue empties
        (_send_deliveries); a client that reads nothing holds a search over the retained store, not the
        messages."""
        self._retained_timer = None
        runs, session = self._retained, self.session
        if runs is None or session is None or self.state != State.CONNECTED:
            self._retained = None
            return
        acl = self.acl
        budget, room = RETAINED_BATCH, RETAINED_BATCH_BYTES
        while runs:
            run = runs[0]
            if session.subscriptions.get(run.topic_filter) is not run.sub:
                runs.popleft()  # unsubscribed, or subscribed anew (with a run of its own)
                continue
            while True:
                if self.congested or session.mqueue:
                    return
                if budget <= 0 or room <= 0:
                    self._pump_retained_soon()
                    return
                budget -= 1
                try:
                    msg = next(run.messages)
                except StopIteration:
                    runs.popleft()
                    break
                if msg is None:
                    continue  # a step of the search that found nothing
                if run.guarded and acl is not None and not acl.can_read(msg.topic):
                    continue  # never sent, so not a drop: the retained message stays for others
                # [MQTT-3.3.1-9]: a retained message sent for a new subscription has RETAIN=1.
                self.deliver(msg, min(msg.qos, run.sub.qos), True, run.sub_ids)
                room -= len(msg.payload)
                # It stays in the retained store, maybe for long: an encoding cached on it would double it.
                msg.drop_encodings()
                if self.state != State.CONNECTED:
                    return
        self._retained = None

    def _pump_retained_soon(self) -> None:
        if self._retained_timer is None and self._retained is not None:
            self._retained_timer = self.clock.call_later(0, self._pump_retained)

    # ---------------------------------------------------------------------------------------------
    # replies that wait until what their packet changed is stored
    # ---------------------------------------------------------------------------------------------
    def _reply_when_stored(self, kind: int, a: Any, b: Any = None, c: Any = None) -> None:
        """A reply of `kind` (see _ACK) once what this packet changed is stored; at once when the store
        keeps nothing across a restart."""
        if self.host.durable:
            self._when_stored(kind, a, b, c)
        else:
            self._reply(kind, a, b, c)

    def _when_stored(self, kind: int, a: Any, b: Any = None, c: Any = None) -> None:
        # (entered before the host is asked: with nothing to commit, it answers at once)
        replies = self._replies
        if replies is None:
            replies = self._replies = deque()
        replies.append((kind, a, b, c))
        on_commit = self._on_commit
        if on_commit is None:
            on_commit = self._on_commit = self._committed
        self.host.after_commit(on_commit)

    def _committed(self, ok: bool) -> None:
        """The commit the oldest waiting reply waited for is over (the host answers in the order asked)."""
        replies = self._replies
        if not replies:  # pragma: no cover - one answer per question
            return
        kind, a, b, c = replies.popleft()
        if kind <= _ROUTE:
            self._acks_pending -= 1
        if self.state != State.CONNECTED:
            return  # left, taken over, fenced or resynchronising meanwhile
        if ok:
            self._reply(kind, a, b, c)
        else:  # not stored, so not answered: the client sends it again on its next connection
            self.disconnect(RC.SERVER_UNAVAILABLE if self.version >= MQTT5 else 0, "store_error")

    def _reply(self, kind: int, a: Any, b: Any, c: Any) -> None:
        if kind == _ACK:
            self._send_ack(a, b, c)
        elif kind == _ROUTE:
            self._route_once_received(a, b)
        elif kind == _SEND:
            self.io.write(a)
        elif kind == _PUBLISH:
            if c.get(b.packet_id) is b:  # (unless taken back meanwhile: `retract`)
                self.write_publish(a)
        else:
            self._subscribed(a, b)

    def _route_once_received(self, msg: Message, packet_id: int) -> None:
        """Route a QoS 2 message whose receipt is stored, then PUBREC once its routing is. Only while the
        session is still this connection's: if the commit found it another node's (fenced), the receipt
        was refused and its number is the new owner's to give, so routing under it would make a later
        message look like a repeat of this one. Unacknowledged, the client sends it again, and the resend
        is routed under the receipt if one was stored. (A failed commit leaves the receipt: see
        _ack_when_stored.)"""
        if self.session is None:
            return
        matched, _ = self.host.publish(msg, self.zone_name)
        rc = 0 if matched or self.version < MQTT5 else RC.NO_MATCHING_SUBSCRIBERS
        self._ack_when_stored(PUBREC, packet_id, rc)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes: list[int] = []
        for topic_filter in p.topics:
            if session.subscriptions.pop(topic_filter, None) is not None:
                self.host.unsubscribe(self, topic_filter)
                codes.append(RC.SUCCESS)
            else:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
        self._reply_when_stored(_SEND, encode(Unsuback(p.packet_id, codes), self.version))

    def _on_pingreq(self, p: Pingreq) -> None:
        self.io.write(PINGRESP_BYTES)

    def _on_disconnect(self, p: Disconnect) -> None:
        if self.version >= MQTT5:
            expiry = p.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
            if expiry is not None and self.session is not None:
                if self.session.expiry_interval == 0 and expiry != 0:
                    return self.protocol_error(RC.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0")
                cap = self.settings.session_expiry_interval
                self.session.expiry_interval = min(float(expiry), cap) if expiry != NEVER_EXPIRE else cap
            if p.reason_code != RC.DISCONNECT_WITH_WILL:
                self.will = None
        else:
            self.will = None
        # the client said goodbye: counted by its reason, not logged as a disconnect event
        self.telemetry.disconnected(
            self.client_id, "normal" if p.reason_code == 0 else reason_name(p.reason_code), False
        )
        self.close_reason = "client_disconnect"
        self.state = State.CLOSED
        self._cancel_timers()
        self.io.close()

    def _on_auth(self, p: Auth) -> None:
        self.protocol_error(RC.PROTOCOL_ERROR, "AUTH without an authentication method")

    # ---------------------------------------------------------------------------------------------
    # told by the channel manager and the connection
    # ---------------------------------------------------------------------------------------------
    def caught_up(self) -> None:
        """What the store held for this session when it opened here is in: what waited goes out, in order."""
        session = self.session
        self._holding = False
        if session is None:
            return
        session.caught_up()  # (repeats found now had not been sent)
        if self.state == State.CONNECTED:
            self._send_deliveries(*session.refill(self.clock.time()))

    # -- packet traces (trace.py): nothing of this runs for a client that is not traced
    def start_trace(self, tracer: Tracer) -> None:
        if self._in_process:
            return  # (a bridge's link: its own traces are the remote broker's)
        if self.tracers is None:
            self.tracers = []
            self.io = Outgoing(self.io, lambda packets: self.traced("out", packets), self.version)
            self._write = self.io.write
            self.write_publish = cast(Callable[[bytes | Publish], None], self._write)
        if tracer not in self.tracers:
            self.tracers.append(tracer)

    def stop_trace(self, tracer: Tracer) -> None:
        if self.tracers is None or tracer not in self.tracers:
            return
        self.tracers.remove(tracer)
        if not self.tracers and isinstance(self.io, Outgoing):
            self.tracers = None
            self.io = self.io.io
            self._write = self.io.write
            self.write_publish = cast(Callable[[bytes | Publish], None], self._write)

    def traced(self, direction: Literal["in", "out"], packets: list[Any]) -> None:
        now = self.clock.wall()
        for tracer in self.tracers or ():
            tracer.packets(self.client_id, direction, packets, now)

    def kick(self, reason: int, why: str) -> None:
        """Close this connection on the server's initiative (takeover, shutdown)."""
        self.disconnect(reason, why)

    def set_congested(self, congested: bool) -> None:
        """The socket's write buffer crossed its high (True) or low (False) water mark, or the node's write
        budget holds this connection back (connection.WriteBudget)."""
        self.congested = congested
        if congested or self.state != State.CONNECTED or self.session is None:
            return
        if self.session.mqueue:
            self._send_deliveries(*self.session.refill(self.clock.time()))
        self._pump_retained_soon()

    def apply_zone(self) -> None:
        """Pick up changed zone settings and rules (window, queue limit, retry, ACL) at once."""
        settings = self.settings = self.zone.settings
        self.parser.max_packet_size = settings.max_packet_size
        if self.state in (State.CONNECTING, State.CONNECTED):
            self._bind_rules()
        session = self.session
        if session is None:
            return
        dropped = session.apply_zone(settings)
        if dropped:
            self.telemetry.dropped_all(DropReason.QUEUE_FULL, self.client_id, dropped, session)
        unreadable = self._guard_session()  # a revoked read stops deliveries without a reconnect
        if unreadable:
            self.telemetry.dropped_all(DropReason.NOT_AUTHORIZED, self.client_id, unreadable, session)
        if self.state == State.CONNECTED:
            self._send_deliveries(*session.refill(self.clock.time()))


_HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    Publish: Channel._on_publish,
    Puback: Channel._on_puback,
    Pubrec: Channel._on_pubrec,
    Pubrel: Channel._on_pubrel,
    Pubcomp: Channel._on_pubcomp,
    Subscribe: Channel._on_subscribe,
    Unsubscribe: Channel._on_unsubscribe,
    Pingreq: Channel._on_pingreq,
    Disconnect: Channel._on_disconnect,
    Auth: Channel._on_auth,
}
