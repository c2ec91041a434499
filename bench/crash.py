"""Takeover after a crash: how long a client waits after kill -9 of the node that held its session.

Each repetition: a persistent MQTT 3.1.1 subscriber (QoS 1) on node a, in a zone with the EMQX defaults
(window 32, queue 1,000), receives a publisher's QoS 1 stream at `rate` messages a second through node
b; node a is killed with SIGKILL; the subscriber connects to node b at once. Measured from that CONNECT:
the CONNACK (session present) and the first PUBLISH (a resent or queued message). Then the stream is
drained: every message the publisher got a PUBACK for must arrive (loss), and node b must have dropped
nothing as queue_full. Node a is restarted for the next repetition.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from bench.fleet import Fleet, metric_sum
from tests.integration import mqttraw
from tests.integration.mqttraw import CONNACK, PUBACK, PUBLISH, RawClient

HOST = "127.0.0.1"


class _Stream(threading.Thread):
    """A QoS 1 publisher at a steady rate; remembers which sequence numbers were acknowledged."""

    def __init__(self, port: int, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(HOST, port, version=4)
        self.client.connect(f"crash-pub-{time.monotonic_ns()}")
        self.topic, self.rate = topic, rate
        self.acked: set[int] = set()
        self._pid: dict[int, int] = {}
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        seq = 0
        start = time.monotonic()
        try:
            while not self.stop.is_set():
                due = start + seq / self.rate
                while time.monotonic() < due:
                    self._read(max(0.0, due - time.monotonic()))
                pid = seq % 65535 + 1
                self._pid[pid] = seq
                self.client.send(mqttraw.publish(self.topic, b"%d" % seq, qos=1, packet_id=pid))
                seq += 1
            end = time.monotonic() + 2.0
            while len(self.acked) < seq and time.monotonic() < end:
                self._read(0.05)
        except OSError as e:
            self.error = str(e)
        finally:
            self.client.close()

    def _read(self, timeout: float) -> None:
        p = self.client.recv(timeout)
        if p is not None and p.type == PUBACK:
            self.acked.add(self._pid.pop(p.packet_id))


def _drain(c: RawClient, got: set[int], until: float) -> None:
    while time.monotonic() < until:
        p = c.recv(0.05)
        if p is not None and p.type == PUBLISH:
            got.add(int(p.payload))
            c.ack(p)


def run_crash_takeover(fleet: Fleet, reps: int, rate: float, warmup: int = 1) -> dict[str, Any]:
    connack_ms: list[float] = []
    first_ms: list[float] = []
    lost = drops = 0
    for rep in range(reps + warmup):
        err = fleet.ensure(("a", "b"))
        if err:
            raise RuntimeError(err)
        a, b = fleet.nodes["a"], fleet.nodes["b"]
        cid, topic = f"crash-{time.monotonic_ns()}", f"bench/crash/{time.monotonic_ns()}"
        sub = RawClient(HOST, a.cr_port, version=4)
        sub.connect(cid, clean=False)
        sub.subscribe([(topic, 1)])
        _wait_route(b.cr_port, sub, topic)
        before = metric_sum(b.metrics(), "fleetmq_messages_dropped_total", zone="crash", reason="queue_full")
        stream = _Stream(b.cr_port, topic, rate)
        stream.start()
        got: set[int] = set()
        _drain(sub, got, time.monotonic() + 0.5)
        a.kill()
        sub.close()
        t0 = time.perf_counter()
        back = RawClient(HOST, b.cr_port, version=4)
        back.send(mqttraw.connect(cid, clean=False, version=4))
        ack = back.expect(CONNACK, timeout=10)
        t1 = time.perf_counter()
        assert ack.session_present, "the session did not survive the crash"
        first = back.expect(PUBLISH, timeout=10)
        t2 = time.perf_counter()
        got.add(int(first.payload))
        back.ack(first)
        _drain(back, got, time.monotonic() + 1.0)
        stream.stop.set()
        stream.join(10)
        _drain(back, got, time.monotonic() + 2.0)
        back.close()
        after = metric_sum(b.metrics(), "fleetmq_messages_dropped_total", zone="crash", reason="queue_full")
        if rep >= warmup:
            connack_ms.append((t1 - t0) * 1000)
            first_ms.append((t2 - t0) * 1000)
            lost += len(stream.acked - got)
            drops += int(after - before)
    return {
        "reps": reps,
        "rate": rate,
        "connack_p50_ms": _pct(connack_ms, 50),
        "connack_p99_ms": _pct(connack_ms, 99),
        "first_p50_ms": _pct(first_ms, 50),
        "first_p99_ms": _pct(first_ms, 99),
        "first_max_ms": max(first_ms),
        "lost": lost,
        "queue_full": drops,
    }


def _pct(values: list[float], p: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _wait_route(port: int, sub: RawClient, topic: str, timeout: float = 10.0) -> None:
    """QoS 0 probes through `port` until the subscriber gets one (its route reached that node)."""
    probe = RawClient(HOST, port, version=4)
    probe.connect(f"crash-probe-{time.monotonic_ns()}")
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            probe.send(mqttraw.publish(topic, b"-1", qos=0))
            p = sub.recv(0.05)
            if p is not None and p.type == PUBLISH:
                sub.recv_all(0.2)
                return
        raise RuntimeError("the subscriber's route never reached the other node")
    finally:
        probe.close()
