"""Fakes and rigs for the protocol state machines, shared by the unit tests (no sockets).

clock = Clock()                                  # a hand-moved monotonic time; clock.advance(5)
io = FakeIO(clock)                               # a channel's IO and Clock: bytes written, close(), timers
io.pending("_check_keepalive"); io.fire_due()    # the timers armed; fire those whose time has come
host = FakeHost()                                # a channel's host, no node: sessions, routes, commits
ch = host.channel(io, zone_settings)             # a Channel on nothing but these fakes
host.commit(ok=True)                             # the store answers what the channel waits for

node = make_node(max_inflight=2)                 # a real Node (router, channel manager, memory store)
c = Client(node, clock, MQTT5)                   # a client whose channel runs on that node
await c.connect("dev1"); c.subscribe("t/#")      # packets in, packets out (c.received())
c = await connected(node, clock, "dev1", MQTT5)  # the same, connected in one step
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from fleetmq.broker.channel import Channel
from fleetmq.broker.codec import (
    MQTT311,
    Connack,
    Connect,
    Parser,
    Publish,
    Suback,
    SubOpts,
    Subscribe,
    encode,
)
from fleetmq.broker.config import load_config
from fleetmq.broker.message import Message
from fleetmq.broker.metrics import ZoneMetrics
from fleetmq.broker.negotiation import Negotiated
from fleetmq.broker.node import Node
from fleetmq.broker.router import Subscription
from fleetmq.broker.session import Session
from fleetmq.broker.telemetry import Telemetry
from fleetmq.broker.zone import Zone
from fleetmq.broker.zones import ZoneSettings

#: what FakeIO.wall() adds to the monotonic time (a wall clock far from it, as a real one is)
WALL_OFFSET = 1.8e9


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def advance(self, dt: float) -> None:
        self.now += dt


class FakeTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True

    @property
    def name(self) -> str:
        return getattr(self.callback, "__name__", "?")

    def __repr__(self) -> str:
        return f"FakeTimer({self.name}, when={self.when}, cancelled={self.cancelled}, fired={self.fired})"


class FakeIO:
    """A channel's ChannelIO and its Clock: collects written bytes, records close() and paused reading;
    its time is the shared `clock`'s, its timers its own (fired by hand)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.data = bytearray()
        self.closed = False
        self.paused = False
        self.writes_after_close = 0
        self.timers: list[FakeTimer] = []

    def write(self, data: bytes) -> None:
        if self.closed:
            self.writes_after_close += 1
        self.data += data

    def close(self) -> None:
        self.closed = True

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        assert delay >= 0
        t = FakeTimer(self.clock.now + delay, callback)
        self.timers.append(t)
        return t

    def time(self) -> float:
        return self.clock.now

    def wall(self) -> float:
        return WALL_OFFSET + self.clock.now

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def pending(self, name: str | None = None) -> list[FakeTimer]:
        return [
            t for t in self.timers if not t.cancelled and not t.fired and (name is None or t.name == name)
        ]

    def fire_due(self) -> int:
        """Fire every pending timer whose time has come (including ones armed while firing)."""
        n = 0
        while True:
            due = sorted((t for t in self.pending() if t.when <= self.clock.now), key=lambda t: t.when)
            if not due:
                return n
            for t in due:
                if not t.cancelled and not t.fired:
                    t.fired = True
                    n += 1
                    t.callback()


async def settle(n: int = 8) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Wire:
    """The client's end of a channel on a FakeIO: packets encoded into the channel, and the packets it
    wrote since the last look decoded out."""

    ch: Channel

    def __init__(self, io: FakeIO, version: int) -> None:
        self.io = io
        self.version = version
        self._parser = Parser(version=version)
        self._pos = 0

    def send(self, *packets: Any) -> None:
        self.ch.data_received(b"".join(encode(p, self.version) for p in packets))

    def send_raw(self, data: bytes) -> None:
        self.ch.data_received(data)

    def received(self) -> list[Any]:
        """Packets written since the last call."""
        new = bytes(self.io.data[self._pos :])
        self._pos = len(self.io.data)
        return self._parser.feed(new)


class Client(Wire):
    """One simulated client connection: encodes packets into the channel, decodes what it writes."""

    def __init__(self, node: Node, clock: Clock, version: int = MQTT311, zone: str = "default") -> None:
        super().__init__(FakeIO(clock), version)
        self.node = node
        self.clock = clock
        self.ch = node.channel(zone, self.io, peer="127.0.0.1:1", listener="test", clock=self.io)
        self._backlog: list[Any] = []

    def received(self) -> list[Any]:
        """Packets written since the last call."""
        backlog, self._backlog = self._backlog, []
        return backlog + super().received()

    async def connect(self, client_id: str = "c", **kw: Any) -> Connack:
        kw.setdefault("keepalive", 0)
        self.send(Connect(client_id, proto_level=self.version, **kw))
        await settle()
        got = self.received()
        assert got and type(got[0]) is Connack, got
        self._backlog = got[1:]  # what followed the CONNACK (resent and queued deliveries)
        return got[0]

    def subscribe(self, topic_filter: str, qos: int = 1, packet_id: int = 1) -> Suback:
        self.send(Subscribe(packet_id, [(topic_filter, SubOpts(qos=qos))]))
        [ack] = self.received()
        assert type(ack) is Suback
        return ack

    def publish_each(self, topic: str, payloads: Iterable[bytes], qos: int = 1, first_id: int = 1) -> None:
        """PUBLISH each payload to `topic` at `qos` (1 or 2), under packet ids first_id, first_id + 1, ..."""
        for packet_id, payload in enumerate(payloads, first_id):
            self.send(Publish(topic, payload, qos=qos, packet_id=packet_id))

    def publishes(self) -> list[Publish]:
        got = self.received()
        assert all(type(p) is Publish for p in got), got
        return got


async def connected(
    node: Node, clock: Clock, client_id: str, version: int = MQTT311, *, zone: str = "default", **kw: Any
) -> Client:
    """A Client on `node` whose CONNECT (with `kw`) was answered; what followed the CONNACK is left to be
    received."""
    c = Client(node, clock, version, zone)
    await c.connect(client_id, **kw)
    return c


def make_node(**zone: Any) -> Node:
    return Node(load_config(overrides={"node_id": "t1", "zones": {"default": zone}}))


class FakeHost:
    """A channel's host with no node behind it: it opens a fresh session for every CONNECT at once (or
    keeps the request in `opening` with `hold_open`), records what is routed, subscribed and unsubscribed,
    and holds every `after_commit` callback until the test answers with `commit(ok)`."""

    def __init__(
        self, *, durable: bool = True, receipts_first: bool = False, hold_open: bool = False
    ) -> None:
        self.durable = durable
        self.receipts_first = receipts_first
        self.hold_open = hold_open
        self.opening: list[tuple[Channel, Negotiated]] = []
        self.published: list[Message] = []
        self.subscribed: dict[str, Subscription] = {}
        self.closed_channels: list[Channel] = []
        self.waiting: list[Callable[[bool], None]] = []
        self.matched = True  # what publish() answers: a subscriber matched
        self.writes = True  # and: routing wrote to the store (the ack waits for a commit)
        self.retained_msgs: list[Message] = []
        self.asking: list[tuple[Channel, list[tuple[str, str]]]] = []  # authorize() calls not answered yet
        self._ids = 0

    def channel(self, io: FakeIO, settings: ZoneSettings | None = None, zone: str = "default") -> Channel:
        settings = settings or ZoneSettings()
        return Channel(
            self, Zone(zone, settings, Telemetry(zone, ZoneMetrics())), io, io, "127.0.0.1:1", "test"
        )

    def open_session(self, ch: Channel, request: Negotiated) -> None:
        if self.hold_open:
            self.opening.append((ch, request))
            return
        self.open(ch, request)

    def open(self, ch: Channel, request: Negotiated) -> None:
        session = Session(
            request.client_id,
            ch.settings,
            expiry_interval=request.expiry,
            receive_maximum=request.receive_maximum,
            now=ch.clock.time(),
        )
        ch.session_opened(session, False, request.connack_props)

    def closed(self, ch: Channel) -> None:
        self.closed_channels.append(ch)

    def publish(self, msg: Message, zone: str) -> tuple[int, bool]:
        self.published.append(msg)
        return int(self.matched), self.writes

    def subscribe(self, ch: Channel, topic_filter: str, sub: Subscription) -> None:
        self.subscribed[topic_filter] = sub

    def unsubscribe(self, ch: Channel, topic_filter: str) -> None:
        self.subscribed.pop(topic_filter, None)

    def retained(self, topic_filter: str) -> Iterable[Message | None]:
        return iter(self.retained_msgs)

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        self.waiting.append(callback)

    def commit(self, ok: bool = True) -> int:
        """Answer every callback waiting now (not those its answers add), in the order they came."""
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback(ok)
        return len(waiting)

    def new_client_id(self) -> str:
        self._ids += 1
        return f"auto-{self._ids}"

    def authorize(self, ch: Channel, asks: list[tuple[str, str]]) -> None:
        self.asking.append((ch, asks))

    def answer(self, said: dict[tuple[str, str], bool | None]) -> list[tuple[str, str]]:
        """Answer the oldest authorize() call from `said` (an ask it lacks: denied); what was asked."""
        ch, asks = self.asking.pop(0)
        ch.authorized([(action, topic, said.get((action, topic), False)) for action, topic in asks])
        return asks
