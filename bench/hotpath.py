"""The broker's per-message path in one process, without sockets: what one delivered message costs.

A publisher and a subscriber channel on one node (in-memory sessions, the bench's unlimited zone) are fed
pre-encoded packets, the way connections feed them (a batch of packets per read), and the subscriber
acknowledges everything it gets: PUBLISH → route → deliver → ack, QoS 0, 1 or 2, MQTT 3.1.1. Nothing is
parsed on the client side: the broker's packet ids are predictable (1, 2, 3, ...), so every client packet
is encoded up front.

    python -m bench.hotpath --qos 1 --messages 20000        # CPU µs per message (process time)
    python -m bench.hotpath --qos 0 --io connection         # through connection.Connection too
    python -m bench.hotpath --qos 1 --subscribers 10        # fan-out: 10 deliveries per message

`--io connection` puts each channel behind the real connection.Connection over a transport that takes
every byte at once: the per-read and per-write bookkeeping of the socket layer (write batching, the write
bounds, the read turns) is counted too.

Under `valgrind --tool=callgrind` the instruction count is repeatable, whatever else the machine does:
`bench/__main__.py --hotpath` runs it twice (N and 2N messages) and reports instructions per message
from the difference, for this checkout and each `--baseline`, so setup costs cancel out.
It runs against older checkouts too (through PYTHONPATH), so it only uses what both ages of the code have.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from fleetmq.broker.codec import (
    MQTT311,
    Connect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    SubOpts,
    Subscribe,
    encode,
)
from fleetmq.broker.config import load_config
from fleetmq.broker.node import Node

BATCH = 50  # packets per read


class SinkIO:
    """A transport that keeps nothing: counts bytes written, runs no timers."""

    def __init__(self) -> None:
        self.written = 0
        self.closed = False
        self.now = 1000.0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.closed = True

    def call_later(self, delay: float, callback: Any) -> Any:
        return _NoTimer()

    def time(self) -> float:
        return self.now

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _NoTimer:
    def cancel(self) -> None:
        pass


class SinkTransport:
    """A socket that takes every byte at once (the transport of `--io connection`)."""

    def __init__(self) -> None:
        self.written = 0
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Endpoint:
    """One client of the run: its channel, how bytes reach it, and what it was sent."""

    def __init__(self, node: Node, zone: str, io: str) -> None:
        if io == "connection":
            from fleetmq.broker.connection import Connection, Site

            t = SinkTransport()
            conn = Connection(Site(lambda cio, peer, listener: new_channel(node, zone, cio), "bench", set()))
            conn.connection_made(t)  # type: ignore[arg-type]
            self.channel = conn.channel
            self.feed = conn.data_received
            self.written = lambda: t.written
        else:
            sink = SinkIO()
            self.channel = new_channel(node, zone, sink)
            self.feed = self.channel.data_received
            self.written = lambda: sink.written


def new_channel(node: Node, zone: str, io: Any) -> Any:
    if hasattr(node, "channel"):  # the core since issue 12
        return node.channel(zone, io, "127.0.0.1:1", "bench")
    from fleetmq.broker.channel import Channel  # earlier: Channel(node, zone, io, ...)

    return Channel(node, zone, io, "127.0.0.1:1", "bench")  # type: ignore[arg-type]


def pid(i: int) -> int:
    return i % 65535 + 1


async def run(qos: int, n: int, io: str = "sink", subscribers: int = 1) -> float:
    """CPU seconds for `n` messages to each of `subscribers` (fan-out: every one gets every message)."""
    node = Node(
        load_config(
            overrides={
                "node_id": "hotpath",
                "zones": {"bench": {"max_inflight": 0, "max_mqueue_len": 0, "max_awaiting_rel": 0}},
            }
        )
    )
    pub = Endpoint(node, "bench", io)
    subs = [Endpoint(node, "bench", io) for _ in range(subscribers)]
    for k, sub in enumerate(subs):
        sub.feed(encode(Connect(f"sub{k or ''}", proto_level=MQTT311, keepalive=0), MQTT311))
    pub.feed(encode(Connect("pub", proto_level=MQTT311, keepalive=0), MQTT311))
    for _ in range(10):
        await asyncio.sleep(0)
    for sub in subs:
        sub.feed(encode(Subscribe(1, [("bench/t", SubOpts(qos=qos))]), MQTT311))
    payload = b"x" * 64
    publishes = [
        encode(Publish("bench/t", payload, qos, packet_id=pid(i) if qos else 0), MQTT311) for i in range(n)
    ]
    pubrels = [encode(Pubrel(pid(i)), MQTT311) for i in range(n)] if qos == 2 else []
    if qos == 1:
        acks = [encode(Puback(pid(i)), MQTT311) for i in range(n)]
    elif qos == 2:
        acks = [encode(Pubrec(pid(i)), MQTT311) for i in range(n)]
        comps = [encode(Pubcomp(pid(i)), MQTT311) for i in range(n)]
    t0 = time.process_time()
    for start in range(0, n, BATCH):
        end = min(start + BATCH, n)
        pub.feed(b"".join(publishes[start:end]))
        if qos == 2:
            pub.feed(b"".join(pubrels[start:end]))
        if qos:
            batch = b"".join(acks[start:end])
            for sub in subs:  # (each subscriber's packet ids are 1, 2, 3, ... too)
                sub.feed(batch)
        if qos == 2:
            batch = b"".join(comps[start:end])
            for sub in subs:
                sub.feed(batch)
        await asyncio.sleep(0)  # the loop turn a connection's read ends with (group commit, flushes)
    spent = time.process_time() - t0
    for sub in subs:
        session = sub.channel.session
        assert session is not None and len(session.inflight) == 0, "a subscriber left messages unacknowledged"
        assert sub.written() >= n * len(payload), "a subscriber did not get every message"
    return spent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.splitlines()[0])
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--io", choices=("sink", "connection"), default="sink", help="what the channels write to")
    p.add_argument("--subscribers", type=int, default=1, help="fan-out: each gets every message")
    args = p.parse_args(argv)
    spent = asyncio.run(run(args.qos, args.messages, args.io, args.subscribers))
    out = {"qos": args.qos, "messages": args.messages, "io": args.io, "subscribers": args.subscribers}
    json.dump({**out, "cpu_s": spent}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
