"""QoS 1 or 2 load through a fleet while broker pods are deleted, and the check that no acked message is lost.

A publisher and a persistent-session subscriber each connect to one broker; at a third and at two thirds of
the messages the subscriber's, then the publisher's broker is deleted. Each reconnects, with the same
client id, to another broker: the subscriber resumes its session from Redis, the publisher sends again what
was not acked (at least once). Every message the publisher got a PUBACK for must reach the subscriber.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import paho.mqtt.client as mqtt


class Endpoint(Protocol):
    """How to reach one broker from here (its pod's address on a real node, a `kubectl port-forward` to it
    elsewhere): host and port (`local`)."""

    host: str
    local: int

    def alive(self) -> bool: ...
    def start(self) -> object: ...


def new_client(client_id: str, *, clean: bool = True, transport: str = "tcp", on_message=None) -> mqtt.Client:
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean,
        protocol=mqtt.MQTTv311,
        transport=transport,
    )
    if transport == "websockets":
        c.ws_set_options(path="/mqtt")
    c.on_message = on_message  # before CONNECT: a resumed session's messages may come at once
    return c


def client(
    port: int,
    client_id: str,
    *,
    host: str = "127.0.0.1",
    clean: bool = True,
    transport: str = "tcp",
    on_message=None,
) -> mqtt.Client:
    c = new_client(client_id, clean=clean, transport=transport, on_message=on_message)
    c.connect(host, port, keepalive=15)
    c.loop_start()
    return c


#: paho's threaded loop watches its sockets with select(), which cannot take a file descriptor of 1024 or
#: more: a client given one connects (the broker opens its session) and then never reads its CONNACK, and
#: says nothing. Tests that open many clients check they stay below this first (fd_room).
SELECT_LIMIT = 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_room(clients: int) -> None:
    """Fail at once, saying why, if `clients` more paho clients (3 descriptors each: the socket and the
    loop's wake-up pair) would take descriptors past SELECT_LIMIT, rather than leave some hanging."""
    gc.collect()  # (closed clients in reference cycles still hold their wake-up pairs)
    have = open_fds()
    if have + 3 * clients >= SELECT_LIMIT - 16:
        raise AssertionError(
            f"{clients} more MQTT clients need {3 * clients} file descriptors and this process has {have} open: "
            f"paho's select() cannot watch descriptors >= {SELECT_LIMIT} (an earlier test leaked clients?)"
        )


def close(c: mqtt.Client | None) -> None:
    """Disconnect and stop the loop thread. (paho 2.2 keeps the loop's wake-up socket pair open until the
    client object is collected: drop the clients too, e2e/conftest.py collects after each test.)"""
    if c is not None:
        c.disconnect()
        c.loop_stop()


class Resilient:
    """An MQTT client that, when its broker goes away, reconnects (same client id) to another one. It is one
    paho client throughout, as a real application's: with a persistent session the client keeps its half of
    the session state (incoming QoS 2 messages waiting for PUBREL) across connections, and a new paho client
    would not have it (the resumed broker's PUBREL would then find nothing to deliver)."""

    def __init__(
        self,
        endpoints: dict[str, Endpoint],
        client_id: str,
        *,
        clean: bool,
        on_message=None,
        subscribe: str | None = None,
        qos: int = 1,
    ):
        self.endpoints, self.client_id, self.clean = endpoints, client_id, clean
        self.on_message, self.subscribe, self.qos = on_message, subscribe, qos
        self.c: mqtt.Client | None = None
        self.broker = ""
        self.lost = threading.Event()
        self.reconnects = 0

    def connect(self, prefer: list[str]) -> None:
        if self.c is None:
            self.c = new_client(self.client_id, clean=self.clean, on_message=self.on_message)
            self.c.on_disconnect = lambda *_: self.lost.set()
        c = self.c
        c.loop_stop()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for name in prefer + [n for n in self.endpoints if n not in prefer]:
                ep = self.endpoints[name]
                try:
                    if not ep.alive():
                        ep.start()
                    self.lost.clear()
                    c.connect(ep.host, ep.local, keepalive=15)
                except (OSError, RuntimeError):
                    continue
                c.loop_start()
                if self.subscribe:
                    c.subscribe(self.subscribe, qos=self.qos)
                self.broker = name
                return
            time.sleep(1)
        raise AssertionError(f"{self.client_id}: no broker to connect to")

    def reconnect(self) -> None:
        self.reconnects += 1
        self.connect([n for n in self.endpoints if n != self.broker])

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> bool:
        """Publish and wait for the fleet's acknowledgement; False (after reconnecting, so the caller
        sends the same message again) when none came."""
        try:
            assert self.c is not None
            info = self.c.publish(topic, payload, qos=qos)
            info.wait_for_publish(timeout=10)
            ok = info.is_published()
        except (RuntimeError, ValueError):
            ok = False
        if not ok:
            self.reconnect()
        return ok


@dataclass(repr=False)
class Result:
    total: int
    acked: set[int]
    received: list[int]
    deleted: list[str]
    seconds: float
    publisher_reconnects: int
    subscriber_reconnects: int
    longest_stall_s: float = 0.0  # the longest time between two acknowledged publishes

    @property
    def lost(self) -> set[int]:
        return self.acked - set(self.received)

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(set(self.received))

    qos: int = 1

    def __str__(self) -> str:
        return (
            f"{self.total} QoS{self.qos} messages in {self.seconds:.1f}s, {len(self.acked)} acked; brokers deleted "
            f"{self.deleted}; publisher reconnects {self.publisher_reconnects}, subscriber reconnects "
            f"{self.subscriber_reconnects}; {len(self.lost)} acked messages lost {sorted(self.lost)[:10]}, "
            f"{self.duplicates} duplicates; acks stalled {self.longest_stall_s:.1f}s at most"
        )

    __repr__ = __str__


def load_with_deletions(
    endpoints: dict[str, Endpoint],
    delete: Callable[[str], None],
    topic: str,
    *,
    total: int = 3000,
    drain_timeout: float = 180.0,
    qos: int = 1,
    faults: dict[int, Callable[[], str]] | None = None,
) -> Result:
    """`total` messages from a publisher to a persistent subscriber, each on a broker of its own; by default
    the subscriber's broker is deleted at a third and the publisher's at two thirds. `faults`: instead, at
    message n, call faults[n] (it names what it broke)."""
    names = list(endpoints)
    received: list[int] = []
    lock = threading.Lock()

    def on_message(_c, _u, msg):
        with lock:
            received.append(int(msg.payload))

    sub = Resilient(
        endpoints, f"load-sub-{topic}", clean=False, on_message=on_message, subscribe=topic, qos=qos
    )
    sub.connect([names[1]])
    pub = Resilient(endpoints, f"load-pub-{topic}", clean=True)
    pub.connect([names[0]])
    time.sleep(1)  # the subscription is in place

    victims = {total // 3: sub, 2 * total // 3: pub}  # first the subscriber's broker, then the publisher's
    if faults is None:
        faults = {n: (lambda v=v: (delete(v.broker), v.broker)[1]) for n, v in victims.items()}
    acked: set[int] = set()
    deleted: list[str] = []
    seq = 0
    t0 = last_ack = time.monotonic()
    stall = 0.0
    try:
        while seq < total:
            if sub.lost.is_set():
                sub.reconnect()
            if (fault := faults.pop(seq, None)) is not None:
                deleted.append(fault())
            if pub.publish(topic, str(seq).encode(), qos):  # (else the same message again)
                acked.add(seq)  # PUBACK (QoS 1) / PUBCOMP (QoS 2): the fleet owns the message
                seq += 1
                now = time.monotonic()
                stall, last_ack = max(stall, now - last_ack), now
        seconds = time.monotonic() - t0
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            if sub.lost.is_set():
                sub.reconnect()
            with lock:
                if acked <= set(received):
                    break
            time.sleep(0.5)
    finally:
        close(pub.c)
        close(sub.c)
    with lock:
        return Result(
            total, acked, list(received), deleted, seconds, pub.reconnects, sub.reconnects, stall, qos
        )
