"""The channel (EMQX's emqx_channel): one client's MQTT protocol state machine.

Sans-I/O: the channel is fed bytes and writes bytes through a small `ChannelIO` interface (write, close,
timers, clock) that the asyncio connection implements and tests fake. It owns the client's session while
connected and applies the EMQX delivery rules: QoS0 goes out at once, QoS1/2 through the Inflight Window,
the Message Queue behind it, retransmission in original order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .auth import Access, ClientAcl
from .codec import (
    MQTT5,
    MQTT31,
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
from .eventschema import (
    ACK,
    AWAITING_REL_TIMEOUT,
    CONNECT,
    DELIVER,
    DISCONNECT,
    DROP,
    INFLIGHT_FULL,
    KEEPALIVE_TIMEOUT,
    PUBLISH_IN,
    RETRANSMIT,
    SAMPLE_MASK,
    SAMPLE_MIX,
)
from .keepalive import KeepAlive, effective_keepalive
from .limiter import TokenBucket
from .message import Delivery, Message
from .router import Subscription
from .session import AwaitingRelFull, Session
from .store import Route
from .topic import parse_share, valid_filter, valid_topic

if TYPE_CHECKING:
    from .node import Node

log = logging.getLogger("fleetmq.channel")

PUBACK, PUBREC, PUBREL, PUBCOMP = PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP
NEVER_EXPIRE = 0xFFFFFFFF

# v3 CONNACK return codes for the v5 reasons a CONNECT can be refused with.
V3_CONNACK = {
    RC.UNSUPPORTED_PROTOCOL_VERSION: 1,
    RC.CLIENT_IDENTIFIER_NOT_VALID: 2,
    RC.SERVER_UNAVAILABLE: 3,
    RC.SERVER_BUSY: 3,
    RC.QUOTA_EXCEEDED: 3,
    RC.BAD_USER_NAME_OR_PASSWORD: 4,
    RC.NOT_AUTHORIZED: 5,
}


def reason_name(code: int) -> str:
    try:
        return RC(code).name.lower()
    except ValueError:
        return f"0x{code:02x}"


class ChannelIO(Protocol):
    """What a channel needs from its transport (implemented by connection.Connection)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle: ...

    def time(self) -> float: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class State:
    NEW, CONNECTING, CONNECTED, CLOSED = range(4)


class Channel:
    __slots__ = (
        "_acks_pending",
        "_aliases_in",
        "_aliases_out",
        "_backlog",
        "_ka_timer",
        "_rel_timer",
        "_retry_timer",
        "_stash",
        "acl",
        "clean_start",
        "client_alias_max",
        "client_id",
        "client_max_packet",
        "close_reason",
        "congested",
        "connected_at",
        "counted",
        "ev",
        "io",
        "keepalive",
        "last_recv",
        "listener",
        "node",
        "parser",
        "peer",
        "publish_rate",
        "read_guard",
        "retry",
        "session",
        "state",
        "username",
        "version",
        "will",
        "will_delay",
        "zm",
        "zone",
        "zone_name",
    )

    def __init__(self, node: Node, zone_name: str, io: ChannelIO, peer: str = "", listener: str = "") -> None:
        self.node = node
        self.zone_name = zone_name
        self.zone = node.zones[zone_name]
        self.zm = node.metrics.zone(zone_name)
        self.ev = node.events  # the event log, or None (events are off)
        self.acl: ClientAcl | None = None  # the zone's rules bound to this client at CONNECT
        # Whether deliveries on the local path are checked for read access: set once a subscription
        # whose filter can reach a denied topic is made, and kept until the rules are bound again (so
        # messages already on their way through such a filter are still checked after an UNSUBSCRIBE).
        self.read_guard = False
        self.counted = False  # in its zone's connection count
        self._backlog: list[Any] | None = None  # packets held back by the publish rate
        self.publish_rate: TokenBucket | None = None
        self.io = io
        self.peer = peer
        self.listener = listener
        self.parser = Parser(max_packet_size=self.zone.max_packet_size)
        self.state = State.NEW
        self.version = 0
        self.client_id = ""
        self.username: str | None = None
        self.clean_start = True
        self.session: Session | None = None
        self.will: Message | None = None
        self.will_delay = 0.0
        self.keepalive: KeepAlive | None = None
        self.client_max_packet = 0
        self.client_alias_max = 0
        self.retry = False
        self.congested = False
        self.close_reason: str | None = None
        self.last_recv = io.time()
        self.connected_at = 0.0
        self._aliases_in: dict[int, str] | None = None
        self._aliases_out: dict[str, int] | None = None
        self._acks_pending = 0
        self._stash: list[Any] | None = None
        self._ka_timer: asyncio.TimerHandle | None = io.call_later(
            self.zone.idle_timeout, self._connect_timeout
        )
        self._retry_timer: asyncio.TimerHandle | None = None
        self._rel_timer: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------------------------------------
    # input
    # ---------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.state == State.CLOSED:
            return
        self.last_recv = self.io.time()
        error: ProtocolError | None = None
        try:
            packets = self.parser.feed(data)
        except ProtocolError as e:
            error, packets = e, e.packets  # packets before the bad one still count
        if self._backlog is not None:  # throttled: these wait behind the ones already held back
            self._backlog.extend(packets)
            if error is not None:
                self.protocol_error(error.reason, error.message)
            return
        self._dispatch(packets)
        if error is not None:
            self.protocol_error(error.reason, error.message)

    def _dispatch(self, packets: list[Any]) -> None:
        for i, packet in enumerate(packets):
            state = self.state
            if state == State.CONNECTED:
                if self.publish_rate is not None and type(packet) is Publish and self.version < MQTT5:
                    wait = self.publish_rate.take(self.io.time())
                    if wait:  # over the zone's publish rate: v3 cannot be told, so it is slowed down
                        self._hold_back(packets[i:], wait)
                        return
                handler = _HANDLERS.get(type(packet))
                if handler is None:
                    self.protocol_error(
                        RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__} from a client"
                    )
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

    def _hold_back(self, packets: list[Any], wait: float) -> None:
        """Read nothing more and handle `packets` once the publish rate allows (TCP backpressure then
        slows the client down; nothing is dropped)."""
        self._backlog = packets
        self.io.pause_reading()
        self.io.call_later(wait, self._release_backlog)

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
            props = {Prop.REASON_STRING: reason_string} if reason_string else {}
            self.io.write(encode(Disconnect(reason, props), MQTT5))
        self._close(why)

    def _close(self, why: str) -> None:
        self.close_reason = why
        self.zm.disconnects[why] += 1
        if self.ev is not None and self.state == State.CONNECTED:
            self.ev.emit(DISCONNECT, self.zone_name, self.client_id, reason=why)
        self.state = State.CLOSED
        self._cancel_timers()
        self.io.close()

    def connection_lost(self) -> None:
        """The socket is gone (for whatever reason): hand the session to the channel manager."""
        if self.close_reason is None:
            self.close_reason = "sock_closed"
            self.zm.disconnects["sock_closed"] += 1
            if self.ev is not None and self.state == State.CONNECTED:
                self.ev.emit(DISCONNECT, self.zone_name, self.client_id, reason="sock_closed")
        prior = self.state
        self.state = State.CLOSED
        self._cancel_timers()
        if self.counted:
            self.counted = False
            self.node.limits(self.zone_name).connections -= 1
        if prior in (State.CONNECTED, State.CLOSED) and self.session is not None:
            self.node.cm.channel_closed(self)

    def _cancel_timers(self) -> None:
        for name in ("_ka_timer", "_retry_timer", "_rel_timer"):
            t = getattr(self, name)
            if t is not None:
                t.cancel()
                setattr(self, name, None)

    # ---------------------------------------------------------------------------------------------
    # CONNECT
    # ---------------------------------------------------------------------------------------------
    def _refuse(self, reason: int, why: str, reason_string: str | None = None) -> None:
        if self.version >= MQTT5:
            props = {Prop.REASON_STRING: reason_string} if reason_string else {}
            self.io.write(encode(Connack(reason_code=reason, properties=props), MQTT5))
        else:
            self.io.write(encode(Connack(reason_code=V3_CONNACK.get(reason, 3)), self.version))
        self._close(why)

    def _on_connect(self, p: Connect) -> None:
        self.version = p.proto_level
        zone = self.zone
        props = p.properties
        self.clean_start = p.clean_start
        client_id = p.client_id
        assigned = False
        if not client_id:
            if self.version >= MQTT5:
                client_id = self.node.assign_client_id()
                assigned = True
            elif p.clean_start and self.version > MQTT31:
                client_id = self.node.assign_client_id()
            else:
                return self._refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, "client_id_invalid")
        if len(client_id) > zone.max_clientid_len:
            return self._refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, "client_id_invalid")
        if props.get(Prop.AUTHENTICATION_METHOD) is not None:
            return self._refuse(RC.BAD_AUTHENTICATION_METHOD, "bad_authentication_method")
        if p.username is None and not zone.allow_anonymous:
            return self._refuse(RC.NOT_AUTHORIZED, "not_authorized")
        limits = self.node.limits(self.zone_name)
        if zone.max_connections and limits.connections >= zone.max_connections:
            return self._refuse(RC.QUOTA_EXCEEDED, "max_connections")
        if not limits.connect_allowed(self.io.time()):
            return self._refuse(RC.CONNECTION_RATE_EXCEEDED, "connection_rate_exceeded")
        limits.connections += 1
        self.counted = True
        if zone.max_publish_rate:
            self.publish_rate = TokenBucket(zone.max_publish_rate, self.io.time())
        password = p.password
        will = p.will
        if will is not None:
            if not valid_topic(will.topic):
                return self._refuse(RC.TOPIC_NAME_INVALID, "will_topic_invalid")
            self.will = Message.from_publish(
                will.topic, will.payload, will.qos, will.retain, will.properties, client_id
            )
            self.will_delay = float(will.properties.get(Prop.WILL_DELAY_INTERVAL, 0))
        self.client_id = client_id
        self.username = p.username
        zone_acl = self.node.acl.get(self.zone_name)
        self.acl = zone_acl.bind(p.username, client_id) if zone_acl is not None else None
        if self.version >= MQTT5:
            requested = props.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
            self.client_max_packet = props.get(Prop.MAXIMUM_PACKET_SIZE, 0)
            self.client_alias_max = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0)
            receive_max = props.get(Prop.RECEIVE_MAXIMUM, 65535)
            self.retry = zone.retry_v5
        else:
            requested = 0 if p.clean_start else NEVER_EXPIRE
            receive_max = 0
            self.retry = True
        expiry = requested
        if requested and zone.session_expiry_interval < requested:
            expiry = int(zone.session_expiry_interval)
        ka, overridden = effective_keepalive(p.keepalive, zone.server_keepalive)
        self.keepalive = KeepAlive(ka, zone.keepalive_backoff)
        self.state = State.CONNECTING
        self._stash = []
        connack_props: dict[int, Any] = {}
        if self.version >= MQTT5:
            if assigned:
                connack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
            if overridden:
                connack_props[Prop.SERVER_KEEP_ALIVE] = ka
            if expiry != requested:
                connack_props[Prop.SESSION_EXPIRY_INTERVAL] = expiry
            if zone.receive_maximum != 65535:
                connack_props[Prop.RECEIVE_MAXIMUM] = zone.receive_maximum
            connack_props[Prop.MAXIMUM_PACKET_SIZE] = zone.max_packet_size
            if zone.max_topic_alias:
                connack_props[Prop.TOPIC_ALIAS_MAXIMUM] = zone.max_topic_alias
        self.node.spawn(self._open_session(float(expiry), receive_max, connack_props, password))

    async def _open_session(
        self, expiry: float, receive_max: int, connack_props: dict[int, Any], password: bytes | None = None
    ) -> None:
        t0 = time.perf_counter()
        auth = self.node.auth.get(self.zone_name)
        if auth is not None and self.username is not None:
            # a slow hash by design: computed off the event loop (hashlib releases the GIL)
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, auth.check, self.username, password)
            if self.state == State.CLOSED:
                return
            if not ok:
                log.info("bad credentials from %s", self.peer)
                self._refuse(RC.BAD_USER_NAME_OR_PASSWORD, "bad_username_or_password")
                return
        will, acl = self.will, self.acl
        if will is not None and acl is not None and self.version >= MQTT5 and not acl.can_publish(will.topic):
            # Told now, with the reason, rather than finding out when the will was due that it never went
            # out. A v3 refusal (code 5) would read as bad credentials, so v3 clients are accepted and
            # their will is dropped (counted, logged) when it would be published; so is a v5 client's if
            # the rules change while it is connected.
            log.info("refusing %r: not authorized to publish its will on %r", self.client_id, will.topic)
            self._refuse(RC.NOT_AUTHORIZED, "will_not_authorized", "will topic not authorized")
            return
        try:
            session, present = await self.node.cm.open_session(self, expiry, receive_max)
        except Exception as e:
            log.warning("cannot open session for %r: %s", self.client_id, e)
            if self.state != State.CLOSED:
                self._refuse(RC.SERVER_UNAVAILABLE, "server_unavailable")
            return
        if self.state == State.CLOSED:  # the socket went away while we waited
            self.session = session
            self.node.cm.channel_closed(self)
            return
        self.session = session
        self.state = State.CONNECTED
        self.connected_at = self.io.time()
        unreadable = self._guard_session()
        self.io.write(encode(Connack(present, 0, connack_props), self.version))
        self._arm_keepalive()
        if self.ev is not None:  # the backlog a resumed session brings: what queued while it was away
            self.ev.emit(
                CONNECT,
                self.zone_name,
                self.client_id,
                inflight_len=len(session.inflight),
                mqueue_len=len(session.mqueue),
                reason="resumed" if present else "new",
            )
        now = self.io.time()
        if present:
            self.node.metrics.takeover.observe(time.perf_counter() - t0)
            for d in session.pending_resend(now):
                self._resend(d)
        if unreadable:
            self._unauthorized(unreadable)
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

    def _connect_timeout(self) -> None:
        self._ka_timer = None
        if self.state == State.NEW:
            log.info("closing %s: no CONNECT within %ss", self.peer, self.zone.idle_timeout)
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
            self._ka_timer = self.io.call_later(ka.timeout, self._check_keepalive)

    def _check_keepalive(self) -> None:
        self._ka_timer = None
        if self.state != State.CONNECTED or self.keepalive is None:
            return
        left = self.keepalive.remaining(self.last_recv, self.io.time())
        if left > 0:
            self._ka_timer = self.io.call_later(left, self._check_keepalive)
            return
        self.zm.keepalive_timeouts += 1
        if self.ev is not None:
            self.ev.emit(KEEPALIVE_TIMEOUT, self.zone_name, self.client_id)
        log.info("keep alive timeout for %r after %.1fs of silence", self.client_id, self.keepalive.timeout)
        self.disconnect(RC.KEEP_ALIVE_TIMEOUT, "keepalive_timeout")

    def _arm_retry(self) -> None:
        if not self.retry or self._retry_timer is not None or self.session is None:
            return
        due = self.session.next_retry(self.zone.retry_interval)
        if due is not None:
            self._retry_timer = self.io.call_later(max(0.0, due - self.io.time()), self._on_retry)

    def _on_retry(self) -> None:
        self._retry_timer = None
        if self.state != State.CONNECTED or self.session is None:
            return
        for d in self.session.retry_due(self.io.time(), self.zone.retry_interval):
            self._resend(d)
        self._arm_retry()

    def _arm_rel_timer(self) -> None:
        if self._rel_timer is not None or self.session is None:
            return
        due = self.session.next_awaiting_rel_expiry()
        if due is not None:
            self._rel_timer = self.io.call_later(max(0.0, due - self.io.time()), self._on_rel_timer)

    def _on_rel_timer(self) -> None:
        self._rel_timer = None
        if self.state != State.CONNECTED or self.session is None:
            return
        n = self.session.expire_awaiting_rel(self.io.time())
        if n:
            self.zm.dropped["awaiting_rel_timeout"] += n
            if self.ev is not None:
                self.ev.emit(AWAITING_REL_TIMEOUT, self.zone_name, self.client_id, reason=str(n))
        self._arm_rel_timer()

    # ---------------------------------------------------------------------------------------------
    # PUBLISH from the client
    # ---------------------------------------------------------------------------------------------
    def _on_publish(self, p: Publish) -> None:
        topic = p.topic
        props = p.properties
        if props and self.version >= MQTT5:
            alias = props.get(Prop.TOPIC_ALIAS)
            if alias is not None:
                if alias > self.zone.max_topic_alias:
                    return self.protocol_error(RC.TOPIC_ALIAS_INVALID, f"topic alias {alias} above maximum")
                aliases = self._aliases_in
                if aliases is None:
                    aliases = self._aliases_in = {}
                if topic:
                    aliases[alias] = topic
                else:
                    topic = aliases.get(alias, "")
                    if not topic:
                        return self.protocol_error(RC.PROTOCOL_ERROR, f"unknown topic alias {alias}")
            if props.get(Prop.PAYLOAD_FORMAT_INDICATOR) == 1:
                try:
                    p.payload.decode()
                except UnicodeDecodeError:
                    self.zm.dropped["payload_format_invalid"] += 1
                    return self._publish_refused(p, RC.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8")
        qos = p.qos
        self.zm.received[qos] += 1
        bucket = self.publish_rate
        # over the zone's publish rate: v5 is refused and told so (v3 is throttled in _dispatch instead)
        if bucket is not None and self.version >= MQTT5 and bucket.take(self.io.time()):
            self.zm.dropped["rate_limited"] += 1
            return self._publish_refused(p, RC.QUOTA_EXCEEDED, "publish rate exceeded")
        acl = self.acl
        if acl is not None and not acl.can_publish(topic):
            self.zm.dropped["not_authorized"] += 1
            return self._publish_refused(p, RC.NOT_AUTHORIZED, "not authorized")
        session = self.session
        assert session is not None
        if (
            qos
            and self.version >= MQTT5
            and len(session.awaiting_rel) + self._acks_pending >= self.zone.receive_maximum
            and p.packet_id not in session.awaiting_rel
        ):
            return self.protocol_error(
                RC.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged PUBLISH than allowed"
            )
        if qos == 2:
            try:
                fresh = session.await_rel(p.packet_id, self.io.time())
            except AwaitingRelFull:
                self.zm.dropped["awaiting_rel_full"] += 1
                if self.version >= MQTT5:  # refused, and the client can see it was
                    self._send_ack(PUBREC, p.packet_id, RC.RECEIVE_MAXIMUM_EXCEEDED)
                else:  # a v3 PUBREC cannot say "refused": close unacked so the client resends later
                    self.protocol_error(RC.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS2 messages awaiting PUBREL")
                return
            if not fresh:  # a resent PUBLISH before PUBREL: delivered once already
                self._send_ack(PUBREC, p.packet_id, 0)
                return
            if self._rel_timer is None:
                self._arm_rel_timer()
        msg = Message.from_publish(topic, p.payload, qos, p.retain, props, self.client_id)
        if self.ev is not None and (msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
            self._event(PUBLISH_IN, msg, qos, p.packet_id or -1)
        matched, needs_commit = self.node.publish(msg, self.zone_name)
        if qos:
            rc = 0 if matched or self.version < MQTT5 else RC.NO_MATCHING_SUBSCRIBERS
            ptype = PUBACK if qos == 1 else PUBREC
            # A journaled QoS2 receipt (awaiting PUBREL) must be stored before PUBREC says "got it".
            if needs_commit or self._acks_pending or (qos == 2 and session.dirty is not None):
                self._ack_after_commit(ptype, p.packet_id, rc)
            else:
                self._send_ack(ptype, p.packet_id, rc)

    def _publish_refused(self, p: Publish, rc: int, why: str) -> None:
        """Not accepted: v5 clients learn why from the ack's reason code; v3 acks cannot say it (EMQX's
        default, acl_deny_action = ignore)."""
        if p.qos == 1:
            self._send_ack(PUBACK, p.packet_id, rc)
        elif p.qos == 2:
            self._send_ack(PUBREC, p.packet_id, rc)

    def _send_ack(self, ptype: int, packet_id: int, rc: int) -> None:
        self.io.write(encode_ack(ptype, packet_id, rc if self.version >= MQTT5 else 0, self.version))

    def _ack_after_commit(self, ptype: int, packet_id: int, rc: int) -> None:
        """Publisher confirm: the ack waits until the message is stored for every persistent session."""
        self._acks_pending += 1

        def release(ok: bool) -> None:
            self._acks_pending -= 1
            if self.state != State.CONNECTED:
                return
            if ok:
                self._send_ack(ptype, packet_id, rc)
            else:  # not stored, so not acknowledged: the client resends on its next connection
                if ptype == PUBREC and self.session is not None:
                    self.session.release(packet_id)
                self.disconnect(RC.SERVER_UNAVAILABLE if self.version >= MQTT5 else 0, "store_error")

        self.node.committer.after(release)

    def _on_pubrel(self, p: Pubrel) -> None:
        assert self.session is not None
        found = self.session.release(p.packet_id)
        rc = 0 if found else RC.PACKET_IDENTIFIER_NOT_FOUND
        if self._acks_pending or self.session.dirty is not None:
            self._ack_after_commit(PUBCOMP, p.packet_id, rc)
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
        self.zm.acked[1] += 1
        self.zm.latency.observe(time.time() - d.msg.ts)
        if self.ev is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
            self._event(ACK, d.msg, d.qos, d.packet_id)
        if session.mqueue:
            self._send_deliveries(*session.refill(self.io.time()))

    def _on_pubrec(self, p: Pubrec) -> None:
        session = self.session
        assert session is not None
        failed = p.reason_code >= 0x80
        d = session.pubrec(p.packet_id, self.io.time(), failed)
        if d is None:
            self._send_ack(PUBREL, p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND)
            return
        if failed:
            if session.mqueue:
                self._send_deliveries(*session.refill(self.io.time()))
            return
        if session.dirty is not None:
            # The PUBREL stage must be stored before PUBREL goes out: a node taking over after a crash
            # would otherwise resend the PUBLISH, which the client (having released the id) takes as new.
            pid = p.packet_id
            self._after_store(lambda: self._send_ack(PUBREL, pid, 0))
        else:
            self._send_ack(PUBREL, p.packet_id, 0)

    def _on_pubcomp(self, p: Pubcomp) -> None:
        session = self.session
        assert session is not None
        d = session.pubcomp(p.packet_id)
        if d is None:
            return
        self.zm.acked[2] += 1
        self.zm.latency.observe(time.time() - d.msg.ts)
        if self.ev is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
            self._event(ACK, d.msg, d.qos, d.packet_id)
        if session.mqueue:
            self._send_deliveries(*session.refill(self.io.time()))

    def _event(self, kind: str, msg: Message, qos: int, packet_id: int = -1, reason: str = "") -> None:
        """An event about one message of this client's, with its window and queue at that moment (the
        caller checked that the log is on and, for the per-message kinds, that it keeps this message)."""
        ev, s = self.ev, self.session
        assert ev is not None
        ev.emit(
            kind,
            self.zone_name,
            self.client_id,
            msg.msg_id,
            msg.topic,
            qos,
            packet_id,
            len(msg.payload),
            reason,
            len(s.inflight) if s is not None else -1,
            len(s.mqueue) if s is not None else -1,
        )

    def _drop_events(self, dropped: list[Delivery], reason: str) -> None:
        """One drop event per message, with the queue's length then (the backlog the pipeline sizes for)."""
        for d in dropped:
            self._event(DROP, d.msg, d.qos, reason=reason)

    # ---------------------------------------------------------------------------------------------
    # read access (the subscriber's zone rules decide, whatever filter matched and wherever it came from)
    # ---------------------------------------------------------------------------------------------
    def _may_read(self, msg: Message, qos: int) -> bool:
        acl = self.acl
        if acl is None or acl.can_read(msg.topic):
            return True
        self.zm.dropped["not_authorized"] += 1
        if self.ev is not None:
            self._event(DROP, msg, qos, reason="not_authorized")
        return False

    def _unauthorized(self, dropped: list[Delivery]) -> None:
        self.zm.dropped["not_authorized"] += len(dropped)
        if self.ev is not None:
            self._drop_events(dropped, "not_authorized")

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
    def deliver_delivery(self, d: Delivery) -> None:
        """A delivery pulled from the store (already counted in the session's order if journaled).

        Another node queued it without knowing this client's rules: read access is checked here.
        """
        acl = self.acl
        if acl is not None and acl.guards_read and not acl.can_read(d.msg.topic):
            if self.session is not None and d.order >= 0:
                self.session.forget(d)  # the pull journaled it
            self._unauthorized([d])
            return
        if d.qos == 0:
            self.deliver(d.msg, 0, d.retain, d.sub_ids)
            if self.session is not None and d.order >= 0:
                self.session.forget(d)  # it was journaled by the pull; now it is sent
            return
        self._deliver(d)

    def deliver(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...] | None) -> None:
        """A message routed to this client: QoS0 at once, QoS1/2 through the Inflight Window.

        While the socket cannot keep up (`congested`), QoS1/2 wait in the Message Queue, bounded by
        max_mqueue_len, and QoS0 is dropped: a slow subscriber never grows the node's memory unbounded.
        """
        if self.read_guard and not self._may_read(msg, qos):
            return
        if qos == 0:
            ev = self.ev
            if self.congested:
                self.zm.dropped["queue_full"] += 1
                if ev is not None:
                    self._event(DROP, msg, 0, reason="queue_full")
                return
            data = self._encode(msg, 0, retain, 0, False, sub_ids)
            if data is not None:
                self.io.write(data)
                self.zm.delivered[0] += 1
                if ev is not None and (msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < ev.keep:
                    self._event(DELIVER, msg, 0)
            return
        self._deliver(Delivery(msg, qos, retain, sub_ids))

    def _deliver(self, d: Delivery) -> None:
        session = self.session
        assert session is not None
        sent, dropped = session.deliver(d, self.io.time(), hold=self.congested)
        if sent is not None:
            if not self._send_publish(sent) and session.mqueue:
                self._send_deliveries(*session.refill(self.io.time()))
            elif self._retry_timer is None and self.retry:
                self._arm_retry()
        else:
            self.zm.inflight_full += 1
            if dropped:
                self.zm.dropped["queue_full"] += len(dropped)
            if self.ev is not None:
                self._event(INFLIGHT_FULL, d.msg, d.qos)
                if dropped:
                    self._drop_events(dropped, "queue_full")

    def _encode(
        self, msg: Message, qos: int, retain: bool, packet_id: int, dup: bool, sub_ids: tuple[int, ...] | None
    ) -> bytes | None:
        version = self.version
        if version < MQTT5:
            return msg.encode(version, qos, retain, packet_id, dup)
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
            self.zm.dropped["too_large"] += 1
            if self.ev is not None:
                self._event(DROP, msg, qos, reason="too_large")
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
        self.zm.delivered[d.qos] += 1
        if self.ev is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
            self._event(RETRANSMIT if dup else DELIVER, d.msg, d.qos, d.packet_id)
        if d.qos == 2 and not dup and session.dirty is not None:
            # Exactly once across a crash: the packet id must be stored before the client sees it, or a
            # node taking over could give that id to another message, which the client would take for a
            # resend of this one.
            self._after_store(lambda: self.io.write(data))
        else:
            self.io.write(data)
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
                        self.io.write(data)
                        self.zm.delivered[0] += 1
                        if self.ev is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
                            self._event(DELIVER, d.msg, 0)
                elif not self._send_publish(d):
                    freed = True
            if expired:
                self.zm.dropped["expired"] += len(expired)
                if self.ev is not None:
                    self._drop_events(expired, "expired")
            if not (freed and session.mqueue):
                break
            sent, expired = session.refill(self.io.time())
        if self._retry_timer is None and self.retry and session.inflight:
            self._arm_retry()

    def _resend(self, d: Delivery) -> None:
        self.zm.retransmitted += 1
        if d.stage == 0:
            self._send_publish(d, dup=True)  # its event: retransmit
        else:
            self._send_ack(PUBREL, d.packet_id, 0)
            if self.ev is not None and (d.msg.msg_id * SAMPLE_MIX & SAMPLE_MASK) < self.ev.keep:
                self._event(RETRANSMIT, d.msg, d.qos, d.packet_id, reason="pubrel")

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
            guarded = access is Access.FILTERED
            if guarded:
                self.read_guard = True
            if group is not None and opts.no_local and self.version >= MQTT5:
                return self.protocol_error(RC.PROTOCOL_ERROR, "no local on a shared subscription")
            sub = Subscription(
                opts.qos, opts.no_local, opts.retain_as_published, opts.retain_handling, sub_id
            )
            existed = topic_filter in session.subscriptions
            session.subscriptions[topic_filter] = sub
            self.node.router.add(self.client_id, topic_filter, sub)
            self._store_route(topic_filter, sub)
            codes.append(opts.qos)
            if group is None and (opts.retain_handling == 0 or (opts.retain_handling == 1 and not existed)):
                retained.append((topic_filter, sub, guarded))
        suback = encode(Suback(p.packet_id, codes), self.version)

        def finish() -> None:
            self.io.write(suback)
            now = time.time()
            acl = self.acl
            for topic_filter, sub, guarded in retained:
                sub_ids = (sub.sub_id,) if sub.sub_id else None
                for msg in self.node.retained.match(topic_filter, now):
                    if guarded and acl is not None and not acl.can_read(msg.topic):
                        continue  # never sent, so not a drop: the retained message stays for others
                    # [MQTT-3.3.1-9]: a retained message sent for a new subscription has RETAIN=1.
                    self.deliver(msg, min(msg.qos, sub.qos), True, sub_ids)

        self._after_store(finish)

    def _store_route(self, topic_filter: str, sub: Subscription | None) -> None:
        """Subscriptions are the fleet's route table: a durable store keeps them with the session."""
        if self.node.store.durable and self.session is not None:
            self.node.committer.add(Route(self.client_id, self.session.epoch, topic_filter, sub))

    def _after_store(self, reply: Callable[[], None]) -> None:
        """Answer once what this packet changed is stored (at once with nothing to wait for)."""
        if not self.node.store.durable:
            reply()
            return

        def done(ok: bool) -> None:
            if self.state != State.CONNECTED:
                return
            if ok:
                reply()
            else:
                self.disconnect(RC.SERVER_UNAVAILABLE if self.version >= MQTT5 else 0, "store_error")

        self.node.committer.after(done)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in p.topics:
            if session.subscriptions.pop(topic_filter, None) is not None:
                self.node.router.remove(self.client_id, topic_filter)
                self._store_route(topic_filter, None)
                codes.append(RC.SUCCESS)
            else:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
        unsuback = encode(Unsuback(p.packet_id, codes), self.version)
        self._after_store(lambda: self.io.write(unsuback))

    def _on_pingreq(self, p: Pingreq) -> None:
        self.io.write(PINGRESP_BYTES)

    def _on_disconnect(self, p: Disconnect) -> None:
        if self.version >= MQTT5:
            expiry = p.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
            if expiry is not None and self.session is not None:
                if self.session.expiry_interval == 0 and expiry != 0:
                    return self.protocol_error(RC.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0")
                cap = self.zone.session_expiry_interval
                self.session.expiry_interval = min(float(expiry), cap) if expiry != NEVER_EXPIRE else cap
            if p.reason_code != RC.DISCONNECT_WITH_WILL:
                self.will = None
        else:
            self.will = None
        self.zm.disconnects["normal" if p.reason_code == 0 else reason_name(p.reason_code)] += 1
        self.close_reason = "client_disconnect"
        self.state = State.CLOSED
        self._cancel_timers()
        self.io.close()

    def _on_auth(self, p: Auth) -> None:
        self.protocol_error(RC.PROTOCOL_ERROR, "AUTH without an authentication method")

    # ---------------------------------------------------------------------------------------------
    # called by the channel manager
    # ---------------------------------------------------------------------------------------------
    def kick(self, reason: int, why: str) -> None:
        """Close this connection on the server's initiative (takeover, shutdown)."""
        self.disconnect(reason, why)

    def set_congested(self, congested: bool) -> None:
        """The socket's write buffer crossed its high (True) or low (False) water mark."""
        self.congested = congested
        if (
            not congested
            and self.state == State.CONNECTED
            and self.session is not None
            and self.session.mqueue
        ):
            self._send_deliveries(*self.session.refill(self.io.time()))

    def apply_zone(self) -> None:
        """Pick up changed zone settings (window, queue limit, retry) at the next delivery."""
        zone = self.node.zones.get(self.zone_name)
        if zone is None:
            return  # its zone left the config (with its listener, which closes this connection)
        self.zone = zone
        if self.state in (State.CONNECTING, State.CONNECTED):
            zone_acl = self.node.acl.get(self.zone_name)
            self.acl = zone_acl.bind(self.username, self.client_id) if zone_acl is not None else None
        self.parser.max_packet_size = zone.max_packet_size
        if not zone.max_publish_rate:
            self.publish_rate = None
        elif self.publish_rate is None or self.publish_rate.rate != zone.max_publish_rate:
            self.publish_rate = TokenBucket(zone.max_publish_rate, self.io.time())
        if self.session is not None:
            dropped = self.session.apply_zone(self.zone)
            if dropped:
                self.zm.dropped["queue_full"] += len(dropped)
                if self.ev is not None:
                    self._drop_events(dropped, "queue_full")
            unreadable = self._guard_session()  # a revoked read stops deliveries without a reconnect
            if unreadable:
                self._unauthorized(unreadable)
            if self.state == State.CONNECTED:
                self._send_deliveries(*self.session.refill(self.io.time()))


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
