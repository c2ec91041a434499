"""Clients of the memory-bound scenarios (tests/integration/test_fleetmq_memory.py, bench/memory.py), each in
a process of its own, so no test thread shares its interpreter lock:

    python -m tests.integration.memclients probe HOST PORT
        connect, subscribe, publish QoS 1, receive it, disconnect; again every PROBE_INTERVAL until stdin
        closes, then one JSON line on stdout: {"rounds": [seconds, ...], "failures": [text, ...]}
    python -m tests.integration.memclients long-topics HOST PORT N LENGTH
        N QoS 1 publishes, each to a distinct topic of LENGTH characters, pipelined; exits once all are
        acknowledged (run niced by the caller: a load generator must not starve the broker or the probe)

and, in the caller's process, the broker's RSS, a retained store to load and subscribers that stop reading.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests.integration.mqttraw import PUBACK, PUBLISH, SUBACK, V5, RawClient, connect, publish, subscribe

PROBE_INTERVAL = 0.05
REPO = Path(__file__).resolve().parents[2]


def rss(pid: int) -> int:
    """A process's resident set size, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def spawn(*args: str, nice: int = 0, **kw) -> subprocess.Popen:
    """This module in a process of its own (`nice`: below the broker's priority, for a load generator)."""
    niced = ["nice", "-n", str(nice)] if nice else []
    return subprocess.Popen(
        [*niced, sys.executable, "-m", "tests.integration.memclients", *args], cwd=REPO, **kw
    )


class Watch:
    """A broker's peak RSS (sampled every 20 ms) and the health probe's rounds, from start to stop()."""

    def __init__(self, host: str, port: int, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self.rounds: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self._probe = spawn("probe", host, str(port), stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss(self.pid))
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._sampler.join(10)
        out, _ = self._probe.communicate(b"", timeout=30)
        result = json.loads(out)
        self.rounds, self.failures = result["rounds"], result["failures"]

    def summary(self) -> str:
        top = sorted(round(r * 1000) for r in self.rounds)[-5:]
        return f"probe: {len(self.rounds)} rounds, slowest {top} ms"


def load_retained(host: str, port: int, n: int, size: int, qos: int = 1) -> None:
    """n retained messages of `size` bytes on distinct topics (ret/...), pipelined; returns once all are
    acknowledged."""
    with RawClient(host, port, timeout=30) as c:
        c.connect(f"loader{uuid.uuid4().hex[:10]}")
        payload = b"r" * size
        chunk: list[bytes] = []
        for i in range(n):
            chunk.append(
                publish(f"ret/{i // 100}/{i}", payload, qos=qos, packet_id=i % 65535 + 1, retain=True)
            )
            if len(chunk) == 500:
                c.send(b"".join(chunk))
                chunk.clear()
        c.send(b"".join(chunk) + publish("ret/sync", b"s", qos=1, packet_id=65535))
        want = n * 4 + 4 if qos else 4  # (a PUBACK is 4 bytes)
        got = 0
        c.sock.settimeout(60)
        while got < want:
            data = c.sock.recv(65536)
            assert data, "the broker closed the loader"
            got += len(data)


def stalled_subscriber(host: str, port: int, qos: int, version: int = 4) -> tuple[socket.socket, float]:
    """A client that subscribes to `#`, reads its SUBACK and then nothing more. Returns (socket, seconds
    from SUBSCRIBE to SUBACK)."""
    s = socket.create_connection((host, port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.sendall(connect(f"stalled{uuid.uuid4().hex[:10]}", version=version, keepalive=0))
    buf = b""
    while len(buf) < 4:
        buf += s.recv(4 - len(buf))
    assert buf[0] >> 4 == 2, f"no CONNACK: {buf!r}"
    if version == V5:
        rest = buf[1] + 2 - len(buf)
        while rest > 0:
            rest -= len(s.recv(rest))
    t0 = time.monotonic()
    s.sendall(subscribe(1, [("#", qos)], version=version))
    first = s.recv(2)
    while len(first) < 2:
        first += s.recv(2 - len(first))
    took = time.monotonic() - t0
    assert first[0] >> 4 == SUBACK, f"expected SUBACK first, got {first!r}"
    return s, took


def probe_round(host: str, port: int) -> float:
    topic = f"probe/{uuid.uuid4().hex[:12]}"
    t0 = time.monotonic()
    with RawClient(host, port, timeout=5) as c:
        c.connect(f"probe{uuid.uuid4().hex[:10]}")
        c.subscribe([(topic, 1)])
        c.publish(topic, b"ok", qos=1)
        got = {c.expect_any().type, c.expect_any().type}
        assert got == {PUBACK, PUBLISH}, got
        took = time.monotonic() - t0
        c.disconnect()
    return took


def probe(host: str, port: int) -> None:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rounds: list[float] = []
    failures: list[str] = []
    while not stop.wait(PROBE_INTERVAL):
        try:
            rounds.append(probe_round(host, port))
        except Exception as e:  # (reported to the caller)
            failures.append(repr(e))
    print(json.dumps({"rounds": rounds, "failures": failures}), flush=True)


def long_topics(host: str, port: int, n: int, length: int) -> None:
    with RawClient(host, port, timeout=120) as pub:
        pub.connect(f"long{uuid.uuid4().hex[:10]}")
        chunk: list[bytes] = []
        for i in range(n):
            prefix = f"long/{i}/"
            chunk.append(
                publish(prefix + "t" * (length - len(prefix)), b"p" * 16, qos=1, packet_id=i % 65535 + 1)
            )
            if len(chunk) == 64:
                pub.send(b"".join(chunk))
                chunk.clear()
        pub.send(b"".join(chunk))
        pub.recv_n(n, timeout=300, ptype=PUBACK)


def main() -> int:
    what, host, port, *rest = sys.argv[1:]
    if what == "probe":
        probe(host, int(port))
    elif what == "long-topics":
        long_topics(host, int(port), int(rest[0]), int(rest[1]))
    else:
        print(f"unknown: {what}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
