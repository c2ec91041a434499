"""Memory under clients that read nothing or make up topics (issue 25, item 6), each broker beside the
others: a fresh process with its default limits (EMQX's zone defaults for fleetmq, mosquitto's own).

- `memory-slow-subs`: RETAINED retained messages of RETAINED_SIZE bytes, then three MQTT 3.1.1 clients
  subscribe to `#` (QoS 0, 1, 0), one a second, and never read. RSS peak beyond the baseline plus the
  retained store, SUBACK latency.
- `memory-long-topics`: LONG_TOPICS QoS 1 publishes, each to a distinct topic of LONG_TOPIC_LEN characters,
  with a wildcard subscription present (the router's cache). RSS peak beyond the baseline, and what is
  still held 3 s later.

In both, a health probe (connect, subscribe, publish QoS 1, receive; tests/integration/memclients.py, a
process of its own) runs every 50 ms throughout: its slowest round is the row's latency.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from bench.brokers import Broker, BrokerError
from bench.report import Cell
from tests.integration.memclients import Watch, load_retained, rss, spawn, stalled_subscriber
from tests.integration.mqttraw import RawClient

ROWS = ["memory-slow-subs", "memory-long-topics"]
RETAINED = 20_000
RETAINED_SIZE = 4096
LONG_TOPICS = 8192
LONG_TOPIC_LEN = 65_535
MiB = 2**20


def with_defaults(broker: Broker) -> Broker:
    """The same broker (fleetmq, a baseline checkout, mosquitto) with its own default limits."""
    b = copy.copy(broker)
    b.proc = None
    b.limits = ""  # type: ignore[attr-defined]
    return b


def run_cell(key: str, broker: Broker) -> Cell:
    b = with_defaults(broker)
    try:
        b.start()
    except BrokerError as e:
        return Cell(error=str(e))
    try:
        time.sleep(1.0)
        result = slow_subs(b) if key == "memory-slow-subs" else long_topics(b)
        if not b.alive():
            return Cell(result=result, error=b.exit_reason())
        return Cell(result=result)
    except (OSError, AssertionError) as e:
        return Cell(error=f"{type(e).__name__}: {e}")
    finally:
        b.stop()


def _probe(watch: Watch) -> dict[str, Any]:
    rounds = sorted(watch.rounds)
    return {
        "probe_rounds": len(rounds),
        "probe_max_ms": rounds[-1] * 1000 if rounds else None,
        "probe_p99_ms": rounds[int(len(rounds) * 0.99)] * 1000 if rounds else None,
        "probe_failures": watch.failures[:3],
    }


def slow_subs(b: Broker) -> dict[str, Any]:
    baseline = rss(b.pid)
    load_retained("127.0.0.1", b.port, RETAINED, RETAINED_SIZE)
    loaded = rss(b.pid)
    watch = Watch("127.0.0.1", b.port, b.pid)
    subacks, socks = [], []
    try:
        for qos in (0, 1, 0):
            s, took = stalled_subscriber("127.0.0.1", b.port, qos)
            socks.append(s)
            subacks.append(took * 1000)
            time.sleep(1.0)
        time.sleep(2.0)
    finally:
        watch.stop()
        for s in socks:
            s.close()
    store = RETAINED * RETAINED_SIZE
    return {
        "rss_before_kb": baseline // 1024,
        "rss_loaded_kb": loaded // 1024,
        "rss_peak_kb": watch.peak // 1024,
        "store_kb": store // 1024,
        "grown_mb": (watch.peak - baseline - store) / MiB,
        "suback_ms": subacks,
        **_probe(watch),
    }


def long_topics(b: Broker) -> dict[str, Any]:
    with RawClient("127.0.0.1", b.port) as wild:
        wild.connect("wild")
        wild.subscribe([("elsewhere/+/x", 0)])
        baseline = rss(b.pid)
        watch = Watch("127.0.0.1", b.port, b.pid)
        try:
            t0 = time.monotonic()
            flood = spawn(
                "long-topics", "127.0.0.1", str(b.port), str(LONG_TOPICS), str(LONG_TOPIC_LEN), nice=10
            )
            assert flood.wait(600) == 0, "the publisher did not get every PUBACK"
            took = time.monotonic() - t0
            time.sleep(3.0)
            held = rss(b.pid)
        finally:
            watch.stop()
    return {
        "rss_before_kb": baseline // 1024,
        "rss_peak_kb": watch.peak // 1024,
        "grown_mb": (watch.peak - baseline) / MiB,
        "held_mb": (held - baseline) / MiB,
        "publish_s": took,
        **_probe(watch),
    }
