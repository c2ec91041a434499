"""The channel on its own: built from tests/fakes.py's IO, clock and host, with no Node and no event loop.

What a Channel decides is a function of the bytes it is fed, the time its clock gives and what its host
answers; these tests hold all three in hand (the tests of test_channel.py run it on a real Node).
"""

from __future__ import annotations

from typing import Any

import pytest
from fleetmq.broker.channel import Channel, State
from fleetmq.broker.codec import (
    MQTT5,
    MQTT311,
    RC,
    Connack,
    Connect,
    Disconnect,
    Prop,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOpts,
    Subscribe,
)
from fleetmq.broker.message import Message
from fleetmq.broker.zones import ZoneSettings

from tests.fakes import WALL_OFFSET, Clock, FakeHost, FakeIO, Wire


class Peer(Wire):
    """The client's side of one channel: packets in, the packets it wrote since the last look out."""

    def __init__(self, host: FakeHost, version: int = MQTT5, **settings: Any) -> None:
        self.clock = Clock()
        super().__init__(FakeIO(self.clock), version)
        self.host = host
        self.ch: Channel = host.channel(self.io, ZoneSettings(**settings))

    def connect(self, client_id: str = "c1", **kw: Any) -> Connack:
        kw.setdefault("keepalive", 0)
        self.send(Connect(client_id, proto_level=self.version, **kw))
        [ack] = self.received()
        assert type(ack) is Connack
        return ack


def test_a_connect_is_answered_once_the_host_opened_the_session():
    host = FakeHost(hold_open=True)
    peer = Peer(host)
    peer.send(Connect("c1", proto_level=MQTT5, keepalive=0))
    assert peer.received() == [] and peer.ch.state == State.CONNECTING
    [(ch, request)] = host.opening
    assert ch is peer.ch and request.client_id == "c1"
    host.open(ch, request)
    [ack] = peer.received()
    assert type(ack) is Connack and ack.reason_code == 0
    assert peer.ch.state == State.CONNECTED


def test_a_puback_waits_for_the_commit_that_stores_the_message():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/1", b"m", 1, packet_id=7))
    [msg] = host.published
    assert (msg.topic, msg.payload, msg.qos, msg.sender) == ("t/1", b"m", 1, "c1")
    assert peer.received() == []  # not stored yet: not acknowledged
    assert host.commit(ok=True) == 1
    assert peer.received() == [Puback(7, 0)]


def test_a_refused_publishs_ack_waits_behind_an_ack_waiting_for_its_commit():
    """A PUBLISH the ACL refuses was acknowledged (0x87) at once, ahead of the PUBACK of an earlier one
    still waiting for its commit: acks must go out in the order their PUBLISHes came [MQTT-4.6.0-2]."""
    host = FakeHost()
    peer = Peer(host, acl=[{"permission": "deny", "action": "publish", "filter": "no"}])
    peer.connect()
    peer.send(Publish("yes", b"1", 1, packet_id=1), Publish("no", b"2", 1, packet_id=2))
    assert peer.received() == []
    host.commit(ok=True)
    assert peer.received() == [Puback(1, 0), Puback(2, RC.NOT_AUTHORIZED)]


def test_acks_go_out_in_the_order_their_publishes_came():
    """A second PUBLISH that wrote nothing to the store still waits behind the first one's commit."""
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/1", b"a", 1, packet_id=1))
    host.writes = False
    peer.send(Publish("t/1", b"b", 1, packet_id=2))
    assert peer.received() == []
    host.commit(ok=True)
    assert peer.received() == [Puback(1, 0), Puback(2, 0)]


def test_replies_waiting_for_the_store_are_data_not_a_closure_each():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    for pid in (1, 2, 3):
        peer.send(Publish("t/1", b"x", 1, packet_id=pid))
    assert len(host.waiting) == 3
    assert len({id(callback) for callback in host.waiting}) == 1  # the channel's one bound method


def test_a_channel_makes_its_queue_of_waiting_replies_only_when_a_reply_waits():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()  # (an idle subscriber never waits for the store: no 760-byte deque for it)
    assert peer.ch._replies is None
    peer.send(Publish("t/1", b"x", 1, packet_id=1))  # (routing wrote to the store: the ack waits)
    assert peer.ch._replies is not None and len(peer.ch._replies) == 1
    host.commit(ok=True)
    assert peer.received() == [Puback(1, 0)] and not peer.ch._replies


def test_a_failed_commit_disconnects_unacknowledged_so_the_client_sends_again():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/1", b"m", 1, packet_id=7), Publish("t/1", b"n", 1, packet_id=8))
    host.commit(ok=False)
    assert peer.received() == [Disconnect(RC.SERVER_UNAVAILABLE, {})]
    assert peer.io.closed and peer.ch.close_reason == "store_error"


def test_a_v311_client_whose_commit_failed_is_closed_without_a_reason():
    host = FakeHost()
    peer = Peer(host, MQTT311)
    peer.connect()
    peer.send(Publish("t/1", b"m", 1, packet_id=7))
    host.commit(ok=False)
    assert peer.received() == [] and peer.io.closed


def test_what_was_waiting_when_the_connection_went_away_is_not_written():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/1", b"m", 1, packet_id=7))
    peer.ch.connection_lost()
    assert host.closed_channels == [peer.ch]
    host.commit(ok=True)
    assert peer.received() == [] and peer.io.writes_after_close == 0


def test_qos2_exactly_once_from_the_publisher():
    """PUBREC once stored; a resend before PUBREL is answered and not routed again; PUBREL, PUBCOMP."""
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/2", b"once", 2, packet_id=3))
    host.commit(ok=True)
    assert peer.received() == [Pubrec(3, 0)]
    peer.send(Publish("t/2", b"once", 2, packet_id=3, dup=True))
    assert peer.received() == [Pubrec(3, 0)]
    assert [m.payload for m in host.published] == [b"once"]
    peer.send(Pubrel(3))
    host.commit(ok=True)
    assert peer.received() == [Pubcomp(3, 0)]


def test_no_subscriber_is_told_to_a_v5_publisher():
    host = FakeHost()
    host.matched = False
    peer = Peer(host)
    peer.connect()
    peer.send(Publish("t/1", b"m", 1, packet_id=4))
    host.commit()
    assert peer.received() == [Puback(4, RC.NO_MATCHING_SUBSCRIBERS)]


def test_a_message_is_stamped_with_the_clocks_wall_time():
    host = FakeHost()
    peer = Peer(host)
    peer.connect()
    peer.clock.advance(12.5)
    peer.send(Publish("t/1", b"m", 0, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 30}))
    [msg] = host.published
    assert msg.ts == WALL_OFFSET + peer.clock.now
    assert msg.expires_at == msg.ts + 30


def test_keep_alive_runs_on_the_clock_it_is_given():
    host = FakeHost()
    peer = Peer(host)
    peer.connect(keepalive=10)
    peer.clock.advance(14)  # 1.5 x keep alive is the limit
    peer.send(Publish("t/1", b"alive", 0))
    peer.io.fire_due()
    assert not peer.io.closed
    peer.clock.advance(15.1)
    peer.io.fire_due()
    assert peer.received() == [Disconnect(RC.KEEP_ALIVE_TIMEOUT, {})]
    assert peer.io.closed


def test_an_unknown_topic_alias_is_a_protocol_error():
    host = FakeHost()
    peer = Peer(host, max_topic_alias=4)
    peer.connect()
    peer.send(Publish("", b"m", 0, properties={Prop.TOPIC_ALIAS: 1}))
    [disconnect] = peer.received()
    assert type(disconnect) is Disconnect and disconnect.reason_code == RC.PROTOCOL_ERROR
    assert host.published == []


def test_a_topic_alias_names_the_topic_it_was_set_with():
    host = FakeHost()
    peer = Peer(host, max_topic_alias=4)
    peer.connect()
    peer.send(
        Publish("t/long/name", b"1", 0, properties={Prop.TOPIC_ALIAS: 1}),
        Publish("", b"2", 0, properties={Prop.TOPIC_ALIAS: 1}),
    )
    assert [(m.topic, m.payload) for m in host.published] == [("t/long/name", b"1"), ("t/long/name", b"2")]


def test_suback_once_stored_then_the_retained_messages():
    host = FakeHost()
    host.retained_msgs = [Message("r/1", b"kept", 1, True, ts=WALL_OFFSET)]
    peer = Peer(host)
    peer.connect()
    peer.send(Subscribe(1, [("r/#", SubOpts(qos=1))]))
    assert peer.received() == [] and "r/#" in host.subscribed
    host.commit(ok=True)
    suback, publish = peer.received()
    assert suback == Suback(1, [1])
    assert type(publish) is Publish and (publish.topic, publish.payload, publish.retain) == (
        "r/1",
        b"kept",
        True,
    )


@pytest.mark.parametrize("durable", [True, False])
def test_a_host_that_keeps_nothing_across_a_restart_is_not_waited_for(durable):
    host = FakeHost(durable=durable)
    peer = Peer(host)
    peer.connect()
    peer.send(Subscribe(1, [("s/#", SubOpts(qos=0))]))
    assert bool(peer.received()) is not durable
