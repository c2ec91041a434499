"""Memory no client can run away with (issue 25, item 6), without sockets.

- What is written to a client that does not read is bounded per connection (the transport's high-water
  mark, seen within the loop turn that writes) and for the node (connection.WriteBudget).
- A new subscription's retained messages go out paced: a batch per loop turn, QoS 0 while the socket takes
  them, QoS 1/2 through the Inflight Window; nothing is dropped for it and nothing copied meanwhile.
- A client sending fast waits a loop turn after every READ_TURN bytes, so the others are served.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from fleetmq.broker.channel import RETAINED_BATCH, Channel
from fleetmq.broker.codec import (
    MQTT5,
    MQTT311,
    Connect,
    Prop,
    Puback,
    Publish,
    Suback,
    SubOpts,
    Subscribe,
    Unsubscribe,
    encode,
)
from fleetmq.broker.config import ConfigError, load_config
from fleetmq.broker.connection import FLUSH_AT, READ_TURN, Connection, Site, WriteBudget
from fleetmq.broker.message import Message
from fleetmq.broker.node import Node
from fleetmq.broker.retained import SCAN_STEP, Retained

from tests.fakes import Client, Clock, connected, make_node, settle


def load_retained(node: Node, clock: Clock, n: int, qos: int = 0, size: int = 100) -> None:
    pub = Client(node, clock)
    pub.send_raw(b"")
    pub.ch.data_received(encode(Connect("loader", proto_level=MQTT311, keepalive=0), MQTT311))
    for i in range(n):
        pub.ch.data_received(
            encode(
                Publish(f"r/{i}", b"x" * size, qos, retain=True, packet_id=i % 65535 + 1 if qos else 0),
                MQTT311,
            )
        )


async def retained_subscriber(clock: Clock, n: int, qos: int = 0, size: int = 100, **zone: Any) -> Client:
    """A client "sub" connected to a node (its default zone set by `zone`) that holds `n` retained messages
    (load_retained); it has not subscribed yet."""
    node = make_node(**zone)
    load_retained(node, clock, n, qos, size)
    return await connected(node, clock, "sub")


def subscribe_retained(sub: Client, qos: int = 0) -> None:
    """SUBSCRIBE to where the retained messages are, at `qos`."""
    sub.send(Subscribe(1, [("r/#", SubOpts(qos=qos))]))


def publishes(c: Client) -> list[Publish]:
    return [p for p in c.received() if type(p) is Publish]


def loop_turn(c: Client) -> bool:
    """Fire the retained pump's pending timer (a loop turn); False when none is pending."""
    pending = c.io.pending("_pump_retained")
    for t in pending:
        t.fired = True
        t.callback()
    return bool(pending)


# -----------------------------------------------------------------------------------------------
# retained messages of a new subscription: paced
# -----------------------------------------------------------------------------------------------


async def test_retained_go_out_a_batch_per_loop_turn(clock):
    sub = await retained_subscriber(clock, 1000)
    subscribe_retained(sub)
    got = sub.received()
    assert type(got[0]) is Suback
    assert len(got) - 1 == RETAINED_BATCH, "only a first batch in the SUBSCRIBE's own turn"
    seen = [p.topic for p in got[1:]]
    turns = 0
    while loop_turn(sub):
        batch = publishes(sub)
        assert len(batch) <= RETAINED_BATCH
        seen += [p.topic for p in batch]
        turns += 1
    assert sorted(seen) == sorted(f"r/{i}" for i in range(1000))
    assert len(seen) == len(set(seen)), "each retained message once"
    assert turns >= 1000 // RETAINED_BATCH - 1
    assert sub.ch.telemetry.counters.dropped["queue_full"] == 0


async def test_retained_qos0_wait_while_the_socket_is_congested(clock):
    sub = await retained_subscriber(clock, 500)
    sub.ch.set_congested(True)  # the socket takes nothing
    subscribe_retained(sub)
    assert [type(p) for p in sub.received()] == [Suback]
    sub.io.fire_due()
    assert publishes(sub) == [], "nothing is added to a congested socket"
    sub.ch.set_congested(False)  # drained: the rest follows, paced
    topics: list[str] = []
    while sub.io.pending("_pump_retained"):
        sub.io.fire_due()
        topics += [p.topic for p in publishes(sub)]
    assert len(topics) == 500 and len(set(topics)) == 500
    assert sub.ch.telemetry.counters.dropped["queue_full"] == 0, (
        "retained messages are not dropped, they wait"
    )


async def test_retained_stop_at_congestion_within_a_batch(clock):
    """The transport says it is full while the batch runs (connection.Connection flushes past FLUSH_AT):
    the pump stops at once, and resumes when the socket drains."""
    sub = await retained_subscriber(clock, 300, size=1000)
    sub.received()
    written = 0
    plain_write = sub.io.write

    def write(data: bytes) -> None:
        nonlocal written
        plain_write(data)
        written += len(data)
        if written > 10_000 and not sub.ch.congested:
            sub.ch.set_congested(True)

    sub.io.write = write  # type: ignore[method-assign]
    sub.ch.write_publish = write
    subscribe_retained(sub)
    sub.io.fire_due()
    first = publishes(sub)
    assert 10 <= len(first) <= 12, "no more than what passed the mark, one message beyond"
    sub.ch.set_congested(False)
    written = -(10**9)
    while sub.io.pending("_pump_retained"):
        sub.io.fire_due()
    assert len(first) + len(publishes(sub)) == 300


async def test_retained_qos1_are_paced_by_the_window_and_never_dropped(clock):
    """20 times more retained messages than the queue holds: they enter the session as the window frees,
    so none is dropped (before, the queue overflowed at once: max_mqueue_len drops)."""
    sub = await retained_subscriber(clock, 1000, qos=1, max_inflight=10, max_mqueue_len=50)
    subscribe_retained(sub, qos=1)
    got = [p for p in sub.received() if type(p) is Publish]
    session = sub.ch.session
    assert session is not None
    assert len(got) == 10 and len(session.inflight) == 10 and len(session.mqueue) <= 1
    topics = [p.topic for p in got]
    while got:
        for p in got:
            sub.send(Puback(p.packet_id))
        sub.io.fire_due()
        got = publishes(sub)
        topics += [p.topic for p in got]
        assert len(session.mqueue) <= 1
    assert sorted(topics) == sorted(f"r/{i}" for i in range(1000))
    assert sub.ch.telemetry.counters.dropped["queue_full"] == 0


async def test_unsubscribe_stops_the_retained_still_due(clock):
    sub = await retained_subscriber(clock, 500)
    subscribe_retained(sub)
    assert len(publishes(sub)) == RETAINED_BATCH
    sub.send(Unsubscribe(2, ["r/#"]))
    sub.received()
    sub.io.fire_due()
    assert publishes(sub) == []


async def test_retained_messages_keep_no_encodings(clock):
    """A retained message stays in the store: an encoding cached on it for one subscriber would double it."""
    sub = await retained_subscriber(clock, 3)
    subscribe_retained(sub)
    assert len(publishes(sub)) == 3
    for m in sub.node.retained.match("r/#", 0.0):
        assert m._plain is None


def test_retained_scan_steps_and_takes_each_topic_as_it_is_now():
    ret = Retained()
    for i in range(200):
        ret.put(Message(f"a/{i}", b"v1", 0, retain=True))
    for i in range(200):
        ret.put(Message(f"b/{i}", b"v1", 0, retain=True))
    scan = ret.scan("b/#", 0.0)
    first = [next(scan) for _ in range(200 // SCAN_STEP)]
    assert first == [None] * (200 // SCAN_STEP), "a step yields after SCAN_STEP topics that gave nothing"
    ret.put(Message("b/1", b"v2", 0, retain=True))  # replaced meanwhile: the latest goes out
    ret.put(Message("b/2", b"", 0, retain=True))  # cleared meanwhile: skipped
    got = [m for m in scan if m is not None]
    assert len(got) == 199
    assert {m.topic: m.payload for m in got}["b/1"] == b"v2"
    assert "b/2" not in {m.topic for m in got}


# -----------------------------------------------------------------------------------------------
# the connection: writes bounded within the turn, per connection and for the node
# -----------------------------------------------------------------------------------------------


class Transport:
    """A socket that takes `take` bytes, then buffers; pause/resume_writing at its water marks, at once."""

    def __init__(self, take: int = 0) -> None:
        self.take = take
        self.sent = 0
        self.buffered = 0
        self.high = 64 * 1024
        self.protocol: Connection | None = None
        self.paused = False
        self.reading = True
        self.closing = False
        self.writes = 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high or self.high

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.writes += 1
        n = min(self.take, len(data))
        self.take -= n
        self.sent += n
        self.buffered += len(data) - n
        if self.buffered > self.high and not self.paused:
            self.paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.sent += self.buffered
        self.buffered = 0
        if self.paused:
            self.paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def connect(node: Node, client_id: str, transport: Transport, **kw: Any) -> Connection:
    conn = Connection(
        Site(lambda io, peer, listener: node.channel("default", io, peer, listener), "t", set(), **kw)
    )
    transport.protocol = conn
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(encode(Connect(client_id, proto_level=MQTT311, keepalive=0), MQTT311))
    return conn


async def test_a_burst_to_a_client_that_does_not_read_is_bounded_within_the_turn():
    """100 x 64 KiB QoS 0 messages in one loop turn to a subscriber whose socket takes nothing: the
    connection hands them to the transport as they come, the transport says it is full, and the rest is
    dropped (counted) instead of waiting in the turn's buffer (before: 6.4 MB joined at the turn's end)."""
    node = make_node()
    st, pt = Transport(), Transport(take=1 << 40)
    sub, pub = connect(node, "sub", st, budget=WriteBudget(1 << 40, 1 << 20)), connect(node, "pub", pt)
    await settle()
    sub.data_received(encode(Subscribe(1, [("t", SubOpts(qos=0))]), MQTT311))
    await settle()
    payload = b"x" * 65536
    pub.data_received(b"".join(encode(Publish("t", payload, 0), MQTT311) for _ in range(100)))
    held = st.buffered + sum(len(b) for b in sub._buf)
    assert held <= (1 << 20) + FLUSH_AT + 2 * 65600, f"{held} bytes held for a client that reads nothing"
    assert sub.channel is not None and sub.channel.congested
    assert sub.channel.telemetry.counters.dropped["queue_full"] >= 80
    st.drain()  # it reads again: no longer congested
    assert not sub.channel.congested


async def test_small_writes_still_go_out_once_per_turn():
    node = make_node()
    t = Transport(take=1 << 40)
    conn = connect(node, "c", t)
    await settle()
    t.writes = 0
    for _ in range(100):
        assert conn.channel is not None
        conn.channel.io.write(b"\xd0\x00")  # PINGRESP
    assert t.writes == 0
    await settle(1)
    assert t.writes == 1


async def test_the_node_budget_holds_back_connections_that_hold_bytes():
    budget = WriteBudget(limit=1 << 20, connection_limit=4 << 20)
    node = make_node()
    slow = [Transport() for _ in range(3)]
    conns = [connect(node, f"s{i}", t, budget=budget) for i, t in enumerate(slow)]
    fast_t = Transport(take=1 << 40)
    fast = connect(node, "fast", fast_t, budget=budget)
    await settle()
    used = budget.used  # (their CONNACKs)
    for c in conns:
        c.write(b"y" * 600_000)  # each under its own mark, together past the node's
    assert budget.used - used == 1_800_000
    assert [c.channel.congested for c in conns if c.channel] == [False, True, True]
    fast.write(b"z" * 600_000)
    assert fast.channel is not None and not fast.channel.congested, "a client that keeps up is not held back"
    slow[1].drain()
    slow[2].drain()
    await asyncio.sleep(WriteBudget.TICK * 1.5)
    assert budget.used == slow[0].buffered
    assert [c.channel.congested for c in conns if c.channel] == [False, False, False]
    for c in conns:
        c.connection_lost(None)
    assert budget.used == 0


async def test_a_fast_sender_waits_a_turn_after_read_turn_bytes():
    node = make_node()
    t = Transport(take=1 << 40)
    conn = connect(node, "pub", t)
    await settle()
    chunk = b"".join(encode(Publish("t", b"x" * 1000, 0), MQTT311) for _ in range(READ_TURN // 1000 + 1))
    conn.data_received(chunk)
    assert not t.reading, "reading waits for the next loop turn"
    await settle(1)
    assert t.reading
    # the channel holding the reader back (publish rate) is not undone by the turn's end
    conn.data_received(chunk)
    conn.pause_reading()
    await settle(1)
    assert not t.reading
    conn.resume_reading()
    assert t.reading


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_the_server_bounds_its_connections_by_the_config():
    """write_buffers: every connection's transport gets the per-connection mark, and all share the node's
    budget."""
    from fleetmq.broker.server import Server

    from tests.support import free_port

    port = free_port()
    cfg = load_config(
        overrides={
            "node_id": "wb",
            "listeners": [{"name": "m", "bind": f"127.0.0.1:{port}"}],
            "write_buffers": {"connection": 1 << 20, "node": 8 << 20},
        }
    )
    server = Server(cfg)
    await server.start()
    writers = []
    try:
        for _ in range(2):
            writers.append((await asyncio.open_connection("127.0.0.1", port))[1])
        for _ in range(100):
            if len(server.connections) == 2:
                break
            await asyncio.sleep(0.01)
        assert server.write_budget.limit == 8 << 20
        for conn in server.connections:
            assert conn._site.budget is server.write_budget
            assert conn.transport is not None
            assert conn.transport.get_write_buffer_limits()[1] == 1 << 20
    finally:
        for w in writers:
            w.close()
        await server.drain(timeout=1)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"connection": 1000}, "write_buffers.connection: Input should be greater than or equal to 65536"),
        ({"node": 0}, "write_buffers.node: Input should be greater than or equal to 1048576"),
        ({"nodes": 1 << 30}, "write_buffers.nodes: Extra inputs are not permitted"),
    ],
)
def test_bad_write_buffers_name_the_field(bad, error):
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"write_buffers": bad})
    assert str(e.value) == error


def test_a_message_keeps_one_copy_of_its_payload_whatever_it_encoded_for_its_subscribers():
    # (queue byte limits count the payload once: what is cached to encode for many subscribers must not
    # hold another copy of it, at any protocol version)
    payload = b"p" * 10_000
    msg = Message("t/1", payload, 1, props={Prop.USER_PROPERTY: [("k", "v")]})
    for version in (MQTT311, MQTT5):
        for pid in (1, 2):
            assert msg.encode(version, 1, False, pid).endswith(payload)
    assert msg._parts is not None and len(msg._parts) == 2
    assert all(len(head) + len(block) < 100 for head, block in msg._parts.values())


async def test_a_closed_connection_goes_without_the_garbage_collector():
    """A closed connection's channel and session are freed by reference counting: the collector's full
    passes are rare in a broker (broker/cli.py _tune_gc), so anything a cycle keeps stays until one runs,
    and after a fleet's clients leave, the node would hold what they took."""
    node = make_node()

    def channels() -> int:
        return sum(type(o) is Channel for o in gc.get_objects())

    gc.collect()
    before = channels()
    gc.disable()
    try:
        transports = [Transport(take=1 << 40) for _ in range(20)]
        conns = [connect(node, f"c{i}", t) for i, t in enumerate(transports)]
        await settle()
        for i, c in enumerate(conns):
            c.data_received(encode(Subscribe(1, [(f"t/{i}", SubOpts(qos=1))]), MQTT311))
            c.data_received(encode(Publish(f"t/{i}", b"x", 1, packet_id=7), MQTT311))
        await settle()
        assert channels() == before + 20
        for c in conns:
            c.connection_lost(None)
        await settle()
        assert channels() == before, "closed channels are kept by a reference cycle"
    finally:
        gc.enable()
