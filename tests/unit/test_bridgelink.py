"""The bridge link (fleetmq.broker.bridge.link) between a real node's channel, in process, and a remote
played by the test with the codec: what goes each way, with which packet ids, and what is dropped."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetmq.broker.bridge import loop as bridgeloop
from fleetmq.broker.bridge.link import BridgeLink, Phase
from fleetmq.broker.codec import (
    MQTT5,
    Connack,
    Connect,
    Parser,
    Prop,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    encode,
)
from fleetmq.broker.config import load_config
from fleetmq.broker.negotiation import INTERNAL
from fleetmq.broker.node import Node

from tests.fakes import Client, Clock, FakeIO, connected, settle

BRIDGE = {
    "name": "cloud",
    "remote": {"host": "remote.example", "peer_id": "cloud"},
    "forwards": [
        {"filter": "up/#", "destination": "site1/{#}", "excludes": ["up/private/#"],
         "user_properties": {"site": "1"}},
        {"filter": "short/+", "destination": "{3}"},
    ],
    "subscriptions": [{"filter": "down/#", "destination": "cmd/{2-#}"}],
}  # fmt: skip


class PacketIO(FakeIO):
    """The bridge's in-process IO as the channel sees it: bytes, and PUBLISH packets handed over as they
    are (write_packet), kept in order."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.items: list[Any] = []

    def write(self, data: bytes) -> None:
        super().write(data)
        self.items.append(bytes(data))

    def write_packet(self, packet: Publish) -> None:
        self.items.append(packet)


class Rig:
    """A node with the bridge's zone, its link, and the two byte pipes pumped by hand."""

    def __init__(self, bridge: dict[str, Any] | None = None, version: int = MQTT5) -> None:
        cfg = dict(bridge or BRIDGE)
        cfg["remote"] = {**cfg["remote"], "mqtt_version": version}
        self.config = load_config(
            overrides={"node_id": "t1", "event_log": {"fleet": "edge"}, "bridges": [cfg]}
        )
        self.bridge = self.config.bridges[0]
        self.node = Node(self.config)
        self.clock = Clock()
        self.version = version
        self.remote = Parser(version=version)  # what the remote receives
        self._attach()

    def _attach(self) -> None:
        """A new link, and a new in-process connection of it to the bridge's session."""
        self.io = PacketIO(self.clock)
        self._pos = 0
        self.ch = self.node.channel(
            self.bridge.session_id, self.io, peer="bridge", listener=INTERNAL, clock=self.io
        )
        self.link = BridgeLink(self.bridge, "edge", None, self.clock.now)

    async def relink(self) -> None:
        """The link closes and its connection is lost; a new link comes for the same session (not up yet)."""
        self.link.close("test")
        self.ch.connection_lost()
        await settle()
        self._attach()

    async def local(self, client_id: str) -> Client:
        """A local v5 client, connected with a clean start."""
        return await connected(self.node, self.clock, client_id, MQTT5, clean_start=True)

    async def published(self, n: int) -> list[Any]:
        """A local client publishes `n` QoS 1 messages, b"0", b"1", ...: what reaches the remote."""
        pub = await self.local("dev")
        pub.publish_each("up/t", [str(i).encode() for i in range(n)], first_id=20)
        await self.pump()
        return self.at_remote()

    async def pump(self) -> None:
        for _ in range(20):
            out = self.link.take_local()
            if out:
                self.ch.packets_received(out)
            await settle()
            new = self.io.items[self._pos :]
            self._pos = len(self.io.items)
            if new:
                self.link.local_data(new, self.clock.now)
            if not out and not new:
                return

    def at_remote(self) -> list[Any]:
        return self.remote.feed(self.link.take_remote())

    async def from_remote(self, *packets: Any) -> None:
        self.link.remote_data(b"".join(encode(p, self.version) for p in packets), self.clock.now)
        await self.pump()

    async def up(self, present: bool = False) -> None:
        [connect] = self.at_remote()
        assert isinstance(connect, Connect) and connect.client_id == "edge-cloud" and not connect.clean_start
        await self.from_remote(Connack(present))
        [sub] = self.at_remote()
        assert isinstance(sub, Subscribe)
        await self.from_remote(Suback(sub.packet_id, [2]))
        assert self.link.phase == Phase.UP, self.link.phase


async def test_egress_maps_topics_keeps_packet_ids_and_marks_the_path():
    rig = Rig()
    await rig.up()
    pub = await rig.local("dev")
    pub.send(Publish("up/a/b", b"1", qos=2, packet_id=9))
    pub.send(Publish("up/private/x", b"2", qos=1, packet_id=10))  # excluded: acked locally, not sent
    pub.send(Publish("short/x", b"3", qos=1, packet_id=11))  # {3} of a 2-level topic: unmapped
    await rig.pump()
    [p] = rig.at_remote()
    assert (p.topic, p.qos, p.payload) == ("site1/up/a/b", 2, b"1")
    props = dict(p.properties[Prop.USER_PROPERTY])
    assert props == {bridgeloop.PATH: "edge", bridgeloop.HOP_COUNT: "1", "site": "1"}
    assert rig.link.dropped == {"excluded": 1, "unmapped": 1}
    # the remote's acks go back to the session under the same id, and the session's PUBREL comes out
    await rig.from_remote(Pubrec(p.packet_id))
    [rel] = rig.at_remote()
    assert isinstance(rel, Pubrel) and rel.packet_id == p.packet_id
    await rig.from_remote(Pubcomp(p.packet_id))
    session = rig.node.cm.session_of(rig.bridge.session_id)
    assert session is not None and not session.inflight and rig.link.forwarded == 1


async def test_ingress_maps_topics_and_acks_the_remote_after_the_fleet():
    rig = Rig()
    await rig.up()
    sub = await rig.local("app")
    sub.subscribe("cmd/#", qos=2)
    await rig.from_remote(Publish("down/x/y", b"go", qos=2, packet_id=300))
    [rec] = rig.at_remote()
    assert isinstance(rec, Pubrec) and rec.packet_id == 300
    await rig.from_remote(Pubrel(300))
    [comp] = rig.at_remote()
    assert isinstance(comp, Pubcomp) and comp.packet_id == 300
    [got] = sub.publishes()
    assert got.topic == "cmd/x/y" and got.payload == b"go"
    assert dict(got.properties[Prop.USER_PROPERTY])[bridgeloop.PATH] == "cloud"
    # a message that went through this fleet before is dropped, and the remote still gets its acks
    looped = Publish("down/z", b"again", qos=1, packet_id=301,
                     properties={Prop.USER_PROPERTY: [(bridgeloop.PATH, "edge")]})  # fmt: skip
    await rig.from_remote(looped)
    [ack] = rig.at_remote()
    assert isinstance(ack, Puback) and ack.packet_id == 301
    assert sub.received() == [] and rig.link.dropped == {"loop": 1}


async def test_a_reconnect_resends_what_the_remote_did_not_acknowledge_with_the_same_ids():
    """The session outlives the link: the next link's local CONNECT resumes it, and what the remote had
    not acknowledged goes again, first, with its packet ids and DUP."""
    rig = Rig()
    await rig.up()
    first = await rig.published(3)
    assert [p.payload for p in first] == [b"0", b"1", b"2"]
    await rig.from_remote(Puback(first[0].packet_id))
    await rig.relink()
    await rig.up(present=True)
    again = rig.at_remote()
    assert [(p.payload, p.packet_id, p.dup) for p in again] == [
        (b"1", first[1].packet_id, True),
        (b"2", first[2].packet_id, True),
    ]


async def test_a_remote_refusing_the_connection_closes_the_link_with_its_reason():
    rig = Rig()
    rig.at_remote()
    await rig.from_remote(Connack(False, 0x86))
    assert rig.link.closed is not None and "0x86" in rig.link.closed


async def test_keepalive_and_the_ack_watchdog():
    rig = Rig({**BRIDGE, "ack_timeout": "5s", "remote": {"host": "r", "keepalive": 10}})
    await rig.up()
    pub = await rig.local("dev")
    pub.send(Publish("up/t", b"x", qos=1, packet_id=1))
    await rig.pump()
    rig.at_remote()
    rig.clock.advance(4)
    assert rig.link.tick(rig.clock.now) is not None
    rig.clock.advance(1.5)
    assert rig.link.tick(rig.clock.now) is None and rig.link.close_kind == "ack_timeout"


async def test_a_dollar_client_id_is_refused_on_a_listener():
    rig = Rig()
    c = Client(rig.node, rig.clock, MQTT5)
    c.send(Connect(rig.bridge.session_id, proto_level=MQTT5, clean_start=False))
    await asyncio.sleep(0)
    [ack] = c.received()
    assert ack.reason_code == 0x85


async def test_a_remote_that_never_answers_connect_fails_the_attempt():
    """A remote that accepts the connection and never answers (a broker starting or stopping) must not
    stall the bridge until keep alive runs out: the attempt fails after CONNECT_TIMEOUT."""
    from fleetmq.broker.bridge.link import CONNECT_TIMEOUT

    rig = Rig()
    rig.at_remote()
    rig.clock.advance(CONNECT_TIMEOUT - 1)
    assert rig.link.tick(rig.clock.now) is not None
    rig.clock.advance(1)
    assert rig.link.tick(rig.clock.now) is None and rig.link.close_kind == "connect_error"


async def test_resends_wait_for_the_remotes_receive_maximum():
    """A resumed session can hold more unacknowledged messages than the remote takes at once (its Receive
    Maximum): the link sends that many, then one more per acknowledgement, in order; none is refused
    (mosquitto answers the excess with 0x97 Quota exceeded, and the message would be lost)."""
    rig = Rig()
    await rig.up()
    assert len(await rig.published(5)) == 5
    await rig.relink()
    [_connect] = rig.at_remote()
    await rig.from_remote(Connack(True, 0, {Prop.RECEIVE_MAXIMUM: 2}))
    [sub] = rig.at_remote()
    await rig.from_remote(Suback(sub.packet_id, [2]))
    sent = rig.at_remote()
    assert [(p.payload, p.dup) for p in sent] == [(b"0", True), (b"1", True)]
    for want in (b"2", b"3", b"4"):
        await rig.from_remote(Puback(sent[0].packet_id))
        sent = sent[1:] + rig.at_remote()
        assert sent[-1].payload == want and len(sent) == 2
    for p in sent:
        await rig.from_remote(Puback(p.packet_id))
    assert rig.at_remote() == [] and rig.link.forwarded == 5 and not rig.link.dropped
    session = rig.node.cm.session_of(rig.bridge.session_id)
    assert session is not None and not session.inflight
