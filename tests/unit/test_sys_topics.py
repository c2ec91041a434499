"""Publishing on $SYS (MQTT 5 section 4.7.2: the server SHOULD prevent it): refused unless a zone rule
naming $SYS allows it (a plain '#' does not: it never matches a '$' topic), counted as not_authorized."""

from __future__ import annotations

from typing import Any

import pytest
from fleetmq.broker.auth import Acl
from fleetmq.broker.codec import (
    MQTT5,
    MQTT311,
    RC,
    Connack,
    Connect,
    Puback,
    Publish,
    SubOpts,
    Subscribe,
    Will,
    encode,
)
from fleetmq.broker.node import Node
from fleetmq.broker.topic import is_sys
from fleetmq.broker.zones import AclRule

from tests.fakes import Client, Clock, FakeIO, connected, make_node, settle


def rule(permission: str, filter: str, action: str = "all") -> AclRule:
    return AclRule(permission=permission, action=action, filter=filter)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_is_sys():
    assert is_sys("$SYS") and is_sys("$SYS/broker/load") and is_sys("$SYS/")
    assert (
        not is_sys("$SYSTEM/x") and not is_sys("sys/x") and not is_sys("$share/g/x") and not is_sys("a/$SYS")
    )


@pytest.mark.parametrize(
    ("rules", "default", "topic", "allowed"),
    [
        ([], "allow", "$SYS/x", False),  # no rules at all
        ([rule("allow", "#")], "allow", "$SYS/x", False),  # '#' does not match '$' topics
        ([rule("allow", "+/x")], "allow", "$SYS/x", False),
        ([rule("allow", "$SYS/#", "publish")], "deny", "$SYS/x", True),  # named explicitly
        ([rule("allow", "$SYS/broker/#")], "allow", "$SYS/other", False),
        ([rule("deny", "$SYS/broker/x"), rule("allow", "$SYS/#")], "allow", "$SYS/broker/x", False),
        ([rule("allow", "$SYS/#", "subscribe")], "allow", "$SYS/x", False),  # reading is not writing
        ([], "allow", "$SYSTEM/x", True),  # not the server's topics
        ([], "allow", "a/b", True),
    ],
)
def test_publish_on_sys_needs_a_rule_naming_it(rules, default, topic, allowed):
    assert Acl(rules, default).bind(None, "c").can_publish(topic) is allowed


def test_a_name_cannot_turn_a_rule_into_one_about_sys():
    acl = Acl([rule("allow", "%u/#"), rule("allow", "%c/#")])
    assert not acl.bind("$SYS", "c").can_publish("$SYS/x")
    assert not acl.bind("u", "$SYS").can_publish("$SYS/x")
    assert acl.bind("u", "c").can_publish("u/x")
    # a deny rule stays as substituted: it can only deny more
    assert not Acl([rule("deny", "%u/#")]).bind("$SYS", "c").can_publish("$SYS/x")


def test_reading_sys_is_unchanged():
    assert Acl([]).bind(None, "c").can_read("$SYS/x")


def drops(c: Client) -> int:
    return c.ch.telemetry.counters.dropped["not_authorized"]


async def sys_watcher(node: Node, clock: Clock, qos: int) -> Client:
    """A v5 client "watcher" on `node`, subscribed to $SYS/# at `qos`."""
    watcher = await connected(node, clock, "watcher", MQTT5)
    watcher.subscribe("$SYS/#", qos=qos)
    return watcher


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
@pytest.mark.parametrize("zone", [{}, {"acl": [{"permission": "allow", "action": "all", "filter": "#"}]}])
async def test_sys_publish_refused_not_routed_not_retained(clock, version, zone):
    node = make_node(**zone)
    watcher = await sys_watcher(node, clock, qos=1)
    pub = await connected(node, clock, "anon", version)
    pub.send(Publish("$SYS/broker/uptime", b"forged", 1, retain=True, packet_id=7))
    await settle()
    [ack] = pub.received()
    assert type(ack) is Puback and ack.packet_id == 7
    # v5 is told why; a v3 PUBACK cannot say it (as for any publish the rules deny)
    assert ack.reason_code == (RC.NOT_AUTHORIZED if version == MQTT5 else 0)
    assert watcher.received() == []
    assert node.retained.match("$SYS/#", 0.0) == []
    assert drops(pub) == 1
    # QoS 0 and QoS 2 too
    pub.send(Publish("$SYS/x", b"forged", 0))
    pub.send(Publish("$SYS", b"forged", 2, packet_id=8))
    await settle()
    assert watcher.received() == []
    assert drops(pub) == 3


async def test_sys_publish_allowed_by_an_explicit_rule(clock):
    node = make_node(acl=[{"permission": "allow", "action": "publish", "filter": "$SYS/bridge/#"}])
    watcher = await sys_watcher(node, clock, qos=1)
    pub = await connected(node, clock, "agent", MQTT5)
    pub.send(Publish("$SYS/bridge/status", b"up", 1, retain=True, packet_id=1))
    await settle()
    [ack] = pub.received()
    assert ack.reason_code == 0
    assert [p.topic for p in watcher.publishes()] == ["$SYS/bridge/status"]
    assert [m.topic for m in node.retained.match("$SYS/#", 0.0)] == ["$SYS/bridge/status"]


async def test_a_v5_will_on_sys_is_refused_at_connect(clock):
    node = make_node()
    c = Client(node, clock, MQTT5)
    c.send(Connect("w", proto_level=MQTT5, keepalive=0, will=Will("$SYS/x", b"gone")))
    await settle()
    [ack] = c.received()
    assert type(ack) is Connack and ack.reason_code == RC.NOT_AUTHORIZED


async def test_other_publishes_are_unchanged(clock):
    node = make_node()
    sub = await connected(node, clock, "sub")
    sub.subscribe("#", qos=0)
    pub = await connected(node, clock, "pub")
    pub.send_raw(encode(Publish("$SYSTEM/x", b"1", 0), MQTT311) + encode(Publish("a/b", b"2", 0), MQTT311))
    assert [p.topic for p in sub.publishes()] == ["a/b"]  # ('#' does not match '$SYSTEM/x': 4.7.2)
    assert drops(pub) == 0
    sub2 = await connected(node, clock, "sub2")
    sub2.send(Subscribe(1, [("$SYSTEM/#", SubOpts(qos=0))]))
    sub2.received()
    pub.send(Publish("$SYSTEM/x", b"3", 0))
    assert [p.payload for p in sub2.publishes()] == [b"3"]


async def test_a_bridge_link_may_bring_the_remotes_sys_in(clock):
    """A bridge's link (an in-process client the operator set up) publishes what it subscribed to at the
    remote, $SYS included, as configured."""

    class LinkIO(FakeIO):
        def write_packet(self, item: Any) -> None:
            self.data += item if isinstance(item, bytes | bytearray) else encode(item, MQTT5)

    node = make_node()
    watcher = await sys_watcher(node, clock, qos=0)
    link_io = LinkIO(clock)
    link = node.channel("default", link_io, peer="bridge:b", listener="$internal", clock=link_io)
    link.packets_received([Connect("$bridge-b", proto_level=MQTT5, keepalive=0)])
    await settle()
    link.packets_received([Publish("$SYS/remote/uptime", b"42", 0)])
    assert [p.topic for p in watcher.publishes()] == ["$SYS/remote/uptime"]
