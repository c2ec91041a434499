"""The fleet's wire format: what Lua scripts build in a real Redis, Python parses; what Python packs, it
unpacks; and the key names the scripts use are store/keys.py's."""

from __future__ import annotations

import pytest
from fleetmq.broker.codec import Prop
from fleetmq.broker.message import Delivery, Message
from fleetmq.broker.router import Subscription
from fleetmq.broker.store import keys, wire
from fleetmq.broker.store.redis_store import SCRIPTS, _script
from hypothesis import given, settings
from hypothesis import strategies as st

names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20
)


def lua(redis_server, expression: str, *args: bytes | str) -> bytes:
    return redis_server.command("EVAL", wire.LUA_PRELUDE + f"return {expression}", 0, *args)


@pytest.mark.redis
def test_messages_built_in_lua_parse_in_python(redis_server):
    sub = Subscription(2, True, True, 1, 7)
    packed = wire.pack_sub(sub)
    got = wire.parse_fleet_event(
        lua(redis_server, "route_added(ARGV[1], ARGV[2], ARGV[3], ARGV[4])", "node-1", "c/ü", "a/+/#", packed)
    )
    assert got == wire.RouteAdded("node-1", "c/ü", "a/+/#", sub)
    got = wire.parse_fleet_event(
        lua(redis_server, "route_removed(ARGV[1], ARGV[2], ARGV[3])", "n", "c", "x/#")
    )
    assert got == wire.RouteRemoved("n", "c", "x/#")
    got = wire.parse_fleet_event(lua(redis_server, "session_ended(ARGV[1], ARGV[2])", "n", "c 1"))
    assert got == wire.SessionEnded("n", "c 1")
    assert wire.parse_node_message(lua(redis_server, "wake(ARGV[1])", "c:2")) == wire.Wake("c:2")


@settings(max_examples=100, deadline=None)
@given(cid=names, node=names, req=names, epoch=st.integers(0, 2**62), clean=st.booleans())
def test_python_messages_round_trip(cid, node, req, epoch, clean):
    assert wire.parse_node_message(wire.handover(cid, clean, node, req)) == wire.Handover(
        cid, clean, node, req
    )
    assert wire.parse_node_message(wire.handed_over(req)) == wire.HandedOver(req)
    assert wire.parse_node_message(wire.kick(cid, epoch)) == wire.Kick(cid, epoch)


def test_values_round_trip():
    msg = Message(
        "a/b",
        b"\0payload",
        2,
        True,
        {Prop.CONTENT_TYPE: "text/plain", Prop.USER_PROPERTY: [("k", "v")]},
        "sender",
        expiry=30.0,
    )
    back = wire.unpack_message(wire.pack_message(msg))
    attrs = ("topic", "payload", "qos", "retain", "props", "sender", "ts", "msg_id", "expires_at", "receipt")
    for attr in attrs:
        assert getattr(back, attr) == getattr(msg, attr), attr
    msg.receipt = ("9f3c-ü", 2**40 + 3)  # (a QoS 2 receipt travels with the message)
    back = wire.unpack_message(wire.pack_message(msg))
    for attr in attrs:
        assert getattr(back, attr) == getattr(msg, attr), attr
    event = wire.parse_fleet_event(wire.retained_changed("n", wire.pack_message(msg)))
    assert isinstance(event, wire.RetainedChanged) and event.msg.msg_id == msg.msg_id
    d = Delivery(msg, 1, False, (3, 9))
    d.packet_id, d.stage, d.order = 17, 1, 42
    back_d = wire.unpack_journal(wire.journal_value(d))
    assert (back_d.packet_id, back_d.stage, back_d.order, back_d.sub_ids, back_d.qos) == (
        17,
        1,
        42,
        (3, 9),
        1,
    )
    assert wire.pack_delivery(d)[: wire.DELIVERY_ID_LEN] == wire.journal_field(msg.msg_id)


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError):
        wire.parse_fleet_event(b"x\0n\0c")
    with pytest.raises(ValueError):
        wire.parse_node_message(b"x\0c")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_name_no_key_of_their_own(name):
    """Key and channel names reach the scripts from store/keys.py: none is spelled out in Lua."""
    body = _script(SCRIPTS[name])
    assert f"'{keys.PREFIX}:" not in body.replace(f"'{keys.EVENTS}'", "").replace(
        f"'{keys.NODE_CHANNEL_PREFIX}'", ""
    )


@pytest.mark.redis
def test_a_journal_entry_becomes_a_queue_item_not_sent_yet(redis_server):
    """queued_delivery (Lua) turns a journal entry of a sent delivery back into what a queue holds: the same
    delivery with no packet id and stage 0, which the owner places and numbers itself."""
    msg = Message("t/1", b"\0\xffpayload", 2, False, {Prop.CONTENT_TYPE: "x"}, "pub", expiry=60.0)
    d = Delivery(msg, 2, True, (3, 9))
    d.packet_id, d.stage, d.order = 65535, 1, 123456789012
    queued = wire.unpack_delivery(lua(redis_server, "queued_delivery(ARGV[1])", wire.journal_value(d)))
    assert (queued.packet_id, queued.stage, queued.order) == (0, 0, -1)
    assert (queued.qos, queued.retain, queued.sub_ids) == (2, True, (3, 9))
    assert (queued.msg.msg_id, queued.msg.topic, queued.msg.payload) == (msg.msg_id, "t/1", msg.payload)
    assert queued.msg.props == msg.props and queued.msg.expires_at == msg.expires_at


def test_replicas_in_sync_counts_online_replicas_not_far_behind():
    from fleetmq.broker.cluster import replicas_in_sync

    reply = {
        "role": "master",
        "connected_slaves": 3,
        "slave0": {"ip": "10.0.0.1", "port": 6379, "state": "online", "offset": 10, "lag": 0},
        "slave1": {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 9, "lag": 4},
        "slave2": {"ip": "10.0.0.3", "port": 6379, "state": "wait_bgsave", "offset": 0, "lag": 0},
        "slave_read_only": 1,
    }
    assert replicas_in_sync(reply) == 1
    assert replicas_in_sync({"role": "master", "connected_slaves": 0}) == 0


def test_awaiting_pubrel_records_are_stored_in_wall_clock_time_and_read_in_the_loops():
    """A record's time means the same on every node (each host's monotonic clock differs): stored as
    wall-clock time, read back on the reader's loop clock; a monotonic one an earlier node stored counts as
    received now."""
    import time

    from fleetmq.broker.store.redis_store import parse_rel_value, rel_value

    offset = 1_700_000_000.0  # wall-clock time minus this loop's clock
    assert rel_value(1_700_000_005.25, 0) == "1700000005.250"
    assert parse_rel_value(rel_value(1_700_000_005.25, 7).encode(), offset) == (5.25, 7)
    ts, receipt = parse_rel_value(b"953.906:3", offset)  # stored by an earlier node: its host's uptime
    assert receipt == 3 and abs(ts - (time.time() - offset)) < 5
