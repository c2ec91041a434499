"""The broker's per-message path in one process, without sockets: what one delivered message costs.

A publisher and a subscriber channel on one node (in-memory sessions, the bench's unlimited zone) are fed
pre-encoded packets, the way connections feed them (a batch of packets per read), and the subscriber
acknowledges everything it gets: PUBLISH → route → deliver → ack, QoS 0, 1 or 2, MQTT 3.1.1. Nothing is
parsed on the client side: the broker's packet ids are predictable (1, 2, 3, ...), so every client packet
is encoded up front.

    python -m bench.hotpath --qos 1 --messages 20000        # CPU µs per message (process time)

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


def new_channel(node: Node, zone: str, io: SinkIO) -> Any:
    if hasattr(node, "channel"):  # the core since issue 12
        return node.channel(zone, io, "127.0.0.1:1", "bench")
    from fleetmq.broker.channel import Channel  # earlier: Channel(node, zone, io, ...)

    return Channel(node, zone, io, "127.0.0.1:1", "bench")  # type: ignore[arg-type]


def pid(i: int) -> int:
    return i % 65535 + 1


async def run(qos: int, n: int) -> float:
    node = Node(
        load_config(
            overrides={
                "node_id": "hotpath",
                "zones": {"bench": {"max_inflight": 0, "max_mqueue_len": 0, "max_awaiting_rel": 0}},
            }
        )
    )
    pub_io, sub_io = SinkIO(), SinkIO()
    pub, sub = new_channel(node, "bench", pub_io), new_channel(node, "bench", sub_io)
    sub.data_received(encode(Connect("sub", proto_level=MQTT311, keepalive=0), MQTT311))
    pub.data_received(encode(Connect("pub", proto_level=MQTT311, keepalive=0), MQTT311))
    for _ in range(10):
        await asyncio.sleep(0)
    sub.data_received(encode(Subscribe(1, [("bench/t", SubOpts(qos=qos))]), MQTT311))
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
        pub.data_received(b"".join(publishes[start:end]))
        if qos == 2:
            pub.data_received(b"".join(pubrels[start:end]))
        if qos:
            sub.data_received(b"".join(acks[start:end]))
        if qos == 2:
            sub.data_received(b"".join(comps[start:end]))
        await asyncio.sleep(0)  # the loop turn a connection's read ends with (group commit, flushes)
    spent = time.process_time() - t0
    session = sub.session
    assert session is not None and len(session.inflight) == 0, "the subscriber left messages unacknowledged"
    assert sub_io.written >= n * len(payload), "the subscriber did not get every message"
    return spent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.splitlines()[0])
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--messages", type=int, default=20000)
    args = p.parse_args(argv)
    spent = asyncio.run(run(args.qos, args.messages))
    json.dump({"qos": args.qos, "messages": args.messages, "cpu_s": spent}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
