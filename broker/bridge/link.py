"""One connection of a bridge, sans I/O: the relay between the fleet and a remote broker.

A bridge is an MQTT session in the fleet's store, "$bridge:<name>", whose subscriptions are the bridge's
forwards. The link speaks to that session as its client, in process, through an ordinary Channel, and to
the remote broker as its client too. MQTT's PUBLISH flows are the same in both directions, so the link
only relays, with packet ids unchanged:

- egress: the session delivers a message (PUBLISH, its packet id from the session) -> the link maps the
  topic and sends it to the remote under that packet id; the remote's PUBACK / PUBREC / PUBCOMP go back
  to the session, and the session's PUBREL to the remote. What the session has not seen acknowledged it
  sends again, in order and with its packet ids, on the next connection: the remote's QoS 2 state
  recognises the repeats, so QoS 2 stays exactly once end to end.
- ingress: the remote publishes (its packet id) -> the link maps the topic and publishes it to the
  session's channel under that id; the fleet acknowledges once the message is stored (publisher
  confirms), and the ack goes back to the remote. QoS 2 is exactly once through the session's
  awaiting-PUBREL state.

The session's queue, window, retries and fencing are the fleet's own (journaled in Redis): whichever node
runs the link, the session is the same. The link adds what is specific to bridging: topic mapping,
loop prevention, QoS and size limits of the remote, keep alive and an acknowledgement watchdog.

Set-up order keeps the packet id spaces apart: the remote SUBSCRIBE is answered before any PUBLISH goes
to the remote, and the local SUBSCRIBE before any remote PUBLISH goes to the session.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..bridges import BridgeConfig, Forward
from ..codec import (
    MQTT5,
    RC,
    Connack,
    Connect,
    Disconnect,
    Parser,
    Pingreq,
    Pingresp,
    Prop,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOpts,
    Subscribe,
    encode,
    encode_ack,
    encode_properties,
    encode_publish,
)
from ..eventschema import BridgeCloseReason as Close
from ..eventschema import BridgeDropReason as Drop
from ..topic import topic_matches
from ..topicmap import Template
from . import loop as bridgeloop

#: Session Expiry Interval of the bridge's session in the fleet: it never expires while the bridge exists.
LOCAL_EXPIRY = 0xFFFFFFFF
#: Properties of a delivery that go on to the remote (the rest are the local connection's own).
_REMOTE_PROPS = (
    Prop.PAYLOAD_FORMAT_INDICATOR,
    Prop.MESSAGE_EXPIRY_INTERVAL,
    Prop.CONTENT_TYPE,
    Prop.RESPONSE_TOPIC,
    Prop.CORRELATION_DATA,
)
#: egress routes kept (by topic, of messages without properties): past this many the cache starts over
_ROUTES_CACHED = 4096
_SUB_PID = 1  # the one SUBSCRIBE each side gets, before any PUBLISH uses packet ids there
#: how long the remote may take to answer CONNECT (and the SUBSCRIBE after it) before the attempt counts
#: as failed: a remote that accepts connections but never answers must not stall the bridge
CONNECT_TIMEOUT = 5.0


def local_connect(cfg: BridgeConfig, window: int) -> Connect:
    """The CONNECT of the bridge's session in the fleet: resumed, never expiring, with the window the
    remote allows. It stays in the fleet with persist off too (its subscriptions at QoS 0), so what comes
    while the remote is away is counted as dropped, or kept when queue.storeQos0 asks for it."""
    props: dict[int, Any] = {Prop.RECEIVE_MAXIMUM: window, Prop.SESSION_EXPIRY_INTERVAL: LOCAL_EXPIRY}
    return Connect(cfg.session_id, proto_level=MQTT5, clean_start=False, keepalive=0, properties=props)


def local_subscriptions(cfg: BridgeConfig) -> list[tuple[str, SubOpts]]:
    """The bridge session's subscriptions: its forwards, capped at QoS 0 without persistence, No Local
    (what comes in over the bridge does not go back out of it)."""
    cap = 2 if cfg.persist else 0
    return [
        (f.filter, SubOpts(qos=min(f.max_qos, cap), no_local=True, retain_as_published=f.preserve_retain))
        for f in cfg.forwards
    ]


class Phase:
    REMOTE_CONNECT = "remote-connect"  # CONNECT sent to the remote
    REMOTE_SUBSCRIBE = "remote-subscribe"  # its SUBSCRIBE sent
    LOCAL_CONNECT = "local-connect"  # CONNECT sent to the session's channel
    LOCAL_SUBSCRIBE = "local-subscribe"
    UP = "up"
    CLOSED = "closed"


class BridgeLink:
    """Feed it bytes from either side (`remote_data`, `local_data`) and the time (`tick`); take what to
    send (`take_remote`, `take_local`). `closed` says why the link ended; counters say what it did."""

    def __init__(self, cfg: BridgeConfig, fleet: str, password: bytes | None, now: float) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.version = cfg.remote.mqtt_version
        self.persist = cfg.persist
        self.phase = Phase.REMOTE_CONNECT
        self.closed: str | None = None
        self.close_kind: Close | None = None
        self.remote_present = False
        self.session_lost = False  # the remote had lost the session while the fleet had messages in flight
        self.remote_max_packet = 0  # 0: no limit announced
        self.forwarded = 0
        self.received = 0
        self.dropped: Counter[Drop] = Counter()
        self._new_drops: list[Drop] = []  # since take_drops (for the event log)
        self.refused_subscriptions: list[str] = []
        self.draining = False  # (drain: the node hands the bridge over)
        self.window = min(cfg.max_inflight, 65535)  # the session's, at most the remote's Receive Maximum
        self._remote = Parser(version=self.version)
        self._local = Parser(version=MQTT5)
        self._to_remote = bytearray()
        self._to_local: list[Any] = []  # packets for the session's channel (in process: never encoded)
        self._held: list[Any] = []  # remote packets that wait until the session's channel is ready
        self._forwards = [
            (f, Template.parse(f.destination), [(k, v) for k, v in f.user_properties.items()])
            for f in cfg.forwards
        ]
        self._ingress = [(s.filter, Template.parse(s.destination)) for s in cfg.subscriptions]
        self._routes: dict[str, tuple[bytes, bytes | None] | Drop] = {}  # egress routes by topic
        self._peer = cfg.remote.peer
        # egress packet ids unacknowledged by the remote, and since when (the watchdog)
        self._unacked: dict[int, float] = {}
        # the remote's Receive Maximum, and what waits for one of its slots (packet id -> PUBLISH bytes, in
        # order): a resumed session can hold more unacknowledged messages than this remote takes at once
        self._send_max = 65535
        self._held_out: dict[int, bytes] = {}
        # QoS 2 flows the link completes itself (dropped messages): ids from the session, from the remote
        self._local_drops: set[int] = set()
        self._remote_drops: set[int] = set()
        self._last_sent = now
        self._last_recv = now
        self._started = now
        props: dict[int, Any] = {}
        if self.version >= MQTT5:
            props[Prop.SESSION_EXPIRY_INTERVAL] = int(cfg.remote.session_expiry) if self.persist else 0
            props[Prop.RECEIVE_MAXIMUM] = min(cfg.max_inflight, 65535)
        self._send_remote(
            Connect(
                cfg.client_id(fleet),
                proto_level=self.version,
                clean_start=not self.persist,
                keepalive=int(cfg.remote.keepalive),
                username=cfg.remote.username,
                password=password,
                properties=props,
            ),
            now,
        )

    @property
    def live(self) -> bool:
        return self.closed is None

    def drain(self) -> None:
        """Send the remote nothing new: what it has completes (acks, PUBREL), and what the session delivers
        from now on stays in its window, unsent, for whichever node leads the bridge next."""
        self.draining = True

    @property
    def settled(self) -> bool:
        """Whether the remote acknowledged everything it was sent (nothing it would get a second time)."""
        return not self._unacked

    # -- output ------------------------------------------------------------------------------------
    def take_remote(self) -> bytes:
        out, self._to_remote = bytes(self._to_remote), bytearray()
        return out

    def take_local(self) -> list[Any]:
        out, self._to_local = self._to_local, []
        return out

    @property
    def drops_pending(self) -> bool:
        return bool(self._new_drops)

    def take_drops(self) -> list[Drop]:
        """The reasons of the messages dropped since the last call, one per message."""
        out, self._new_drops = self._new_drops, []
        return out

    def _drop(self, reason: Drop) -> None:
        self.dropped[reason] += 1
        self._new_drops.append(reason)

    def _send_remote(self, packet: Any, now: float) -> None:
        self._to_remote += encode(packet, self.version)
        self._last_sent = now

    def _ack_remote(self, ptype: type, packet_id: int, now: float) -> None:
        self._to_remote += encode(ptype(packet_id), self.version)
        self._last_sent = now

    def _send_local(self, packet: Any) -> None:
        self._to_local.append(packet)

    def close(self, why: str, kind: Close = Close.STOPPED) -> None:
        """End the link (`kind`: a Close value, for metrics): a v5 remote is told (normal disconnection
        keeps its session)."""
        if self.closed is not None:
            return
        self.close_kind = kind
        if self.version >= MQTT5 and self.phase != Phase.REMOTE_CONNECT:
            self._to_remote += encode(Disconnect(0), MQTT5)
        self.closed = why
        self.phase = Phase.CLOSED

    # -- time --------------------------------------------------------------------------------------
    def tick(self, now: float) -> float | None:
        """Keep alive and the acknowledgement watchdog; returns when to tick next (None: closed)."""
        if self.closed is not None:
            return None
        if (
            self.phase in (Phase.REMOTE_CONNECT, Phase.REMOTE_SUBSCRIBE)
            and now - self._started >= CONNECT_TIMEOUT
        ):
            what = "CONNACK" if self.phase == Phase.REMOTE_CONNECT else "SUBACK"
            self.close(f"no {what} from the remote within {CONNECT_TIMEOUT:.0f}s", Close.CONNECT_ERROR)
            return None
        keepalive = self.cfg.remote.keepalive
        if self._unacked:
            oldest = min(self._unacked.values())
            if now - oldest >= self.cfg.ack_timeout:
                self.close("no acknowledgement within ack_timeout", Close.ACK_TIMEOUT)
                return None
        if keepalive:
            if now - self._last_recv >= 1.5 * keepalive:
                self.close("the remote went silent past its keep alive", Close.KEEPALIVE_TIMEOUT)
                return None
            if now - self._last_sent >= keepalive:
                self._send_remote(Pingreq(), now)
        step = min(keepalive or self.cfg.ack_timeout, self.cfg.ack_timeout, CONNECT_TIMEOUT) / 4
        return now + max(step, 0.05)

    # -- the remote --------------------------------------------------------------------------------
    def remote_data(self, data: bytes, now: float) -> None:
        if self.closed is not None:
            return
        self._last_recv = now
        try:
            packets = self._remote.feed(data)
        except ProtocolError as e:
            for p in e.packets:
                self._from_remote(p, now)
            self.close(f"remote protocol error: {e}", Close.PROTOCOL_ERROR)
            return
        for p in packets:
            if not self.live:
                return
            self._from_remote(p, now)

    def _from_remote(self, p: Any, now: float) -> None:
        kind = type(p)
        phase = self.phase
        if phase == Phase.REMOTE_CONNECT:
            if kind is not Connack:
                self.close(f"remote sent {kind.__name__} before CONNACK", Close.PROTOCOL_ERROR)
            else:
                self._remote_connack(p, now)
            return
        if phase == Phase.REMOTE_SUBSCRIBE and kind is Suback and p.packet_id == _SUB_PID:
            codes = p.reason_codes
            self.refused_subscriptions = [
                s.filter for s, code in zip(self.cfg.subscriptions, codes, strict=False) if code >= 0x80
            ]
            self._connect_local()
            return
        if kind is Pingresp or kind is Suback:
            return
        if kind is Disconnect:
            self.close(f"remote disconnected (reason 0x{p.reason_code:02X})", Close.REMOTE_CLOSED)
            return
        if kind in (Puback, Pubrec, Pubcomp):  # acks of egress
            self._remote_ack(p, now)
            return
        if kind is Publish or kind is Pubrel:
            if phase != Phase.UP:
                self._held.append(p)
            elif kind is Publish:
                self._ingress_publish(p, now)
            else:
                self._ingress_pubrel(p, now)
            return
        self.close(f"unexpected {kind.__name__} from the remote", Close.PROTOCOL_ERROR)

    def _remote_connack(self, p: Connack, now: float) -> None:
        if p.reason_code:
            self.close(f"remote refused the connection (reason 0x{p.reason_code:02X})", Close.REFUSED)
            return
        self.remote_present = p.session_present
        self.remote_max_packet = p.properties.get(Prop.MAXIMUM_PACKET_SIZE, 0)
        self._send_max = p.properties.get(Prop.RECEIVE_MAXIMUM, 65535)
        self.window = min(self.window, self._send_max)
        if not self.cfg.subscriptions:
            self._connect_local()
            return
        v5 = self.version >= MQTT5
        qos_cap = 2 if self.persist else 0
        subs = [
            (s.filter, SubOpts(qos=min(s.max_qos, qos_cap), no_local=v5, retain_as_published=v5))
            for s in self.cfg.subscriptions
        ]
        self._send_remote(Subscribe(_SUB_PID, subs), now)
        self.phase = Phase.REMOTE_SUBSCRIBE

    def _remote_ack(self, p: Any, now: float) -> None:
        pid = p.packet_id
        if type(p) is Pubrec and p.reason_code < 0x80:
            self._unacked[pid] = now  # now waiting for PUBCOMP
        else:
            self._unacked.pop(pid, None)
            if p.reason_code >= 0x80:
                self._drop(Drop.REMOTE_REFUSED)
            else:
                self.forwarded += 1
            self._release_held(now)
        self._send_local(p)

    def _release_held(self, now: float) -> None:
        """Send what waited for the remote's Receive Maximum, in order, as far as its slots allow."""
        held = self._held_out
        while held and len(self._unacked) < self._send_max and not self.draining:
            pid = next(iter(held))
            self._to_remote += held.pop(pid)
            self._unacked[pid] = now
            self._last_sent = now

    # -- ingress -----------------------------------------------------------------------------------
    def _ingress_publish(self, p: Publish, now: float) -> None:
        props = p.properties
        user = props.get(Prop.USER_PROPERTY) or []
        if bridgeloop.ingress_loops(user, self.fleet):
            return self._drop_ingress(p, Drop.LOOP, now)
        topic = None
        for topic_filter, template in self._ingress:
            if topic_matches(topic_filter, p.topic):
                topic = template.render(p.topic)
                break
        if not topic:  # (none of the subscriptions, or an empty topic)
            return self._drop_ingress(p, Drop.UNMAPPED, now)
        out = {k: v for k, v in props.items() if k in _REMOTE_PROPS}
        if self.version >= MQTT5:
            out[Prop.USER_PROPERTY] = bridgeloop.ingress(user, self._peer)
        self.received += 1
        self._send_local(Publish(topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, out))

    def _drop_ingress(self, p: Publish, reason: Drop, now: float) -> None:
        self._drop(reason)
        if p.qos == 1:
            self._ack_remote(Puback, p.packet_id, now)
        elif p.qos == 2:
            self._remote_drops.add(p.packet_id)
            self._ack_remote(Pubrec, p.packet_id, now)

    def _ingress_pubrel(self, p: Pubrel, now: float) -> None:
        if p.packet_id in self._remote_drops:
            self._remote_drops.discard(p.packet_id)
            self._ack_remote(Pubcomp, p.packet_id, now)
            return
        self._send_local(p)

    # -- the session's channel ---------------------------------------------------------------------
    def _connect_local(self) -> None:
        self._send_local(local_connect(self.cfg, self.window))
        self.phase = Phase.LOCAL_CONNECT

    def local_data(self, items: list[bytes | Publish], now: float) -> None:
        """What the session's channel wrote: bytes, and PUBLISH packets it handed over unencoded."""
        for item in items:
            if self.closed is not None:
                return
            if type(item) is not bytes:
                self._from_local(item, now)
                continue
            try:
                packets = self._local.feed(item)
            except ProtocolError as e:  # pragma: no cover - the fleet's own channel
                self.close(f"local protocol error: {e}", Close.FLEET)
                return
            for p in packets:
                if not self.live:
                    return
                self._from_local(p, now)

    def _from_local(self, p: Any, now: float) -> None:
        kind = type(p)
        if kind is Connack:
            if self.phase != Phase.LOCAL_CONNECT or p.reason_code:
                self.close(
                    f"the fleet refused the bridge's session (reason 0x{p.reason_code:02X})", Close.FLEET
                )
                return
            self._subscribe_local(now)
            return
        if kind is Suback:
            self._up(now)
            return
        if kind is Publish:
            self._egress_publish(p, now)
            return
        if kind is Pubrel:
            if p.packet_id in self._local_drops:
                self._local_drops.discard(p.packet_id)
                self._send_local(Pubcomp(p.packet_id))
                return
            self._unacked[p.packet_id] = now
            self._send_remote(p, now)
            return
        if kind in (Puback, Pubrec, Pubcomp):  # the fleet's acks of ingress
            self._to_remote += encode_ack(_PTYPE[kind], p.packet_id, p.reason_code, self.version)
            self._last_sent = now
            return
        if kind is Disconnect:
            why = "taken over" if p.reason_code == RC.SESSION_TAKEN_OVER else f"0x{p.reason_code:02X}"
            self.close(f"the fleet closed the bridge's session ({why})", Close.FLEET)
            return
        self.close(f"unexpected {kind.__name__} from the fleet", Close.FLEET)

    def _subscribe_local(self, now: float) -> None:
        if not self._forwards:
            self._up(now)
            return
        subs = local_subscriptions(self.cfg)
        self._send_local(Subscribe(_SUB_PID, subs))
        self.phase = Phase.LOCAL_SUBSCRIBE

    def _up(self, now: float) -> None:
        if self.phase == Phase.UP:
            return
        self.phase = Phase.UP
        held, self._held = self._held, []
        for p in held:
            if type(p) is Publish:
                self._ingress_publish(p, now)
            else:
                self._ingress_pubrel(p, now)

    # -- egress ------------------------------------------------------------------------------------
    def _egress_publish(self, p: Publish, now: float) -> None:
        if self.draining:
            return
        if p.dup and not self.remote_present:
            self.session_lost = True  # (the remote gets it as new: it had lost its copy)
        props = p.properties
        route: tuple[bytes, bytes | None] | Drop | None = None
        if props:
            route = self._route(p.topic, props)
        else:  # (the usual message: its route depends on its topic only, and is encoded once per topic)
            route = self._routes.get(p.topic)
            if route is None:
                route = self._route(p.topic, props)
                if len(self._routes) >= _ROUTES_CACHED:
                    self._routes.clear()
                self._routes[p.topic] = route
        if isinstance(route, Drop):
            return self._drop_egress(p, route)
        assert route is not None
        topic_b, props_b = route
        packet = encode_publish(
            topic_b, p.payload, p.qos, p.retain, p.dup, p.packet_id, props_b, self.version
        )
        if self.remote_max_packet and len(packet) > self.remote_max_packet:
            return self._drop_egress(p, Drop.TOO_LARGE)
        pid = p.packet_id
        if p.qos and pid not in self._unacked:
            if self._held_out or len(self._unacked) >= self._send_max:
                # [MQTT-4.9.0-2]: never more unacknowledged PUBLISH than the remote's Receive Maximum (a
                # remote answers the excess with 0x97 Quota exceeded: the message would be lost)
                self._held_out.setdefault(pid, packet)
                return
            self._unacked[pid] = now
        self._to_remote += packet
        self._last_sent = now
        if not p.qos:
            self.forwarded += 1

    def _route(self, topic: str, props: dict[int, Any]) -> tuple[bytes, bytes | None] | Drop:
        """Where a message goes at the remote: its mapped topic and (v5) property block, encoded, or why
        it does not go."""
        route = self._forward_for(topic)
        if route is None:
            return Drop.EXCLUDED
        _forward, template, extra = route
        mapped = template.render(topic)
        if not mapped:
            return Drop.UNMAPPED
        topic_b = mapped.encode()
        if len(topic_b) > 0xFFFF:
            return Drop.TOO_LARGE
        if self.version < MQTT5:
            return topic_b, None
        user = bridgeloop.egress(
            props.get(Prop.USER_PROPERTY) or [],
            self.fleet,
            self._peer,
            self.cfg.loop_prevention.hop_count_limit,
        )
        if user is None:
            return Drop.LOOP
        out = {k: v for k, v in props.items() if k in _REMOTE_PROPS}
        out[Prop.USER_PROPERTY] = user + extra
        return topic_b, encode_properties(out)

    def _forward_for(self, topic: str) -> tuple[Forward, Template, list[tuple[str, str]]] | None:
        """The first forward whose filter takes the topic and whose excludes do not."""
        for route in self._forwards:
            forward = route[0]
            if topic_matches(forward.filter, topic) and not any(
                topic_matches(x, topic) for x in forward.excludes
            ):
                return route
        return None

    def _drop_egress(self, p: Publish, reason: Drop) -> None:
        """Not for the remote: the session learns it is done with it all the same."""
        self._drop(reason)
        if p.qos == 1:
            self._send_local(Puback(p.packet_id))
        elif p.qos == 2:
            self._local_drops.add(p.packet_id)
            self._send_local(Pubrec(p.packet_id))


_PTYPE = {Puback: 4, Pubrec: 5, Pubcomp: 7}
