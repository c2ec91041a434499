"""What a persistent session and a queued message cost in Redis: the memory figures of the README's capacity
model (the CPU and command figures come from `make bench`'s Redis rows).

    python -m bench.capacity [--sessions 5000] [--queued 20000]

A fleetmq node (the bench fleet's node `a`) on a redis-server of its own (no persistence): `--sessions`
MQTT 3.1.1 clients connect with clean_session=0, subscribe to a topic of their own at QoS 1 and leave
(their sessions stay in Redis, offline); then one publisher sends `--queued` QoS 1 messages of 64 bytes
spread over those topics, which Redis queues for the offline sessions. Redis' INFO memory (used_memory)
and DBSIZE are read before and after each step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.fleet import Fleet
from tests.integration.mqttraw import PUBACK, RawClient

PAYLOAD = b"x" * 64


def used(fleet: Fleet) -> tuple[int, int]:
    r = fleet.redis
    return int(r.info("memory")["used_memory"]), int(r.command("DBSIZE"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=5000)
    p.add_argument("--queued", type=int, default=20000)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleetmq-capacity-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            err = fleet.ensure(("a",))
            if err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            node = fleet.nodes["a"]
            mem0, keys0 = used(fleet)
            for i in range(args.sessions):
                with RawClient("127.0.0.1", node.port) as c:
                    c.connect(f"cap-{i}", clean=False)
                    c.subscribe([(f"cap/{i}", 1)])
                    c.disconnect()
            mem1, keys1 = used(fleet)
            with RawClient("127.0.0.1", node.port) as pub:
                pub.connect("cap-publisher", clean=True)
                window = 0
                for n in range(args.queued):
                    pub.publish(f"cap/{n % args.sessions}", PAYLOAD, qos=1)
                    window += 1
                    if window == 100:
                        pub.recv_n(window, ptype=PUBACK, timeout=30)
                        window = 0
                if window:
                    pub.recv_n(window, ptype=PUBACK, timeout=30)
                pub.disconnect()
            mem2, _ = used(fleet)
        finally:
            fleet.stop()
    out = {
        "sessions": args.sessions,
        "queued": args.queued,
        "payload_bytes": len(PAYLOAD),
        "bytes_per_session": (mem1 - mem0) / args.sessions,
        "keys_per_session": (keys1 - keys0) / args.sessions,
        "bytes_per_queued_message": (mem2 - mem1) / args.queued,
    }
    print(
        f"Redis memory per offline persistent session (1 QoS 1 subscription): {out['bytes_per_session']:,.0f} B "
        f"({out['keys_per_session']:.1f} keys); per queued QoS 1 message of {len(PAYLOAD)} B: "
        f"{out['bytes_per_queued_message']:,.0f} B ({args.sessions:,} sessions, {args.queued:,} messages)"
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
