"""Helpers of the fleet tests (test_fleet_*, and the others that drive raw clients through a fleet): raw MQTT
publishers and subscribers that record exactly what the broker acknowledged and delivered, so a test can
check "nothing acked is lost" and "QoS2 reaches the application once" against real broker processes
sharing one Redis, and the probes and checks built on them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetmq.broker.store.redis_store import SCRIPTS, _script

from tests.integration import mqttraw
from tests.integration.harness import BrokerProc, Client, uid
from tests.integration.mqttraw import (
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    ConnectionClosed,
    MalformedError,
    RawClient,
)
from tests.support import wait_until

SESSION_EXPIRY = 300  # v5 persistent sessions in these tests


def raw_connect(
    bp: BrokerProc,
    cid: str,
    version: int,
    *,
    clean: bool = False,
    expiry: int | None = SESSION_EXPIRY,
    timeout: float = 5.0,
    check: bool = True,
    keepalive: int = 60,
) -> tuple[RawClient, mqttraw.Packet]:
    """A RawClient connected to `bp`; persistent (clean=False, v5 session expiry) by default."""
    c = RawClient(bp.host, bp.port, version=version, timeout=timeout)
    props = {"session_expiry_interval": expiry} if version == 5 and expiry else None
    ack = c.connect(cid, clean=clean, props=props, check=check, timeout=timeout, keepalive=keepalive)
    return c, ack


def seq_payload(tag: str, n: int) -> bytes:
    return f"{tag}:{n:06d}".encode()


def parse_seq(payload: bytes) -> tuple[str, int]:
    tag, _, n = payload.decode().rpartition(":")
    return tag, int(n)


# ------------------------------------------------------------------ subscriber bookkeeping
@dataclass
class AppView:
    """What an MQTT application on top of a raw client sees, across reconnects of one session.

    QoS2 (method B receiver): a PUBLISH is handed to the application when its packet id is not already
    awaiting PUBREL; a resent PUBLISH (same packet id, before PUBREL) is not delivered again.
    """

    delivered: list[bytes] = field(default_factory=list)  # payloads handed to the application, in order
    awaiting_rel: set[int] = field(default_factory=set)  # QoS2 packet ids received, PUBREL not yet seen
    publishes: list[mqttraw.Packet] = field(default_factory=list)  # every PUBLISH seen

    def on_publish(self, p: mqttraw.Packet) -> None:
        self.publishes.append(p)
        if p.qos == 2:
            if p.packet_id in self.awaiting_rel:
                return  # a resend of one already delivered
            self.awaiting_rel.add(p.packet_id)
        self.delivered.append(p.payload)

    def on_pubrel(self, p: mqttraw.Packet) -> None:
        self.awaiting_rel.discard(p.packet_id)


def ack_loop(
    c: RawClient,
    view: AppView,
    *,
    until: int | None = None,
    quiet: float = 1.0,
    timeout: float = 30.0,
    tag: str | None = None,
) -> bool:
    """Receive and fully acknowledge (PUBACK, PUBREC, PUBCOMP) until `until` distinct sequence numbers of
    `tag` were delivered, or nothing arrived for `quiet` seconds, or `timeout`. Returns False if the
    connection closed."""
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < deadline:
        if until is not None and len(distinct(view, tag)) >= until:
            return True
        try:
            p = c.recv(0.1)
        except (ConnectionClosed, MalformedError, OSError):
            return False
        if p is None:
            if until is None and time.monotonic() - last > quiet:
                return True
            continue
        last = time.monotonic()
        try:
            if p.type == PUBLISH:
                view.on_publish(p)
                if p.qos:
                    c.ack(p)
            elif p.type == PUBREL:
                view.on_pubrel(p)
                c.ack(p)
            elif p.type == DISCONNECT:
                return False
        except OSError:
            return False
    return True


def app_deliveries(sub: RawClient, *, quiet: float = 2.0, timeout: float = 15.0) -> list[tuple[str, int]]:
    """The (tag, seq) an application on `sub` is handed (ack_loop) until nothing arrives for `quiet` s."""
    view = AppView()
    ack_loop(sub, view, quiet=quiet, timeout=timeout)
    return [parse_seq(p) for p in view.delivered]


def distinct(view: AppView, tag: str | None = None) -> set[int]:
    out = set()
    for payload in view.delivered:
        t, n = parse_seq(payload)
        if tag is None or t == tag:
            out.add(n)
    return out


# ------------------------------------------------------------------ publishers
def publish_qos2(
    c: RawClient, topic: str, payload: bytes, packet_id: int, *, dup: bool = False, timeout: float = 5.0
) -> None:
    """One QoS 2 PUBLISH through its whole exchange: PUBLISH, PUBREC, PUBREL, PUBCOMP."""
    c.send(mqttraw.publish(topic, payload, qos=2, packet_id=packet_id, dup=dup, version=c.version))
    assert c.expect(PUBREC, timeout).packet_id == packet_id
    c.send(mqttraw.ack(PUBREL, packet_id, version=c.version))
    c.expect(PUBCOMP)


class Publisher(threading.Thread):
    """A raw publisher thread: sends `tag:<seq>` messages at `qos`, at most `window` unacknowledged, and
    records the sequence numbers the broker acknowledged: `acked` = PUBACK (QoS1) / PUBCOMP (QoS2),
    `pubrec` = QoS2 PUBREC (the broker owns the message, docs/design.md "Publisher confirms").

    It stops at `count` messages or at stop(). When its connection ends it does not resend what was not
    acked (that simply is not counted as acked); with `reconnect` it connects again (to the next node of
    `nodes`, clean session) and goes on with new sequence numbers."""

    def __init__(
        self,
        bp: BrokerProc,
        topic: str,
        tag: str,
        qos: int,
        *,
        version: int = 4,
        count: int | None = None,
        window: int = 20,
        rate: float | None = None,
        reconnect: bool = False,
        nodes: list[BrokerProc] | None = None,
    ):
        super().__init__(daemon=True, name=f"pub-{tag}")
        self.bp, self.topic, self.tag, self.qos, self.version = bp, topic, tag, qos, version
        self.count, self.window, self.rate = count, window, rate
        self.reconnect = reconnect
        self.nodes = nodes or [bp]
        self.sent: list[int] = []
        self.acked: set[int] = set()  # PUBACK (QoS1) / PUBCOMP (QoS2) received
        self.pubrec: set[int] = set()  # QoS2: PUBREC received (the broker owns the message)
        self.ack_time: dict[int, float] = {}  # seq -> time.monotonic() of its PUBACK / PUBREC
        self.refused: dict[int, int] = {}  # seq -> v5 reason code >= 0x80
        self.connack_refusals: list[int] = []
        self.connections = 0
        self.closed_reason: str | None = None
        self._halt = threading.Event()
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self._seq = 0

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            i = 0
            while True:
                bp = self.bp if i == 0 else self.nodes[(i - 1) % len(self.nodes)]
                i += 1
                self._run(bp)
                if not self.reconnect or self._halt.is_set() or self._done():
                    return
                time.sleep(0.2)
        except BaseException as e:  # recorded; the test decides
            self.error = e

    def _done(self) -> bool:
        return self.count is not None and self._seq >= self.count

    def _run(self, bp: BrokerProc) -> None:
        try:
            c = RawClient(bp.host, bp.port, version=self.version, timeout=5)
        except OSError as e:
            self.closed_reason = f"connect: {e}"
            return
        try:
            ack_ = c.connect(uid(f"pub-{self.tag}-")[:60], clean=True, check=False)
        except (AssertionError, OSError, ConnectionClosed, MalformedError) as e:
            self.closed_reason = f"connect: {e}"
            c.close()
            return
        if ack_.reason:
            self.connack_refusals.append(ack_.reason)
            c.close()
            return
        self.connections += 1
        self.connected.set()
        pending: dict[int, int] = {}  # packet id -> seq
        pid = 0
        interval = 1.0 / self.rate if self.rate else 0.0
        next_send = time.monotonic()
        try:
            while True:
                done_sending = self._halt.is_set() or self._done()
                if done_sending and not pending:
                    break
                if done_sending and self._halt.is_set():
                    # give outstanding acks a moment, then stop
                    end = time.monotonic() + 3.0
                    while pending and time.monotonic() < end:
                        self._read(c, pending, 0.1)
                    break
                if len(pending) < self.window and not done_sending and time.monotonic() >= next_send:
                    pid = pid % 65535 + 1
                    while pid in pending:
                        pid = pid % 65535 + 1
                    seq = self._seq
                    c.send(
                        mqttraw.publish(
                            self.topic,
                            seq_payload(self.tag, seq),
                            qos=self.qos,
                            packet_id=pid,
                            version=self.version,
                        )
                    )
                    pending[pid] = seq
                    self.sent.append(seq)
                    self._seq += 1
                    next_send = max(next_send + interval, time.monotonic() - 0.1)
                    if len(pending) < self.window and interval == 0:
                        self._read(c, pending, 0.0)
                        continue
                self._read(c, pending, 0.005 if interval else 0.05)
        except (ConnectionClosed, OSError, MalformedError) as e:
            self.closed_reason = str(e) or type(e).__name__
        finally:
            c.close()

    def _read(self, c: RawClient, pending: dict[int, int], timeout: float) -> None:
        while True:
            p = c.recv(timeout)
            if p is None:
                return
            timeout = 0.0
            if p.type == PUBACK and p.packet_id in pending:
                s = pending.pop(p.packet_id)
                if p.reason >= 0x80:
                    self.refused[s] = p.reason
                else:
                    self.acked.add(s)
                    self.ack_time[s] = time.monotonic()
            elif p.type == PUBREC and p.packet_id in pending:
                s = pending[p.packet_id]
                if p.reason >= 0x80:
                    self.refused[s] = p.reason
                    pending.pop(p.packet_id)
                else:
                    self.pubrec.add(s)
                    self.ack_time.setdefault(s, time.monotonic())
                    c.send(mqttraw.ack(PUBREL, p.packet_id, version=self.version))
            elif p.type == PUBCOMP and p.packet_id in pending:
                self.acked.add(pending.pop(p.packet_id))
            elif p.type == DISCONNECT:
                raise ConnectionClosed(f"DISCONNECT {p.reason:#x}")


class Subscriber(threading.Thread):
    """A persistent-session raw subscriber that acknowledges everything (QoS2 fully) and, when its
    connection ends, reconnects (clean=False) to the next node of `nodes`; its AppView spans connections.
    `connects` records (node port, session present, CONNACK reason, seconds to CONNACK)."""

    def __init__(
        self,
        cid: str,
        version: int,
        filters: list[tuple[str, int]],
        nodes: list[BrokerProc],
        *,
        first: BrokerProc | None = None,
    ):
        super().__init__(daemon=True, name=f"sub-{cid}")
        self.cid, self.version, self.filters, self.nodes = cid, version, filters, nodes
        self.first = first or nodes[0]
        self.view = AppView()
        self.connects: list[tuple[int, bool, int, float]] = []
        self.closes = 0
        self.ready = threading.Event()
        self._halt = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.client: RawClient | None = None

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            self.error = e

    def _loop(self) -> None:
        targets = [self.first] + [n for n in self.nodes if n is not self.first]
        i = 0
        subscribed = False
        while not self._halt.is_set():
            bp = targets[i % len(targets)]
            i += 1
            t0 = time.monotonic()
            try:
                c, ack = raw_connect(bp, self.cid, self.version, timeout=10, check=False)
            except (OSError, AssertionError, ConnectionClosed, MalformedError):
                time.sleep(0.2)
                continue
            self.connects.append((bp.port, ack.session_present, ack.reason, time.monotonic() - t0))
            if ack.reason:
                c.close()
                time.sleep(0.3)
                continue
            self.client = c
            try:
                if not subscribed:
                    c.subscribe(self.filters)
                    subscribed = True
                self.ready.set()
                while not self._halt.is_set():
                    p = c.recv(0.1)
                    if p is None:
                        continue
                    with self.lock:
                        if p.type == PUBLISH:
                            self.view.on_publish(p)
                            if p.qos:
                                c.ack(p)
                        elif p.type == PUBREL:
                            self.view.on_pubrel(p)
                            c.ack(p)
                        elif p.type == DISCONNECT:
                            raise ConnectionClosed(f"DISCONNECT {p.reason:#x}")
            except (ConnectionClosed, OSError, MalformedError, AssertionError):
                self.closes += 1
            finally:
                c.close()
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.disconnect()

    def delivered(self, tag: str) -> list[int]:
        with self.lock:
            return [n for t, n in map(parse_seq, self.view.delivered) if t == tag]


def pipeline_publish(
    bp: BrokerProc, topic: str, tag: str, qos: int, n: int, *, version: int = 4, timeout: float = 30.0
) -> set[int]:
    """Publish n messages from one raw connection as fast as the broker acks them (window 100);
    returns the acknowledged sequence numbers (asserts all were acknowledged)."""
    pub = Publisher(bp, topic, tag, qos, version=version, count=n, window=100)
    pub.start()
    pub.join(timeout)
    assert not pub.is_alive(), f"publisher {tag} still running after {timeout}s ({len(pub.acked)} acked)"
    assert pub.error is None, pub.error
    assert pub.acked == set(range(n)), (
        f"only {len(pub.acked)} of {n} acked; refused={pub.refused} closed={pub.closed_reason}"
    )
    return pub.acked


def first_occurrences(payloads: list[bytes], tag: str | None = None) -> list[int]:
    seen: set[int] = set()
    out = []
    for p in payloads:
        t, n = parse_seq(p)
        if (tag is None or t == tag) and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def session_keys(cid: str) -> list[str]:
    tag = f"fmq:{{{cid}}}"
    return [f"{tag}:m", f"{tag}:s", f"{tag}:q", f"{tag}:i", f"{tag}:r"]


def drain(pubs: list, subs: list, *, timeout: float = 30.0) -> None:
    """Stop the publishers, wait until every subscriber has every message acknowledged to them, then stop
    the subscribers; each thread must end without an error."""
    stop_all(pubs, timeout=15)

    def settled() -> bool:
        return all(not (p.acked - set(s.delivered(p.tag))) for s in subs for p in pubs)

    wait_until(settled, timeout=timeout, interval=0.2, msg="every acknowledged message delivered")
    time.sleep(0.5)
    stop_all(subs)


def stop_all(workers: list, timeout: float = 10) -> None:
    """Stop worker threads (Publisher, Subscriber), wait for each, and raise what any of them raised."""
    for w in workers:
        w.stop()
    for w in workers:
        w.join(timeout)
        assert w.error is None, w.error


def will_client(
    node: BrokerProc, cid: str, topic: str, payload: bytes, *, delay: int | None = None
) -> Client:
    """A v5 paho client with a QoS 1 will. Without `delay` the will goes as the connection ends; with one,
    the session outlives the connection (expiry 60 s) and the will waits `delay` s after it ends."""
    will: dict[str, object] = {"topic": topic, "payload": payload, "qos": 1}
    if delay is None:
        return Client(node.host, node.port, cid, version=5, will=will)
    will["props"] = {"WillDelayInterval": delay}
    return Client(node.host, node.port, cid, version=5, clean=False, session_expiry=60, will=will)


# ------------------------------------------------------------------ probes and checks
def wait_route(pub_node: BrokerProc, sub: RawClient, topic: str, timeout: float = 5.0) -> None:
    """Publish QoS0 probes on `pub_node` until `sub` receives one (its route reached that node).
    QoS0 never takes an Inflight Window slot."""
    p = RawClient(pub_node.host, pub_node.port, version=4)
    p.connect(uid("probe-"))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            p.send(mqttraw.publish(topic, b"probe:000000", qos=0))
            got = sub.recv(0.1)
            if got is not None and got.type == PUBLISH and got.payload.startswith(b"probe:"):
                sub.recv_all(0.2)  # the other probes
                return
        raise AssertionError(f"route of {topic!r} never reached {pub_node.port}")
    finally:
        p.disconnect()


def probe_routes(node: BrokerProc, subs: list[Subscriber], topic: str) -> None:
    """Publish QoS0 probes on `node` until every subscriber thread got one (its route reached `node`)."""
    probe = RawClient(node.host, node.port)
    probe.connect(uid("probe-"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(s.delivered("probe") for s in subs):
        probe.publish(topic, b"probe:000000", qos=0)
        time.sleep(0.05)
    probe.disconnect()
    assert all(s.delivered("probe") for s in subs), "routes did not reach every node"


def resend_after_an_unknown_outcome(
    a: BrokerProc,
    b: BrokerProc,
    fault: Callable[[], threading.Event],
    topic: str,
    payload: bytes,
    packet_id: int,
) -> RawClient:
    """A QoS 2 PUBLISH on node `a` whose commit meets `fault` (armed on the Redis proxy once the publisher is
    connected: a cut, a lost reply), so the node cannot know its outcome and must not send PUBREC; then the
    publisher resumes on node `b` and sends it again, as MQTT says it must. Returns that connection."""
    cid = uid("pub")
    pub, _ = raw_connect(a, cid, 5)
    armed = fault()
    pub.send(mqttraw.publish(topic, payload, qos=2, packet_id=packet_id, version=5))
    assert armed.wait(5), "the commit never went through the proxy"
    assert closed_without(pub, PUBREC), "PUBREC for a write whose outcome the node cannot know"
    pub.close()
    pub, ack = raw_connect(b, cid, 5)
    assert ack.session_present
    publish_qos2(pub, topic, payload, packet_id, dup=True)
    return pub


def closed_without(c: RawClient, ptype: int, timeout: float = 5.0) -> bool:
    """True when the connection ends (a v5 DISCONNECT first, or not) before a packet of `ptype` comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            p = c.recv(0.1)
        except (ConnectionClosed, OSError):
            return True
        if p is None:
            continue
        if p.type == ptype:
            return False
        if p.type == DISCONNECT:
            return True
    raise AssertionError(f"neither closed nor got packet type {ptype} within {timeout}s")


def check_delivery(subs: list[Subscriber], pubs: list[Publisher], sub_qos: dict[str, int]) -> list[str]:
    """Every acked message at least once (QoS1) / exactly once (QoS2, where the subscription is QoS2) at
    every subscriber. Returns the problems found (empty = fine)."""
    problems = []
    for s in subs:
        for p in pubs:
            got = s.delivered(p.tag)
            seen = set(got)
            qos = min(p.qos, sub_qos[s.cid])
            lost = sorted(p.acked - seen)
            if lost:
                problems.append(
                    f"{s.cid}: {len(lost)} of {len(p.acked)} messages acked (PUBACK/PUBCOMP) to publisher "
                    f"{p.tag} (QoS{p.qos}) never delivered, e.g. {lost[:8]}"
                )
            if p.qos == 2:
                lost_rec = sorted(p.pubrec - seen - set(lost))
                if lost_rec:
                    problems.append(
                        f"{s.cid}: {len(lost_rec)} QoS2 messages PUBREC'd to {p.tag} (owned by the broker) "
                        f"never delivered, e.g. {lost_rec[:8]}"
                    )
            if qos == 2:
                dups = len(got) - len(seen)
                if dups:
                    problems.append(
                        f"{s.cid}: {dups} QoS2 messages of {p.tag} delivered to the application twice"
                    )
            phantom = seen - set(p.sent)
            if phantom:
                problems.append(f"{s.cid}: got messages never sent by {p.tag}: {sorted(phantom)[:5]}")
    return problems


def out_of_order(subs: list[Subscriber], pubs: list[Publisher]) -> list[str]:
    """The subscribers whose first deliveries of a publisher's messages are not in publish order."""
    return [
        f"{s.cid}: first deliveries of {p.tag} out of order"
        for s in subs
        for p in pubs
        if (got := first_occurrences(s.view.delivered, p.tag)) != sorted(got)
    ]


def start_failover_load(
    nodes: list[BrokerProc], name: str
) -> tuple[list[Subscriber], list[Publisher], dict[str, int]]:
    """The load a store failover is tested under, running on three nodes: two persistent subscribers (QoS 1
    on v3.1.1, QoS 2 on v5) whose routes reach every node, and four publishers at 100/s (QoS 1 and 2, both
    versions) that reconnect to the next node when cut off. Returns (subscribers, publishers, the QoS of
    each subscriber's subscription)."""
    base = uid(f"{name}/")
    subs = [
        Subscriber(uid(f"{name}s1-"), 4, [(base + "/#", 1)], nodes, first=nodes[0]),
        Subscriber(uid(f"{name}s2-"), 5, [(base + "/#", 2)], nodes, first=nodes[1]),
    ]
    sub_qos = {subs[0].cid: 1, subs[1].cid: 2}
    for s in subs:
        s.start()
    for s in subs:
        assert s.ready.wait(15), f"subscriber {s.cid} never connected: {s.connects}"
    probe_routes(nodes[2], subs, base + "/probe")
    pubs = [
        Publisher(bp, f"{base}/q{qos}", f"p{i}q{qos}", qos, version=v, rate=100, window=10, reconnect=True, nodes=nodes)
        for i, (bp, qos, v) in enumerate([(nodes[2], 1, 4), (nodes[0], 2, 5), (nodes[1], 1, 5), (nodes[2], 2, 4)])
    ]  # fmt: skip
    for p in pubs:
        p.start()
    return subs, pubs, sub_qos


def sha(script: str) -> bytes:
    """The SHA1 digest (EVALSHA's name) of the store's Lua script `script`, as Redis prints it."""
    return hashlib.sha1(_script(SCRIPTS[script]).encode()).hexdigest().encode()


# -- the management API (tests/integration/test_api.py, test_console.py) ----------------------------
def apikey(keys: Path, name: str, role: str) -> str:
    """A key made as a user makes one: the CLI prints it on its last line."""
    out = subprocess.run([sys.executable, "-m", "fleetmq.broker", "apikey", str(keys), name, "--role", role],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return out.strip().splitlines()[-1]


def call(bp: BrokerProc, method: str, path: str, key: str | None, body: Any = None) -> tuple[int, Any, str]:
    """(status, JSON answer or None, content type)."""
    req = urllib.request.Request(f"http://{bp.host}:{bp.ports['api']}{path}", method=method)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=10) as r:
            raw, status, ctype = r.read(), r.status, r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        raw, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
    return status, json.loads(raw) if raw else None, ctype.split(";")[0]
