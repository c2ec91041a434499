"""Unit tests of the per-client protocol state machine (fleetmq.broker.channel), without sockets.

A Channel is fed bytes through `data_received` and writes through a fake ChannelIO that collects the
bytes, records close(), and has a fake clock and fake timers the tests fire by hand (tests/fakes.py). The Node behind it is
real (router, channel manager, memory store, group committer), so these are small end-to-end tests of the
EMQX delivery rules on one node.
"""

from __future__ import annotations

from typing import Any

import pytest
from fleetmq.broker.channel import State
from fleetmq.broker.codec import (
    MQTT5,
    MQTT311,
    PINGREQ_BYTES,
    PINGRESP_BYTES,
    RC,
    Connack,
    Connect,
    Disconnect,
    Pingresp,
    Prop,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOpts,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from fleetmq.broker.message import Delivery, Message

from tests.fakes import Client, Clock, connected, make_node, settle


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def sub_and_pub(
    clock: Clock,
    sub_version: int = MQTT311,
    pub_version: int = MQTT311,
    *,
    sub_props: dict[int, Any] | None = None,
    **zone: Any,
) -> tuple[Client, Client]:
    """A subscriber "sub" (its CONNECT carrying `sub_props`) and a publisher "pub", both connected to one
    node (its default zone set by `zone`); neither has subscribed yet."""
    node = make_node(**zone)
    sub = await connected(node, clock, "sub", sub_version, properties=sub_props or {})
    return sub, await connected(node, clock, "pub", pub_version)


async def offline_with_publisher(clock: Clock, **zone: Any) -> Client:
    """A publisher "pub" connected to a node (its default zone set by `zone`) that holds the offline v3.1.1
    session "dev", subscribed to "t" at QoS 1."""
    node = make_node(**zone)
    sub = await connected(node, clock, "dev", clean_start=False)
    sub.subscribe("t", qos=1)
    sub.ch.connection_lost()
    await settle()
    return await connected(node, clock, "pub")


# -----------------------------------------------------------------------------------------------
# CONNECT / CONNACK
# -----------------------------------------------------------------------------------------------


async def test_connect_v311_connack(clock):
    node = make_node()
    c = Client(node, clock, MQTT311)
    ack = await c.connect("dev1", clean_start=True)
    assert ack == Connack(session_present=False, reason_code=0, properties={})
    assert c.ch.state == State.CONNECTED
    assert node.cm.channels["dev1"] is c.ch
    assert not c.io.closed


async def test_connect_v5_connack_properties(clock):
    node = make_node(server_keepalive=10)
    c = Client(node, clock, MQTT5)
    ack = await c.connect("dev1", keepalive=60)
    assert ack.reason_code == 0 and ack.session_present is False
    props = ack.properties
    assert props[Prop.SERVER_KEEP_ALIVE] == 10
    assert props[Prop.MAXIMUM_PACKET_SIZE] == 1024 * 1024
    assert props[Prop.TOPIC_ALIAS_MAXIMUM] == 65535
    assert Prop.ASSIGNED_CLIENT_IDENTIFIER not in props
    # the keep alive in force is the server's: the timer is armed for 10 * 0.75 * 2 seconds
    [ka] = c.io.pending("_check_keepalive")
    assert ka.when == pytest.approx(clock.now + 15.0)


async def test_connect_v5_no_server_keepalive_property_by_default(clock):
    c = Client(make_node(), clock, MQTT5)
    ack = await c.connect("dev1", keepalive=60)
    assert Prop.SERVER_KEEP_ALIVE not in ack.properties
    [ka] = c.io.pending("_check_keepalive")
    assert ka.when == pytest.approx(clock.now + 90.0)


async def test_connect_v5_empty_client_id_gets_assigned_id(clock):
    node = make_node()
    c = Client(node, clock, MQTT5)
    ack = await c.connect("")
    assigned = ack.properties[Prop.ASSIGNED_CLIENT_IDENTIFIER]
    assert assigned and assigned == c.ch.client_id
    assert node.cm.channels[assigned] is c.ch
    c2 = Client(node, clock, MQTT5)
    ack2 = await c2.connect("")
    assert ack2.properties[Prop.ASSIGNED_CLIENT_IDENTIFIER] != assigned


async def test_connect_v311_empty_client_id(clock):
    node = make_node()
    ok = Client(node, clock, MQTT311)
    assert (await ok.connect("", clean_start=True)).reason_code == 0
    assert ok.ch.client_id
    refused = Client(node, clock, MQTT311)
    refused.send(Connect("", proto_level=MQTT311, clean_start=False))
    await settle()
    [ack] = refused.received()
    assert ack.reason_code == 2  # identifier rejected
    assert refused.io.closed


@pytest.mark.parametrize(("version", "code"), [(MQTT5, RC.CLIENT_IDENTIFIER_NOT_VALID), (MQTT311, 2)])
async def test_client_ids_starting_with_dollar_are_the_brokers_own(clock, version, code):
    """A bridge's session is "$bridge:<name>": no client may take it over."""
    node = make_node()
    c = Client(node, clock, version)
    c.send(Connect("$bridge:cloud", proto_level=version, clean_start=False))
    await settle()
    [ack] = c.received()
    assert ack.reason_code == code and c.io.closed


async def test_connect_v5_session_expiry_capped_by_zone(clock):
    c = Client(make_node(session_expiry_interval="1h"), clock, MQTT5)
    ack = await c.connect("dev1", properties={Prop.SESSION_EXPIRY_INTERVAL: 100000})
    assert ack.properties[Prop.SESSION_EXPIRY_INTERVAL] == 3600


async def test_connect_refused_when_anonymous_not_allowed(clock):
    c = Client(make_node(allow_anonymous=False), clock, MQTT5)
    c.send(Connect("dev1", proto_level=MQTT5))
    await settle()
    [ack] = c.received()
    assert ack.reason_code == RC.NOT_AUTHORIZED
    assert c.io.closed


# -----------------------------------------------------------------------------------------------
# protocol errors
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
async def test_pingreq_pingresp(clock, version):
    c = Client(make_node(), clock, version)
    await c.connect("dev1")
    c.send_raw(PINGREQ_BYTES)
    assert bytes(c.io.data[-2:]) == PINGRESP_BYTES
    assert c.received() == [Pingresp()]
    assert not c.io.closed


async def test_second_connect_v5_disconnect_0x82(clock):
    node = make_node()
    c = await connected(node, clock, "dev1", MQTT5)
    c.send(Connect("dev1", proto_level=MQTT5))
    await settle()
    [d] = c.received()
    assert type(d) is Disconnect and d.reason_code == RC.PROTOCOL_ERROR
    assert c.io.closed
    assert c.ch.state == State.CLOSED


async def test_second_connect_v311_closes_silently(clock):
    c = await connected(make_node(), clock, "dev1", MQTT311)
    c.send(Connect("dev1", proto_level=MQTT311))
    await settle()
    assert c.received() == []
    assert c.io.closed


@pytest.mark.parametrize(
    "first", [PINGREQ_BYTES, encode(Publish("t", b"x"), MQTT311), encode(Subscribe(1, [("t", SubOpts())]), 4)]
)
async def test_packet_before_connect_closes(clock, first):
    node = make_node()
    c = Client(node, clock, MQTT311)
    c.send_raw(first)
    await settle()
    assert c.io.closed
    assert bytes(c.io.data) == b""
    assert node.cm.channels == {}


async def test_malformed_bytes_v5_disconnect_0x81(clock):
    c = await connected(make_node(), clock, "dev1", MQTT5)
    c.send_raw(b"\x00\x00")  # packet type 0 is reserved
    [d] = c.received()
    assert type(d) is Disconnect and d.reason_code == RC.MALFORMED_PACKET
    assert c.io.closed
    # nothing more is processed after the close
    c.send_raw(PINGREQ_BYTES)
    assert c.received() == []


async def test_malformed_bytes_v311_close_without_reply(clock):
    c = await connected(make_node(), clock, "dev1", MQTT311)
    c.send_raw(b"\x62\x01\x00")  # PUBREL with a remaining length too short for a packet id
    assert c.received() == []
    assert c.io.closed


async def test_packets_before_malformed_one_are_still_handled(clock):
    c = await connected(make_node(), clock, "dev1", MQTT5)
    c.send_raw(PINGREQ_BYTES + b"\x00\x00")
    got = c.received()
    assert got[0] == Pingresp()
    assert type(got[1]) is Disconnect and got[1].reason_code == RC.MALFORMED_PACKET


async def test_oversized_packet_v5_disconnect_0x95(clock):
    c = await connected(make_node(max_packet_size=128), clock, "dev1", MQTT5)
    c.send(Publish("t", b"x" * 200))
    [d] = c.received()
    assert type(d) is Disconnect and d.reason_code == RC.PACKET_TOO_LARGE
    assert c.io.closed


# -----------------------------------------------------------------------------------------------
# timers: connect timeout and keep alive
# -----------------------------------------------------------------------------------------------


async def test_no_connect_within_idle_timeout_closes(clock):
    c = Client(make_node(idle_timeout="15s"), clock)
    clock.advance(14.9)
    c.io.fire_due()
    assert not c.io.closed
    clock.advance(0.1)
    c.io.fire_due()
    assert c.io.closed
    assert c.ch.close_reason == "connect_timeout"


async def test_idle_timer_does_not_close_a_connected_channel(clock):
    c = await connected(make_node(idle_timeout="15s"), clock, "dev1")
    clock.advance(100)
    c.io.fire_due()
    assert not c.io.closed


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
async def test_keepalive_timeout(clock, version):
    c = Client(make_node(), clock, version)  # keepalive_backoff 0.75: 10 s keep alive -> 15 s
    await c.connect("dev1", keepalive=10)
    t0 = clock.now
    clock.advance(10)
    c.send_raw(PINGREQ_BYTES)  # activity at t0+10 moves the deadline to t0+25
    c.received()
    clock.advance(5)  # t0+15: the first timer fires and re-arms for the time left
    assert c.io.fire_due() == 1
    assert not c.io.closed
    [ka] = c.io.pending("_check_keepalive")
    assert ka.when == pytest.approx(t0 + 25)
    clock.now = t0 + 24.99
    c.io.fire_due()
    assert not c.io.closed
    # even a timer firing early must not close the connection before the deadline
    ka.fired = True
    ka.callback()
    assert not c.io.closed
    clock.now = t0 + 25.0
    c.io.fire_due()
    assert c.io.closed
    assert c.ch.close_reason == "keepalive_timeout"
    got = c.received()
    if version == MQTT5:
        assert len(got) == 1 and type(got[0]) is Disconnect and got[0].reason_code == RC.KEEP_ALIVE_TIMEOUT
    else:
        assert got == []
    assert node_metric_keepalive_timeouts(c) == 1


def node_metric_keepalive_timeouts(c: Client) -> int:
    return c.ch.telemetry.counters.keepalive_timeouts


async def test_keepalive_zero_arms_no_timer(clock):
    c = await connected(make_node(), clock, "dev1", MQTT5, keepalive=0)
    assert c.io.pending("_check_keepalive") == []
    clock.advance(10**6)
    c.io.fire_due()
    assert not c.io.closed


async def test_keepalive_backoff_setting(clock):
    c = await connected(make_node(keepalive_backoff=1.0), clock, "dev1", MQTT311, keepalive=10)
    t0 = clock.now
    clock.now = t0 + 19.9
    c.io.fire_due()
    assert not c.io.closed
    clock.now = t0 + 20.0
    c.io.fire_due()
    assert c.io.closed


# -----------------------------------------------------------------------------------------------
# publish / subscribe
# -----------------------------------------------------------------------------------------------


async def test_publish_subscribe_qos1_between_two_channels(clock):
    sub, pub = await sub_and_pub(clock, MQTT5)
    assert sub.subscribe("t/#", qos=1).reason_codes == [1]
    pub.send(Publish("t/a", b"hello", qos=1, packet_id=7))
    await settle()
    assert pub.received() == [Puback(7)]
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.qos, p.dup, p.retain) == ("t/a", b"hello", 1, False, False)
    assert p.packet_id != 0
    assert len(sub.ch.session.inflight) == 1
    sub.send(Puback(p.packet_id))
    assert len(sub.ch.session.inflight) == 0
    # a duplicate PUBACK is harmless
    sub.send(Puback(p.packet_id))
    assert not sub.io.closed


async def test_subscription_qos_caps_delivery_qos(clock):
    sub, pub = await sub_and_pub(clock)
    sub.subscribe("t", qos=0)
    pub.send(Publish("t", b"x", qos=2, packet_id=3))
    await settle()
    [p] = sub.publishes()
    assert p.qos == 0 and p.packet_id == 0
    assert pub.received() == [Pubrec(3)]


async def test_publish_v5_no_subscribers_puback_0x10(clock):
    pub = await connected(make_node(), clock, "pub", MQTT5)
    pub.send(Publish("nobody", b"x", qos=1, packet_id=1))
    await settle()
    [ack] = pub.received()
    assert type(ack) is Puback and ack.reason_code == RC.NO_MATCHING_SUBSCRIBERS


async def test_qos2_exactly_once_both_directions(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, MQTT5)
    sub.subscribe("q2", qos=2)
    pub.send(Publish("q2", b"once", qos=2, packet_id=5))
    await settle()
    assert [type(x) for x in pub.received()] == [Pubrec]
    # the publisher resends before PUBREL: PUBREC again, but no second delivery
    pub.send(Publish("q2", b"once", qos=2, packet_id=5, dup=True))
    await settle()
    [rec] = pub.received()
    assert type(rec) is Pubrec and rec.packet_id == 5 and rec.reason_code == 0
    pub.send(Pubrel(5))
    assert [(type(x), x.packet_id, x.reason_code) for x in pub.received()] == [(Pubcomp, 5, 0)]
    pub.send(Pubrel(5))  # unknown now
    [comp] = pub.received()
    assert type(comp) is Pubcomp and comp.reason_code == RC.PACKET_IDENTIFIER_NOT_FOUND

    [p] = sub.publishes()
    assert (p.payload, p.qos) == (b"once", 2)
    sub.send(Pubrec(p.packet_id))
    [rel] = sub.received()
    assert type(rel) is Pubrel and rel.packet_id == p.packet_id
    assert len(sub.ch.session.inflight) == 1  # awaiting PUBCOMP
    sub.send(Pubcomp(p.packet_id))
    assert len(sub.ch.session.inflight) == 0


async def test_max_awaiting_rel_refuses_with_pubrec_0x93(clock):
    pub = await connected(make_node(max_awaiting_rel=1), clock, "pub", MQTT5)
    pub.send(Publish("x", b"1", qos=2, packet_id=1))
    pub.send(Publish("x", b"2", qos=2, packet_id=2))
    await settle()
    acks = pub.received()
    assert [(type(a), a.packet_id, a.reason_code) for a in acks] == [
        (Pubrec, 1, RC.NO_MATCHING_SUBSCRIBERS),  # accepted (nobody subscribed)
        (Pubrec, 2, RC.RECEIVE_MAXIMUM_EXCEEDED),
    ]
    pub.send(Pubrel(1))
    pub.received()
    pub.send(Publish("x", b"3", qos=2, packet_id=3))
    await settle()
    [a] = pub.received()
    assert a.reason_code == RC.NO_MATCHING_SUBSCRIBERS  # accepted again once 1 was released


async def test_awaiting_rel_timer_expires_entries(clock):
    pub = await connected(make_node(await_rel_timeout="10s"), clock, "pub", MQTT5)
    pub.send(Publish("x", b"1", qos=2, packet_id=1))
    await settle()
    pub.received()
    assert 1 in pub.ch.session.awaiting_rel
    clock.advance(9)
    pub.io.fire_due()
    assert 1 in pub.ch.session.awaiting_rel
    clock.advance(1)
    pub.io.fire_due()
    assert pub.ch.session.awaiting_rel == {}
    pub.send(Pubrel(1))
    [comp] = pub.received()
    assert comp.reason_code == RC.PACKET_IDENTIFIER_NOT_FOUND


async def test_qos0_is_sent_at_once_even_with_a_full_window(clock):
    sub, pub = await sub_and_pub(clock, max_inflight=1)
    sub.subscribe("t", qos=1)
    pub.send(Publish("t", b"q1", qos=1, packet_id=1))
    pub.send(Publish("t", b"q1-queued", qos=1, packet_id=2))
    pub.send(Publish("t", b"q0", qos=0))
    await settle()
    assert [p.payload for p in sub.publishes()] == [b"q1", b"q0"]


async def test_unsubscribe_stops_delivery(clock):
    sub, pub = await sub_and_pub(clock, MQTT5)
    sub.subscribe("t", qos=0)
    sub.send(Unsubscribe(2, ["t", "never"]))
    [ua] = sub.received()
    assert type(ua) is Unsuback and ua.reason_codes == [RC.SUCCESS, RC.NO_SUBSCRIPTION_EXISTED]
    pub.send(Publish("t", b"x"))
    assert sub.received() == []


async def test_invalid_filter_suback_failure(clock):
    c = await connected(make_node(), clock, "c", MQTT311)
    c.send(Subscribe(1, [("a/#/b", SubOpts(qos=1)), ("ok", SubOpts(qos=1))]))
    [ack] = c.received()
    assert ack.reason_codes == [0x80, 1]


async def test_retained_message_delivered_on_subscribe(clock):
    node = make_node()
    pub = await connected(node, clock, "pub", MQTT311)
    pub.send(Publish("r/1", b"kept", qos=0, retain=True))
    sub = await connected(node, clock, "sub", MQTT311)
    sub.send(Subscribe(1, [("r/+", SubOpts(qos=1))]))
    got = sub.received()
    assert type(got[0]) is Suback
    assert [(p.topic, p.payload, p.retain) for p in got[1:]] == [("r/1", b"kept", True)]


# -----------------------------------------------------------------------------------------------
# takeover and resume
# -----------------------------------------------------------------------------------------------


async def test_takeover_v5_disconnect_0x8e_and_session_present(clock):
    node = make_node()
    first = Client(node, clock, MQTT5)
    ack1 = await first.connect("dev", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 300})
    assert ack1.session_present is False
    first.subscribe("t", qos=1)

    second = Client(node, clock, MQTT5)
    ack2 = await second.connect("dev", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 300})
    [d] = first.received()
    assert type(d) is Disconnect and d.reason_code == RC.SESSION_TAKEN_OVER
    assert first.io.closed
    assert first.ch.state == State.CLOSED
    assert ack2.session_present is True
    assert node.cm.channels["dev"] is second.ch
    # the session (and its subscription) continues on the new connection
    first.ch.connection_lost()  # the old socket goes away afterwards
    pub = await connected(node, clock, "pub", MQTT311)
    pub.send(Publish("t", b"after", qos=1, packet_id=1))
    await settle()
    assert [p.payload for p in second.publishes()] == [b"after"]
    assert first.received() == []
    assert node.cm.channels["dev"] is second.ch


async def test_takeover_with_clean_start_discards_session(clock):
    node = make_node()
    first = await connected(node, clock, "dev", MQTT311, clean_start=False)
    first.subscribe("t", qos=1)
    second = Client(node, clock, MQTT311)
    ack2 = await second.connect("dev", clean_start=True)
    assert first.io.closed
    assert first.received() == []  # v3: closed without a DISCONNECT
    assert ack2.session_present is False
    assert node.router.match("t", lambda _c: True) == []


async def test_takeover_resends_unacked_in_order_with_dup(clock):
    node = make_node(max_inflight=2)
    first = await connected(node, clock, "dev", MQTT311, clean_start=False)
    first.subscribe("t", qos=1)
    pub = await connected(node, clock, "pub", MQTT311)
    pub.publish_each("t", [b"1", b"2", b"3", b"4"])
    await settle()
    sent = first.publishes()
    assert [p.payload for p in sent] == [b"1", b"2"]
    first.send(Puback(sent[0].packet_id))
    [p3] = first.publishes()
    assert p3.payload == b"3"

    second = Client(node, clock, MQTT311)
    ack = await second.connect("dev", clean_start=False)
    assert ack.session_present is True
    got = second.publishes()
    # unacked first, original order and packet ids, DUP=1; nothing new before them
    assert [(p.payload, p.packet_id, p.dup) for p in got] == [
        (b"2", sent[1].packet_id, True),
        (b"3", p3.packet_id, True),
    ]
    second.send(Puback(sent[1].packet_id))
    [p4] = second.publishes()
    assert (p4.payload, p4.dup) == (b"4", False)


async def test_resume_after_disconnect_gets_queued_messages(clock):
    node = make_node()
    sub = await connected(
        node, clock, "dev", MQTT5, clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 300}
    )
    sub.subscribe("t", qos=1)
    sub.send(Disconnect())
    sub.ch.connection_lost()
    await settle()
    assert "dev" in node.cm.offline
    pub = await connected(node, clock, "pub", MQTT311)
    pub.publish_each("t", [b"m0", b"m1", b"m2"])
    await settle()
    # publisher confirms: acked after the message is stored for the offline session
    assert [a.packet_id for a in pub.received()] == [1, 2, 3]

    again = Client(node, clock, MQTT5)
    ack = await again.connect("dev", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 300})
    assert ack.session_present is True
    got = again.publishes()
    assert [(p.payload, p.dup) for p in got] == [(b"m0", False), (b"m1", False), (b"m2", False)]


async def test_clean_session_v311_is_discarded_on_disconnect(clock):
    node = make_node()
    sub = await connected(node, clock, "dev", MQTT311, clean_start=True)
    sub.subscribe("t", qos=1)
    sub.ch.connection_lost()
    await settle()
    assert "dev" not in node.cm.offline
    assert node.router.match("t", lambda _c: True) == []
    again = Client(node, clock, MQTT311)
    assert (await again.connect("dev", clean_start=False)).session_present is False


# -----------------------------------------------------------------------------------------------
# inflight window and retransmission through channels
# -----------------------------------------------------------------------------------------------


async def test_inflight_window_and_seed_scenario_v311(clock):
    sub, pub = await sub_and_pub(clock, max_inflight=2, retry_interval="30s")
    sub.subscribe("t", qos=1)
    pub.publish_each("t", [b"1", b"2", b"3", b"4"])
    await settle()
    assert len(pub.received()) == 4  # the publisher is acked at once; the queue is the subscriber's
    wire = sub.publishes()
    assert [p.payload for p in wire] == [b"1", b"2"]
    pid = {p.payload: p.packet_id for p in wire}

    clock.advance(1)
    sub.send(Puback(pid[b"1"]))
    [p3] = sub.publishes()
    assert (p3.payload, p3.dup) == (b"3", False)
    pid[b"3"] = p3.packet_id

    clock.advance(29.5)  # 2 was sent 30.5 s ago, 3 only 29.5 s ago
    sub.io.fire_due()
    resent = sub.publishes()
    assert [(p.payload, p.dup, p.packet_id) for p in resent] == [(b"2", True, pid[b"2"])]
    clock.advance(1)
    sub.io.fire_due()
    resent = sub.publishes()
    assert [(p.payload, p.dup, p.packet_id) for p in resent] == [(b"3", True, pid[b"3"])]

    sub.send(Puback(pid[b"2"]))
    [p4] = sub.publishes()
    assert (p4.payload, p4.dup) == (b"4", False)
    sub.send(Puback(pid[b"3"]))
    sub.send(Puback(p4.packet_id))
    assert sub.received() == []
    assert len(sub.ch.session.inflight) == 0
    # nothing left to resend: the retry timer is not re-armed
    clock.advance(100)
    sub.io.fire_due()
    assert sub.received() == []


async def test_retry_resends_both_entries_together_in_order(clock):
    sub, pub = await sub_and_pub(clock, max_inflight=2, retry_interval="30s")
    sub.subscribe("t", qos=1)
    pub.publish_each("t", [b"1", b"2", b"3", b"4"])
    await settle()
    first = sub.publishes()
    clock.advance(31)
    sub.io.fire_due()
    again = sub.publishes()
    assert [(p.payload, p.packet_id, p.dup) for p in again] == [(p.payload, p.packet_id, True) for p in first]
    assert sub.ch.telemetry.counters.retransmitted == 2


async def test_v311_qos2_retry_resends_pubrel(clock):
    sub, pub = await sub_and_pub(clock, retry_interval="30s")
    sub.subscribe("t", qos=2)
    pub.send(Publish("t", b"a", qos=2, packet_id=1))
    pub.send(Publish("t", b"b", qos=2, packet_id=2))
    await settle()
    a, b = sub.publishes()
    sub.send(Pubrec(a.packet_id))
    [rel] = sub.received()
    assert type(rel) is Pubrel
    clock.advance(31)
    sub.io.fire_due()
    again = sub.received()
    assert [(type(x), x.packet_id) for x in again] == [(Pubrel, a.packet_id), (Publish, b.packet_id)]
    assert again[1].dup is True


async def test_v5_channel_arms_no_retry_timer(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, retry_interval="30s")
    sub.subscribe("t", qos=1)
    pub.send(Publish("t", b"x", qos=1, packet_id=1))
    await settle()
    [p] = sub.publishes()
    assert p.qos == 1
    assert sub.io.pending("_on_retry") == []
    clock.advance(3600)
    sub.io.fire_due()
    assert sub.received() == []  # MQTT 5 forbids resends except on reconnect
    assert not sub.io.closed


async def test_v3_channel_arms_retry_timer(clock):
    sub, pub = await sub_and_pub(clock, retry_interval="30s")
    sub.subscribe("t", qos=1)
    assert sub.io.pending("_on_retry") == []  # nothing inflight, no timer
    pub.send(Publish("t", b"x", qos=1, packet_id=1))
    await settle()
    [p] = sub.publishes()
    [t] = sub.io.pending("_on_retry")
    assert t.when == pytest.approx(clock.now + 30)
    clock.advance(30)
    sub.io.fire_due()
    [again] = sub.publishes()
    assert (again.packet_id, again.dup, again.payload) == (p.packet_id, True, b"x")


async def test_v5_retry_when_zone_opts_in(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, retry_interval="30s", retry_v5=True)
    sub.subscribe("t", qos=1)
    pub.send(Publish("t", b"x", qos=1, packet_id=1))
    await settle()
    [p] = sub.publishes()
    clock.advance(30)
    sub.io.fire_due()
    [again] = sub.publishes()
    assert (again.packet_id, again.dup) == (p.packet_id, True)


async def test_receive_maximum_limits_the_window(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, sub_props={Prop.RECEIVE_MAXIMUM: 2}, max_inflight=10)
    sub.subscribe("t", qos=1)
    pub.publish_each("t", [b"0", b"1", b"2", b"3", b"4"])
    await settle()
    got = sub.publishes()
    assert [p.payload for p in got] == [b"0", b"1"]
    sub.send(Puback(got[1].packet_id))
    assert [p.payload for p in sub.publishes()] == [b"2"]


async def test_zone_change_applies_to_connected_channel(clock):
    sub, pub = await sub_and_pub(clock, max_inflight=1)
    sub.subscribe("t", qos=1)
    pub.publish_each("t", [b"0", b"1", b"2", b"3"])
    await settle()
    assert [p.payload for p in sub.publishes()] == [b"0"]
    zone = sub.node.zones["default"]
    zone.update(zone.settings.model_copy(update={"max_inflight": 3}))
    sub.ch.apply_zone()
    assert [p.payload for p in sub.publishes()] == [b"1", b"2"]


async def test_queue_full_drops_oldest_through_channel(clock):
    sub, pub = await sub_and_pub(clock, max_inflight=1, max_mqueue_len=2)
    sub.subscribe("t", qos=1)
    pub.publish_each("t", [b"0", b"1", b"2", b"3", b"4"])
    await settle()
    [p0] = sub.publishes()
    assert sub.ch.telemetry.counters.dropped["queue_full"] == 2  # 1 and 2 dropped, 3 and 4 kept
    sub.send(Puback(p0.packet_id))
    [p] = sub.publishes()
    assert p.payload == b"3"
    sub.send(Puback(p.packet_id))
    [p] = sub.publishes()
    assert p.payload == b"4"


async def test_too_large_delivery_does_not_stall_the_queue(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, sub_props={Prop.MAXIMUM_PACKET_SIZE: 200}, max_inflight=1)
    sub.subscribe("t", qos=1)
    pub.send(Publish("t", b"small-1", qos=1, packet_id=1))
    pub.send(Publish("t", b"B" * 1000, qos=1, packet_id=2))  # too large for this subscriber
    pub.send(Publish("t", b"small-2", qos=1, packet_id=3))
    await settle()
    [p1] = sub.publishes()
    assert p1.payload == b"small-1"
    sub.send(Puback(p1.packet_id))
    # the big one is dropped (never sent to this client); small-2 must still be delivered
    assert [p.payload for p in sub.publishes()] == [b"small-2"]


# -----------------------------------------------------------------------------------------------
# more delivery rules
# -----------------------------------------------------------------------------------------------


async def test_resume_resends_pubrel_and_publish_in_original_order(clock):
    node = make_node()
    first = await connected(node, clock, "dev", MQTT311, clean_start=False)
    first.subscribe("t", qos=2)
    pub = await connected(node, clock, "pub", MQTT311)
    for i in range(3):
        pub.send(Publish("t", str(i).encode(), qos=2, packet_id=i + 1))
        pub.send(Pubrel(i + 1))
    await settle()
    a, b, c = first.publishes()
    first.send(Pubrec(a.packet_id))
    first.send(Pubrec(c.packet_id))
    assert [type(x) for x in first.received()] == [Pubrel, Pubrel]
    first.ch.connection_lost()
    await settle()

    again = Client(node, clock, MQTT311)
    ack = await again.connect("dev", clean_start=False)
    assert ack.session_present
    got = again.received()
    assert [(type(x).__name__, x.packet_id) for x in got] == [
        ("Pubrel", a.packet_id),
        ("Publish", b.packet_id),
        ("Pubrel", c.packet_id),
    ]
    assert got[1].dup is True and got[1].payload == b"1"


async def test_overlapping_subscriptions_deliver_once_with_highest_qos(clock):
    sub, pub = await sub_and_pub(clock, MQTT5)
    sub.subscribe("t/#", qos=0, packet_id=1)
    sub.subscribe("t/+", qos=1, packet_id=2)
    pub.send(Publish("t/x", b"x", qos=1, packet_id=1))
    await settle()
    [p] = sub.publishes()
    assert p.qos == 1


async def test_no_local_subscription(clock):
    node = make_node()
    c = await connected(node, clock, "me", MQTT5)
    c.send(Subscribe(1, [("t", SubOpts(qos=0, no_local=True))]))
    c.received()
    c.send(Publish("t", b"mine"))
    assert c.received() == []


async def test_pubrec_for_unknown_packet_id_gets_pubrel_0x92(clock):
    c = await connected(make_node(), clock, "c", MQTT5)
    c.send(Pubrec(42))
    [rel] = c.received()
    assert type(rel) is Pubrel and rel.packet_id == 42 and rel.reason_code == RC.PACKET_IDENTIFIER_NOT_FOUND


async def test_incoming_receive_maximum_exceeded_v5(clock):
    c = Client(make_node(receive_maximum=1), clock, MQTT5)
    ack = await c.connect("c")
    assert ack.properties[Prop.RECEIVE_MAXIMUM] == 1
    c.send(Publish("x", b"1", qos=2, packet_id=1))
    await settle()
    assert [type(x) for x in c.received()] == [Pubrec]
    c.send(Publish("x", b"1", qos=2, packet_id=1, dup=True))  # a resend of the same id is fine
    await settle()
    assert [type(x) for x in c.received()] == [Pubrec]
    c.send(Publish("x", b"2", qos=2, packet_id=2))
    await settle()
    [d] = c.received()
    assert type(d) is Disconnect and d.reason_code == RC.RECEIVE_MAXIMUM_EXCEEDED
    assert c.io.closed


async def test_will_published_on_abrupt_close_not_on_disconnect(clock):
    node = make_node()
    watcher = await connected(node, clock, "w", MQTT311)
    watcher.subscribe("will/#", qos=0)
    abrupt = Client(node, clock, MQTT311)
    await abrupt.connect("a", will=Will("will/a", b"gone"))
    abrupt.ch.connection_lost()
    await settle()
    assert [(p.topic, p.payload) for p in watcher.publishes()] == [("will/a", b"gone")]

    polite = Client(node, clock, MQTT311)
    await polite.connect("b", will=Will("will/b", b"gone"))
    polite.send(Disconnect())
    assert polite.io.closed
    polite.ch.connection_lost()
    await settle()
    assert watcher.received() == []


async def test_disconnect_v5_cannot_set_expiry_after_zero(clock):
    c = Client(make_node(), clock, MQTT5)
    await c.connect("c")  # session expiry 0
    c.send(Disconnect(0, {Prop.SESSION_EXPIRY_INTERVAL: 60}))
    [d] = c.received()
    assert type(d) is Disconnect and d.reason_code == RC.PROTOCOL_ERROR


async def test_topic_alias_to_v5_client(clock):
    sub, pub = await sub_and_pub(clock, MQTT5, sub_props={Prop.TOPIC_ALIAS_MAXIMUM: 1})
    sub.subscribe("long/topic/name", qos=0)
    pub.send(Publish("long/topic/name", b"1"))
    pub.send(Publish("long/topic/name", b"2"))
    p1, p2 = sub.publishes()
    assert p1.topic == "long/topic/name" and p1.properties[Prop.TOPIC_ALIAS] == 1
    assert p2.topic == "" and p2.properties[Prop.TOPIC_ALIAS] == 1
    assert p2.payload == b"2"


async def test_takeover_old_channel_writes_nothing_more(clock):
    node = make_node(retry_interval="30s")
    first = await connected(node, clock, "dev", MQTT311, clean_start=False)
    first.subscribe("t", qos=1)
    pub = await connected(node, clock, "pub", MQTT311)
    pub.send(Publish("t", b"x", qos=1, packet_id=1))
    await settle()
    [p] = first.publishes()
    second = await connected(node, clock, "dev", MQTT311, clean_start=False)
    [again] = second.publishes()
    assert (again.packet_id, again.dup) == (p.packet_id, True)
    # the old connection's timers are cancelled: its retry never fires
    assert first.io.pending() == []
    clock.advance(31)
    first.io.fire_due()
    second.io.fire_due()
    assert first.received() == []
    assert first.io.writes_after_close == 0
    [retry] = second.publishes()
    assert retry.packet_id == p.packet_id


@pytest.mark.parametrize("store_qos0", [True, False])
async def test_offline_session_queues_qos0_only_if_zone_says_so(clock, store_qos0):
    pub = await offline_with_publisher(clock, mqueue_store_qos0=store_qos0)
    pub.send(Publish("t", b"q0", qos=0))
    pub.send(Publish("t", b"q1", qos=1, packet_id=1))
    await settle()
    again = await connected(pub.node, clock, "dev", MQTT311, clean_start=False)
    got = [(p.payload, p.qos) for p in again.publishes()]
    assert got == ([(b"q0", 0), (b"q1", 1)] if store_qos0 else [(b"q1", 1)])


async def test_offline_queue_limit_drops_oldest(clock):
    pub = await offline_with_publisher(clock, max_mqueue_len=2)
    pub.publish_each("t", [b"0", b"1", b"2", b"3", b"4"])
    await settle()
    again = await connected(pub.node, clock, "dev", MQTT311, clean_start=False)
    assert [p.payload for p in again.publishes()] == [b"3", b"4"]


async def test_a_stored_delivery_under_a_receipt_the_session_accepted_is_a_repeat(clock):
    """Message.receipt: a publisher's resend may reach a session straight from the node (routed again
    under its receipt) before the copy another node routed through the store is pulled; the pulled copy
    is then a repeat, and a QoS 2 message must not be sent twice (chaos --store cluster, seed 42)."""
    node = make_node()
    sub = await connected(
        node, clock, "sub", MQTT5, clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 300}
    )
    sub.subscribe("t", qos=2)

    def copy(n: int) -> Delivery:
        msg = Message.from_publish("t", f"m{n}".encode(), 2, False, {}, "pub", sub.io.wall())
        msg.receipt = ("inc1", n)
        return Delivery(msg, 2, False, None)

    session = node.cm.session_of("sub")
    assert session is not None and session.accept(("inc1", 1))  # the resend, routed here first
    node.cm.deliver_stored("sub", session.epoch, [copy(1), copy(2)])  # the store's copy, and a newer one
    await settle()
    assert [p.payload for p in sub.publishes()] == [b"m2"]
    assert session.seen == {"inc1": 2}
