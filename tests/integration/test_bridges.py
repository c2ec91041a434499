"""Bridges to a remote broker (issue 16), against mosquitto started here with persistence on: the fleet's
nodes run on a real redis-server; clients are paho."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from fleetmq.broker.codec import Connect, Parser, Publish
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.integration.harness import MOSQUITTO, start_mosquitto, uid
from tests.support import TcpServer, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")]


@pytest.fixture
def remote(tmp_path):
    bp = start_mosquitto(tmp_path / "remote", persistence=True)
    yield bp
    bp.stop()


class Collector:
    """A paho v5 subscriber at the remote: every message with its topic, QoS and user properties."""

    def __init__(self, host: str, port: int, topic_filter: str, client_id: str | None = None) -> None:
        """`client_id`: a persistent session (kept an hour), so what arrives while it is away waits."""
        self.got: list[tuple[str, bytes, int, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or uid("col-"), protocol=mqtt.MQTTv5
        )
        self.c.on_message = self._on_message
        self.c.reconnect_delay_set(min_delay=0.1, max_delay=0.5)  # (it follows a restarting broker)
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *a: subscribed.set()
        props = None
        if client_id:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
        self.c.connect(host, port, clean_start=client_id is None, properties=props)
        self.c.loop_start()
        self.c.subscribe(topic_filter, qos=2)
        assert subscribed.wait(10)

    def _on_message(self, _c, _u, m) -> None:
        props = dict(getattr(m.properties, "UserProperty", []) or [])
        with self.lock:
            self.got.append((m.topic, m.payload, m.qos, props))

    def payloads(self, topic: str) -> list[bytes]:
        """What arrived on `topic`, in arrival order (repeats included)."""
        with self.lock:
            return [p for t, p, _q, _pr in self.got if t == topic]

    def has_all(self, topic: str, payloads: list[bytes]) -> bool:
        return set(self.payloads(topic)) >= set(payloads)

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


class Tap:
    """A TCP relay in front of the remote that decodes what the bridge sends: the order in which the
    bridge published (mosquitto itself may reorder its deliveries when more than one is in flight, as
    its max_inflight_messages documentation says), with the time of each PUBLISH."""

    def __init__(self, upstream) -> None:
        self.upstream = upstream
        self.sent: list[tuple[float, str, bytes, bool]] = []  # (time, topic, payload, dup)
        self.opened: list[float] = []  # when each connection from the bridge came
        self._srv = TcpServer(self._opened)
        self.host, self.port = self._srv.host, self._srv.port

    def _opened(self, down: socket.socket) -> None:
        self.opened.append(time.monotonic())
        threading.Thread(target=self._serve, args=(down,), daemon=True).start()

    def _serve(self, down: socket.socket) -> None:
        try:
            up = socket.create_connection((self.upstream.host, self.upstream.port), timeout=2)
            up.settimeout(None)
        except OSError:  # the remote is down: so is this connection
            down.close()
            return
        threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()
        self._pump(down, up, True)

    def _pump(self, src: socket.socket, dst: socket.socket, decode: bool) -> None:
        parser = Parser(version=5)
        try:
            while data := src.recv(65536):
                if decode:
                    now = time.monotonic()
                    for p in parser.feed(data):
                        if isinstance(p, Publish):
                            self.sent.append((now, p.topic, bytes(p.payload), p.dup))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._srv.close()


def _publisher(bp, version=mqtt.MQTTv5) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=uid("pub-"), protocol=version)
    c.connect(bp.host, bp.port)
    c.loop_start()
    return c


def test_forwarding_maps_topics_caps_qos_adds_properties_over_one_connection(fleet, remote):
    """1,000 messages at each QoS, published over the fleet's nodes, reach the remote under their mapped
    topics, at QoS min(published, maxQos), with the bridge's user property; the remote sees one
    connection of the bridge."""
    bridge = {
        "name": "cloud",
        "remote": {"host": remote.host, "port": remote.port, "peer_id": "cloud"},
        "forwards": [
            {"filter": "up/q2/#", "destination": "site1/{#}", "user_properties": {"site": "1"}},
            {"filter": "up/capped/#", "destination": "site1/c/{3-#}", "max_qos": 1},
        ],
    }
    nodes = fleet(3, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})
    col = Collector(remote.host, remote.port, "site1/#")
    pubs = [_publisher(bp) for bp in nodes]
    try:
        n = 1000
        infos = []
        for i in range(n):
            for qos in (0, 1, 2):
                infos.append(pubs[i % 3].publish(f"up/q2/{qos}", f"{qos}:{i}".encode(), qos=qos))
            infos.append(pubs[i % 3].publish("up/capped/x/y", f"c:{i}".encode(), qos=2))
        for info in infos:
            info.wait_for_publish(30)
        wait_until(lambda: len(col.got) >= 4 * n - 50, timeout=60, msg="the remote got the messages")
        time.sleep(1.0)
    finally:
        for p in pubs:
            p.loop_stop()
            p.disconnect()
        col.stop()
    by_topic: dict[str, list] = {}
    for topic, payload, qos, props in col.got:
        by_topic.setdefault(topic, []).append((payload, qos, props))
    for qos in (1, 2):  # QoS 0 is best effort; QoS 1 and 2 are all there, QoS 2 once
        got = by_topic[f"site1/up/q2/{qos}"]
        payloads = [p for p, _q, _props in got]
        assert set(payloads) == {f"{qos}:{i}".encode() for i in range(n)}
        assert {q for _p, q, _props in got} == {qos}
        assert all(
            props.get("site") == "1" and props.get("fmq-bridge-path") == "edge" for _p, _q, props in got
        )
    assert len(by_topic["site1/up/q2/2"]) == n  # exactly once
    assert len(by_topic["site1/up/q2/0"]) >= 0.9 * n
    capped = by_topic["site1/c/x/y"]
    assert {q for _p, q, _props in capped} == {1} and len({p for p, _q, _props in capped}) == n
    log = remote.log_path.read_text()
    assert len(re.findall(r"New client connected .* as edge-cloud", log)) == 1, "one bridge connection"
    # the forward latency: one observation per QoS 1/2 message the remote acknowledged (the leader's)
    acked = sum(bp.metric("fleetmq_bridge_messages_forwarded_total", bridge="cloud") for bp in nodes)
    timed = sum(bp.metric("fleetmq_bridge_forward_latency_seconds_count", bridge="cloud") for bp in nodes)
    total = sum(bp.metric("fleetmq_bridge_forward_latency_seconds_sum", bridge="cloud") for bp in nodes)
    assert timed == 3 * n and acked >= timed, (timed, acked)
    assert 0 < total / timed < 5.0, total / timed


def _bridge(remote, **kw) -> dict:
    cfg = {
        "name": "cloud",
        "remote": {"host": remote.host, "port": remote.port, "peer_id": "cloud"},
        "forwards": [{"filter": "up/#", "destination": "site1/{#}"}],
        "reconnect": {"initial_delay": "200ms", "max_delay": "2s", "stable_after": "5s"},
    }
    cfg.update(kw)
    return cfg


def _leader(redis_server, nodes):
    holder = redis_server.command("GET", "fmq:{$bridge:cloud}:lease", decode=True)
    return next(bp for bp in nodes if bp.config_path and f"node_id: {holder}" in bp.config_path.read_text())


def _publish_all(client, topic: str, payloads: list[bytes], qos: int) -> None:
    infos = [client.publish(topic, p, qos=qos) for p in payloads]
    for info in infos:
        info.wait_for_publish(120)


@pytest.mark.timeout(600)
def _leader_stopped_midway(fleet, remote, redis_server, n: int, stop) -> tuple[Tap, Collector, float]:
    """n QoS 1 + n QoS 2 published on the two other nodes of a fleet of 3, the bridge's leader stopped by
    `stop(leader)` once the bridge sent n; returns the tap, the remote's collector (with everything
    acknowledged in it) and when the leader was stopped."""
    tap = Tap(remote)
    nodes = fleet(3, None, {"event_log": {"fleet": "edge"}, "bridges": [_bridge(tap)]})
    col = Collector(remote.host, remote.port, "site1/#")
    wait_until(lambda: redis_server.command("GET", "fmq:{$bridge:cloud}:lease"), timeout=15, msg="a leader")
    leader = _leader(redis_server, nodes)
    others = [bp for bp in nodes if bp is not leader]
    every = [f"{i:06d}".encode() for i in range(n)]
    pubs = [_publisher(bp) for bp in others]  # (a publisher on the leader would lose its connection too)
    try:
        threads = [
            threading.Thread(target=_publish_all, args=(pubs[q - 1], f"up/q{q}", every, q)) for q in (1, 2)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: len(tap.sent) >= n, timeout=120, msg="half of the messages sent by the bridge")
        stopped_at = time.monotonic()
        stop(leader)
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "publishers not acknowledged"
        wait_until(
            lambda: all(col.has_all(f"site1/up/q{q}", every) for q in (1, 2)),
            timeout=120,
            msg="every acknowledged message at the remote",
        )
        time.sleep(2.0)
    finally:
        for p in pubs:
            p.loop_stop()
            p.disconnect()
        col.stop()
        tap.close()
    return tap, col, stopped_at


def _resumed_after(tap: Tap, stopped_at: float, how: str) -> None:
    """Forwarding resumed (the next leader's first send) within 8 s of the leader stopping."""
    reopened = min(t for t in tap.opened if t > stopped_at)  # the new leader's connection
    resumed = min((t for t, *_ in tap.sent if t > reopened), default=float("inf")) - stopped_at
    print(f"bridge: forwarding resumed {resumed:.2f}s after {how}")
    assert resumed < 8.0, f"forwarding resumed {resumed:.1f}s after {how}"


def test_the_leader_killed_midway_loses_nothing_acknowledged_and_qos2_stays_exactly_once(
    fleet, remote, redis_server
):
    """kill -9 of the forwarding node at message 5,000 of 10,000 QoS 1 + 10,000 QoS 2: every message
    acknowledged to its publisher reaches the remote, QoS 2 exactly once, first arrivals in publish
    order per topic (as the bridge sent them), and forwarding resumes within 8 s."""
    n = 10_000
    tap, col, killed_at = _leader_stopped_midway(fleet, remote, redis_server, n, lambda bp: bp.kill())
    for q in (1, 2):
        first = list(dict.fromkeys(int(p) for _t, topic, p, _d in tap.sent if topic == f"site1/up/q{q}"))
        bad = next((i for i in range(1, len(first)) if first[i] < first[i - 1]), None)
        around = first[bad - 5 : bad + 12] if bad is not None else []
        assert bad is None and len(first) == n, f"QoS {q}: first sends out of order ({around}) or missing"
    q2 = col.payloads("site1/up/q2")
    assert len(q2) == n, f"QoS 2 duplicates at the remote: {len(q2) - n}"
    _resumed_after(tap, killed_at, "the leader was killed")


def test_the_leader_stopped_gracefully_hands_over_without_sending_anything_twice(fleet, remote, redis_server):
    """SIGTERM of the forwarding node at message 2,500 of 5,000 QoS 1 + 5,000 QoS 2: it waits for the
    remote's acks before it hands over (docs/design.md "Bridges"), so the bridge sends no message twice, not
    even QoS 1; everything arrives once and another node forwards within a few seconds."""
    n = 5_000

    def sigterm(bp) -> None:
        assert bp.terminate() == 0, "the leader did not stop cleanly"

    tap, col, stopped_at = _leader_stopped_midway(fleet, remote, redis_server, n, sigterm)
    for q in (1, 2):
        sent = [int(p) for _t, topic, p, _d in tap.sent if topic == f"site1/up/q{q}"]
        assert sorted(sent) == list(range(n)), f"QoS {q}: {len(sent) - len(set(sent))} sent twice"
        assert sent == sorted(sent), f"QoS {q}: sent out of order"
        assert len(col.payloads(f"site1/up/q{q}")) == n, f"QoS {q}: repeats at the remote"
    _resumed_after(tap, stopped_at, "SIGTERM to the leader")


def test_queued_with_the_remote_down_survives_every_node_restarting(fleet, tmp_path, redis_server):
    """The remote down from the start: 5,000 QoS 1 + 5,000 QoS 2 are queued in the bridge's session;
    every node restarted (SIGTERM, then again with kill -9); the remote started: all 10,000 arrive,
    QoS 2 once, and the bridge's queue ends empty."""
    # the remote's subscriber has a persistent session there, made before the remote goes down
    rem = start_mosquitto(tmp_path / "remote", persistence=True)
    Collector(rem.host, rem.port, "site1/#", client_id="col-restart").stop()
    rem.stop()
    nodes = fleet(3, None, {"event_log": {"fleet": "edge"}, "bridges": [_bridge(rem)]})
    wait_until(lambda: redis_server.command("EXISTS", "fmq:{$bridge:cloud}:s"), timeout=15,
               msg="the bridge's session in the store")  # fmt: skip
    n = 5000
    pubs = [_publisher(bp) for bp in nodes[:2]]
    try:
        threads = [
            threading.Thread(target=_publish_all, args=(pubs[q - 1], f"up/q{q}", [f"{i:06d}".encode() for i in range(n)], q))
            for q in (1, 2)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for p in pubs:
            p.loop_stop()
            p.disconnect()
    for bp in nodes:
        bp.restart()  # SIGTERM
    for bp in nodes:
        bp.kill()
    for bp in nodes:
        bp.restart()
    rem = start_mosquitto(tmp_path / "remote", persistence=True, port=rem.port)
    try:
        col = Collector(rem.host, rem.port, "site1/#", client_id="col-restart")
        wait_until(lambda: len({(t, p) for t, p, _q, _pr in col.got}) >= 2 * n, timeout=90,
                   msg="every queued message at the remote")  # fmt: skip
        time.sleep(2.0)
        col.stop()
    finally:
        rem.stop()
    for q in (1, 2):
        got = set(col.payloads(f"site1/up/q{q}"))
        assert got == {f"{i:06d}".encode() for i in range(n)}
    assert len([1 for t, *_ in col.got if t == "site1/up/q2"]) == n, "QoS 2 duplicates"
    assert redis_server.command("LLEN", "fmq:{$bridge:cloud}:q") == 0


@pytest.mark.parametrize(("overflow", "kept"), [("dropOldest", range(4000, 5000)), ("dropNew", range(1000))])
def test_a_full_queue_drops_by_its_overflow_policy_and_counts_every_drop(
    fleet, tmp_path, redis_server, overflow, kept
):
    """Queue length 1,000, the remote down, 5,000 published: dropOldest delivers 4,001-5,000, dropNew
    1-1,000, and either counts 4,000 queue_full drops."""
    rem = start_mosquitto(tmp_path / "remote", persistence=True)
    Collector(rem.host, rem.port, "site1/#", client_id="col-bounded").stop()
    rem.stop()
    queue = {"max_length": 1000, "overflow": overflow}
    nodes = fleet(2, None, {"event_log": {"fleet": "edge"}, "bridges": [_bridge(rem, queue=queue)]})
    wait_until(lambda: redis_server.command("EXISTS", "fmq:{$bridge:cloud}:s"), timeout=15,
               msg="the bridge's session in the store")  # fmt: skip
    every = [f"{i:06d}".encode() for i in range(5000)]
    pubs = [_publisher(bp) for bp in nodes]
    try:
        for i, pub in enumerate(pubs):  # over both nodes, one after the other: the order is known
            _publish_all(pub, "up/q1", every[i * 2500 : (i + 1) * 2500], 1)
    finally:
        for p in pubs:
            p.loop_stop()
            p.disconnect()

    def dropped() -> float:
        return sum(bp.metric("fleetmq_bridge_messages_dropped_total", bridge="cloud", reason="queue_full")
                   for bp in nodes)  # fmt: skip

    assert dropped() == 4000
    assert redis_server.command("LLEN", "fmq:{$bridge:cloud}:q") == 1000
    rem = start_mosquitto(tmp_path / "remote", persistence=True, port=rem.port)
    try:
        col = Collector(rem.host, rem.port, "site1/#", client_id="col-bounded")
        wanted = [every[i] for i in kept]
        wait_until(lambda: col.has_all("site1/up/q1", wanted), timeout=60, msg="the kept messages")
        time.sleep(1.0)
        col.stop()
    finally:
        rem.stop()
    assert sorted(set(col.payloads("site1/up/q1"))) == wanted  # (mosquitto may reorder in-flight ones)
    assert dropped() == 4000


@pytest.mark.parametrize("store_qos0", [False, True])
def test_persist_false_sends_qos0_and_keeps_what_comes_in_an_outage_only_with_store_qos0(
    fleet, tmp_path, redis_server, store_qos0
):
    """persist: false: QoS 1 and 2 published on either node reach the remote as QoS 0, and each node says
    so once in its log. While the remote is away, what comes for it is dropped and counted (not_persisted),
    unless queue.storeQos0 keeps it in the store until the remote is back."""
    remote_dir = tmp_path / "remote"
    rem = start_mosquitto(remote_dir, persistence=True, queue_qos0=True)  # (QoS 0 waits for the collector)
    col = Collector(rem.host, rem.port, "site1/#", client_id=uid("np-"))
    bridge = _bridge(rem, persist=False, queue={"store_qos0": store_qos0})
    nodes = fleet(2, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})

    def connected() -> float:
        return sum(bp.metric("fleetmq_bridge_connected", bridge="cloud") for bp in nodes)

    def dropped() -> float:
        return sum(bp.metric("fleetmq_bridge_messages_dropped_total", bridge="cloud", reason="not_persisted")
                   for bp in nodes)  # fmt: skip

    pubs = [_publisher(bp) for bp in nodes]
    live = [f"live-{i:04d}".encode() for i in range(200)]
    away = [f"away-{i:04d}".encode() for i in range(50)]
    try:
        wait_until(lambda: connected() == 1, timeout=20, msg="the bridge connected")
        _publish_all(pubs[0], "up/q1", live[:100], 1)
        _publish_all(pubs[1], "up/q2", live[100:], 2)
        wait_until(lambda: col.has_all("site1/up/q1", live[:100]) and col.has_all("site1/up/q2", live[100:]),
                   timeout=30, msg="the messages at the remote")  # fmt: skip
        assert {q for _t, _p, q, _pr in col.got} == {0}
        for bp in nodes:
            assert bp.log().count("persist is false") == 1, bp.log()[-2000:]
        rem.stop()
        wait_until(lambda: connected() == 0, timeout=10, msg="the bridge saw the remote go")
        _publish_all(pubs[0], "up/away", away[:25], 1)
        _publish_all(pubs[1], "up/away", away[25:], 2)
        if store_qos0:
            wait_until(lambda: redis_server.command("LLEN", "fmq:{$bridge:cloud}:q") == 50, timeout=10,
                       msg="what came meanwhile queued in the store")  # fmt: skip
        else:
            wait_until(lambda: dropped() == 50, timeout=10, msg="what came meanwhile dropped and counted")
        rem = start_mosquitto(remote_dir, persistence=True, queue_qos0=True, port=rem.port)
        wait_until(lambda: connected() == 1, timeout=20, msg="the bridge back")
        _publish_all(pubs[0], "up/after", [b"marker"], 1)  # (sent after anything the bridge still had)
        wait_until(lambda: col.payloads("site1/up/after"), timeout=30, msg="the marker at the remote")
        if store_qos0:
            wait_until(lambda: col.has_all("site1/up/away", away), timeout=10, msg="the kept messages")
    finally:
        for pub in pubs:
            pub.loop_stop()
            pub.disconnect()
        col.stop()
        rem.stop()
    assert sorted(col.payloads("site1/up/away")) == (away if store_qos0 else [])
    assert dropped() == (0 if store_qos0 else 50)
    assert redis_server.command("LLEN", "fmq:{$bridge:cloud}:q") == 0


def test_a_bridge_changed_live_forwards_under_its_new_destination_and_a_removed_one_stops(
    fleet, remote, redis_server
):
    """The broker reloads its config file: a changed bridge restarts with its new settings (its session,
    and what is queued in it, kept); a removed one stops forwarding, and its session ends."""
    import yaml

    (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": [_bridge(remote)]})
    col = Collector(remote.host, remote.port, "#")
    pub = _publisher(bp)

    def rewrite(change) -> None:
        cfg = yaml.safe_load(bp.config_path.read_text())
        change(cfg)
        bp.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def sent(topic: str, payload: bytes) -> bool:
        return any(t == topic and p == payload for t, p, _q, _pr in col.got)

    try:
        pub.publish("up/a", b"1", qos=1).wait_for_publish(10)
        wait_until(lambda: sent("site1/up/a", b"1"), timeout=15, msg="forwarded under site1/")
        rewrite(lambda c: c["bridges"][0]["forwards"][0].update(destination="site2/{2-#}"))
        wait_until(lambda: "bridge cloud: changed" in bp.log(), timeout=15, msg="the bridge restarted")
        pub.publish("up/a", b"2", qos=1).wait_for_publish(10)
        wait_until(lambda: sent("site2/a", b"2"), timeout=15, msg="forwarded under the new destination")
        rewrite(lambda c: c.update(bridges=[]))
        wait_until(lambda: "bridge cloud: removed" in bp.log(), timeout=15, msg="the bridge removed")
        wait_until(lambda: not redis_server.command("EXISTS", "fmq:{$bridge:cloud}:m"), timeout=10,
                   msg="the bridge's session ended")  # fmt: skip
        pub.publish("up/a", b"3", qos=1).wait_for_publish(10)
        time.sleep(2.0)
        assert not any(p == b"3" for _t, p, _q, _pr in col.got)
    finally:
        pub.loop_stop()
        pub.disconnect()
        col.stop()


#: how long the proxy holds a node's attempt to take a bridge's lease (SET NX): no node leads it meanwhile
SLOW_LEASE = 8.0


def _arrived(col: Collector, topic: str, payload: bytes) -> bool:
    with col.lock:
        return any(t == topic and p == payload for t, p, _q, _pr in col.got)


def test_a_publish_acknowledged_as_a_node_starts_is_forwarded_though_no_node_leads_the_bridge_yet(
    fleet, remote, redis_proxy
):
    """A node accepts publishes only once the bridge's forwards are routed: a fresh fleet of 2 whose
    attempts to take the bridge's lease take 8 s gets a QoS 1 message through each node as soon as it
    listens, before any node leads: both are acknowledged, so both reach the remote once one does.
    Then the other node restarts, the session parked in Redis: it routes from the fleet's route table,
    so what it acknowledges at once is queued and forwarded, and the leader's link is left alone."""
    redis_proxy.delay(SLOW_LEASE, b":lease", b"NX")
    nodes = fleet(2, None, {"bridges": [_bridge(remote)]}, redis_url=redis_proxy.url)
    col = Collector(remote.host, remote.port, "site1/#")
    pubs = [_publisher(bp) for bp in nodes]
    try:
        for i, pub in enumerate(pubs):
            pub.publish("up/start", f"node-{i}".encode(), qos=1).wait_for_publish(10)
        assert not any(bp.metric("fleetmq_bridge_leader", bridge="cloud") for bp in nodes), "led already"
        for i in range(2):
            wait_until(lambda i=i: _arrived(col, "site1/up/start", f"node-{i}".encode()), timeout=30,
                       msg=f"the message acknowledged by node-{i} at the remote")  # fmt: skip
        leader = next(bp for bp in nodes if bp.metric("fleetmq_bridge_leader", bridge="cloud"))
        other = next(bp for bp in nodes if bp is not leader)
        k = nodes.index(other)
        pubs[k].loop_stop()
        pubs[k].disconnect()
        other.restart()  # (SIGTERM, then the same command line)
        pubs[k] = _publisher(other)
        pubs[k].publish("up/restart", b"1", qos=1).wait_for_publish(10)
        wait_until(lambda: _arrived(col, "site1/up/restart", b"1"), timeout=15,
                   msg="the message acknowledged by the restarted node at the remote")  # fmt: skip
        assert leader.metric("fleetmq_bridge_reconnects_total", bridge="cloud") == 0, "the link was bumped"
        assert leader.metric("fleetmq_bridge_connected", bridge="cloud") == 1
    finally:
        for p in pubs:
            p.loop_stop()
            p.disconnect()
        col.stop()


def test_a_bridge_added_or_changed_by_a_reload_forwards_what_is_acknowledged_once_it_applied(
    fleet, remote, redis_proxy
):
    """A reload applies once the forwards of a bridge it adds or changes are routed: with the lease slow
    to take (the bridge led 8 s later), a QoS 1 message published as soon as the node says the config
    applied reaches the remote, under a bridge added live and under a forward added to it live."""
    import yaml

    (bp,) = fleet(1, None, None, redis_url=redis_proxy.url)
    col = Collector(remote.host, remote.port, "site1/#")
    pub = _publisher(bp)
    redis_proxy.delay(SLOW_LEASE, b":lease", b"NX")

    def reload(change) -> None:
        applied = len(re.findall(r"config \w+ applied", bp.log()))
        cfg = yaml.safe_load(bp.config_path.read_text())
        change(cfg)
        bp.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        wait_until(lambda: len(re.findall(r"config \w+ applied", bp.log())) > applied, timeout=30,
                   msg="the config applied")  # fmt: skip

    try:
        reload(lambda c: c.update(bridges=[_bridge(remote)]))
        pub.publish("up/a", b"added", qos=1).wait_for_publish(10)
        reload(lambda c: c["bridges"][0]["forwards"].append({"filter": "down/#", "destination": "site1/{#}"}))
        pub.publish("down/a", b"changed", qos=1).wait_for_publish(10)
        assert not bp.metric("fleetmq_bridge_connected", bridge="cloud"), "the bridge connected already"
        wait_until(lambda: _arrived(col, "site1/up/a", b"added"), timeout=30,
                   msg="the message published once the bridge was added, at the remote")  # fmt: skip
        wait_until(lambda: _arrived(col, "site1/down/a", b"changed"), timeout=30,
                   msg="the message published once the forward changed, at the remote")  # fmt: skip
    finally:
        pub.loop_stop()
        pub.disconnect()
        col.stop()


def test_two_fleets_bridged_both_ways_deliver_each_message_once_and_stop_the_loop(fleet, tmp_path):
    """Fleet fa forwards shared/# to fleet fb and fb forwards shared/# to fa: a message published on either
    reaches each subscriber once; going back where it came from is dropped (the path property) and
    counted, and the forward counters stay flat once publishing stops."""
    from tests.integration import harness
    from tests.support import RedisServer

    rb = RedisServer(tmp_path / "redis-b")
    b_nodes = []
    try:
        (a,) = fleet(1, None, {"event_log": {"fleet": "fa"}})
        b = harness.start_fleetmq(
            tmp_path / "fb",
            {"node_id": "fb-0", "store": {"kind": "redis", "url": rb.url}, "event_log": {"fleet": "fb"}},
        )
        b_nodes.append(b)

        def to(peer, name: str) -> dict:
            return {
                "name": name,
                "remote": {"host": peer.host, "port": peer.port, "peer_id": name},
                "forwards": [{"filter": "shared/#"}],
                "reconnect": {"initial_delay": "200ms", "max_delay": "1s"},
            }

        import yaml

        for node, peer, name in ((a, b, "fb"), (b, a, "fa")):
            cfg = yaml.safe_load(node.config_path.read_text())
            cfg["bridges"] = [to(peer, name)]
            node.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        for node, name in ((a, "fb"), (b, "fa")):
            wait_until(lambda node=node, name=name: node.metric("fleetmq_bridge_connected", bridge=name) == 1,
                       timeout=20, msg=f"bridge to {name} connected")  # fmt: skip
        subs = {"fa": Collector(a.host, a.port, "shared/#"), "fb": Collector(b.host, b.port, "shared/#")}
        pubs = {"fa": _publisher(a), "fb": _publisher(b)}
        n = 200
        try:
            for i in range(n):
                for origin, pub in pubs.items():
                    pub.publish(f"shared/{origin}", f"{origin}:{i}".encode(), qos=1).wait_for_publish(10)
            wait_until(
                lambda: all(len(c.got) >= 2 * n for c in subs.values()), timeout=30, msg="every message"
            )
            time.sleep(2.0)
            forwarded = {name: node.metric("fleetmq_bridge_messages_forwarded_total", bridge=name)
                         for node, name in ((a, "fb"), (b, "fa"))}  # fmt: skip
            time.sleep(10.0)
            for fleet_name, c in subs.items():
                payloads = [p for _t, p, _q, _pr in c.got]
                assert len(payloads) == 2 * n == len(set(payloads)), (
                    f"{fleet_name}: {len(payloads)} deliveries"
                )
            for node, name in ((a, "fb"), (b, "fa")):
                assert (
                    node.metric("fleetmq_bridge_messages_forwarded_total", bridge=name)
                    == forwarded[name]
                    == n
                )
                assert node.metric("fleetmq_bridge_messages_dropped_total", bridge=name, reason="loop") == n
        finally:
            for c in subs.values():
                c.stop()
            for p in pubs.values():
                p.loop_stop()
                p.disconnect()
    finally:
        for bp in b_nodes:
            bp.stop()
        rb.stop()


@pytest.mark.timeout(300)
def test_ingress_survives_the_leader_killed_midway(fleet, remote, redis_server):
    """1,000 QoS 1 and QoS 2 messages published on the remote, the leading node killed midway: all reach a
    persistent subscriber of the fleet, QoS 2 once, and nothing is echoed back to the remote."""
    bridge = _bridge(remote, forwards=[], subscriptions=[{"filter": "down/#", "destination": "local/{2-#}"}])
    nodes = fleet(3, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})
    wait_until(lambda: redis_server.command("GET", "fmq:{$bridge:cloud}:lease"), timeout=15, msg="a leader")
    leader = _leader(redis_server, nodes)
    home = next(bp for bp in nodes if bp is not leader)
    local = Collector(home.host, home.port, "local/#", client_id=uid("app-"))
    echo = Collector(remote.host, remote.port, "#")
    wait_until(lambda: nodes[0].metric("fleetmq_bridge_connected", bridge="cloud")
               + nodes[1].metric("fleetmq_bridge_connected", bridge="cloud")
               + nodes[2].metric("fleetmq_bridge_connected", bridge="cloud") == 1, timeout=20,
               msg="the bridge connected")  # fmt: skip
    pub = _publisher(remote)
    n = 500
    every = [f"{i:06d}".encode() for i in range(n)]
    try:
        infos = []
        for i, payload in enumerate(every):
            for q in (1, 2):
                infos.append(pub.publish(f"down/q{q}", payload, qos=q))
            if i == n // 2:
                wait_until(lambda: len(local.got) >= n // 2, timeout=30, msg="half at the fleet")
                leader.kill()
        for info in infos:
            info.wait_for_publish(60)
        wait_until(
            lambda: all(local.has_all(f"local/q{q}", every) for q in (1, 2)),
            timeout=60,
            msg="every message at the fleet's subscriber",
        )
        time.sleep(2.0)
    finally:
        pub.loop_stop()
        pub.disconnect()
        local.stop()
        echo.stop()
    q2 = local.payloads("local/q2")
    assert len(q2) == n, f"QoS 2 duplicates at the fleet: {len(q2) - n}"
    assert len(echo.got) == 2 * n, f"{len(echo.got) - 2 * n} messages echoed back to the remote"


@pytest.mark.timeout(400)
def test_a_flapping_remote_loses_nothing_and_reconnects_once_per_outage(fleet, tmp_path):
    """The remote stopped and started 10 times (3 s down, 5 s up) while 20,000 QoS 1 + 20,000 QoS 2 are
    published at 500/s: QoS 1 loses nothing, QoS 2 arrives once and is sent in order, the queue drains
    within 10 s of the last outage, and the bridge reconnects once per outage (give or take one)."""
    rem = start_mosquitto(tmp_path / "remote", persistence=True)
    tap = Tap(rem)
    # a subscriber that stays, reconnecting after each restart: the remote keeps little for it in between
    col = Collector(rem.host, rem.port, "site1/#", client_id=uid("flap-"))
    (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": [_bridge(tap)]})
    n, rate = 20_000, 500
    pub = _publisher(bp)
    every = [f"{i:06d}".encode() for i in range(n)]
    outages = 10
    try:
        wait_until(lambda: bp.metric("fleetmq_bridge_connected", bridge="cloud") == 1, timeout=20, msg="up")
        stop = threading.Event()
        done_at: list[float] = []

        def publish() -> None:
            t0 = time.monotonic()
            infos = []
            for i, payload in enumerate(every):
                infos.append(pub.publish("up/q1", payload, qos=1))
                infos.append(pub.publish("up/q2", payload, qos=2))
                if (ahead := t0 + (2 * i + 2) / rate - time.monotonic()) > 0:
                    time.sleep(ahead)
            for info in infos:
                info.wait_for_publish(120)
            done_at.append(time.monotonic())
            stop.set()

        publisher = threading.Thread(target=publish)
        publisher.start()
        for _ in range(outages):
            time.sleep(5.0)
            rem.terminate()
            time.sleep(3.0)
            rem = start_mosquitto(tmp_path / "remote", persistence=True, port=rem.port)
        last_outage_end = time.monotonic()
        publisher.join(200)
        assert stop.is_set(), "the publisher's messages were not all acknowledged"
        wait_until(lambda: bp.metric("fleetmq_bridge_queue_messages", bridge="cloud") == 0
                   and bp.metric("fleetmq_bridge_inflight_messages", bridge="cloud") == 0,
                   timeout=60, msg="the bridge's queue drained")  # fmt: skip
        drained_after = time.monotonic() - max(last_outage_end, done_at[0])
        assert drained_after <= 10.0, f"the queue drained {drained_after:.1f}s after the last outage"
        wait_until(lambda: all(col.has_all(f"site1/up/q{q}", every)
                               for q in (1, 2)), timeout=120, msg="everything at the remote")  # fmt: skip
        time.sleep(2.0)
    finally:
        col.stop()
        pub.loop_stop()
        pub.disconnect()
        tap.close()
        rem.stop()
    assert len([1 for t, *_ in col.got if t == "site1/up/q2"]) == n, "QoS 2 duplicates at the remote"
    first = list(dict.fromkeys(int(p) for _t, topic, p, _d in tap.sent if topic == "site1/up/q2"))
    assert first == sorted(first) and len(first) == n, "QoS 2 sent out of order"
    reconnects = bp.metric("fleetmq_bridge_leader_changes_total", bridge="cloud")
    assert reconnects == 1  # (one node: it led all along)
    ended = sum(bp.metric("fleetmq_bridge_reconnects_total", bridge="cloud", reason=r)
                for r in ("remote_closed", "keepalive_timeout", "ack_timeout", "protocol_error"))  # fmt: skip
    assert abs(ended - outages) <= 1, f"{ended} connections ended for {outages} outages"


class Slammer:
    """A remote that accepts each connection, reads its CONNECT, sends `reply` (if any) and closes it:
    records (time, client id) of every attempt."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.attempts: list[tuple[float, str]] = []
        self._srv = TcpServer(self._attempt)
        self.host, self.port = self._srv.host, self._srv.port

    def _attempt(self, conn: socket.socket) -> None:
        now = time.monotonic()
        with conn:
            conn.settimeout(2.0)
            parser, got = Parser(), []
            with contextlib.suppress(OSError, ValueError):
                while not got and (data := conn.recv(4096)):
                    got = [p for p in parser.feed(data) if isinstance(p, Connect)]
                if got and self.reply:
                    conn.sendall(self.reply)
            self.attempts.append((now, got[0].client_id if got else "?"))

    def close(self) -> None:
        self._srv.close()


def test_reconnects_follow_the_backoff_schedule_with_jitter_and_not_in_lockstep(fleet, tmp_path):
    """Ten bridges started together against a remote that accepts and closes: each one's gaps follow
    min(initial * 2^(n-1), max) plus up to `jitter` of it; the ten do not retry in lockstep; when the
    remote returns, each makes one connection."""
    slam = Slammer()
    reconnect = {"initial_delay": "200ms", "max_delay": "1600ms", "jitter": 0.5, "stable_after": "5s"}
    bridges = [
        {"name": f"b{i}", "remote": {"host": slam.host, "port": slam.port},
         "forwards": [{"filter": f"up{i}/#", "destination": "site1/{#}"}], "reconnect": reconnect}
        for i in range(10)
    ]  # fmt: skip
    (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": bridges})
    try:
        wait_until(lambda: all(sum(1 for _t, c in slam.attempts if c == f"edge-b{i}") >= 7 for i in range(10)),
                   timeout=30, msg="seven attempts of each bridge")  # fmt: skip
    finally:
        slam.close()
    gaps: dict[int, list[float]] = {}
    for i in range(10):
        times = [t for t, c in slam.attempts if c == f"edge-b{i}"][:7]
        for n, (a, b) in enumerate(itertools.pairwise(times), start=1):
            base = min(0.2 * 2 ** (n - 1), 1.6)
            assert base - 0.01 <= b - a <= base * 1.5 + 0.2, f"b{i}: gap {n} was {b - a:.3f}s (base {base}s)"
            gaps.setdefault(n, []).append(b - a)
    for n in (3, 4, 5):  # (bases 0.8 s, 1.6 s, 1.6 s: a jitter of up to 0.4-0.8 s)
        spread = max(gaps[n]) - min(gaps[n])
        assert spread > 0.05, f"gap {n} of the ten bridges within {spread * 1000:.0f} ms: lockstep"
    rem = start_mosquitto(tmp_path / "remote", port=slam.port)
    try:
        wait_until(lambda: all(bp.metric("fleetmq_bridge_connected", bridge=f"b{i}") == 1 for i in range(10)),
                   timeout=30, msg="every bridge connected")  # fmt: skip
        time.sleep(3.0)
        log = rem.log_path.read_text(errors="replace")
    finally:
        rem.stop()
    for i in range(10):
        n = len(re.findall(rf"New client connected from \S+ as edge-b{i} ", log))
        assert n == 1, f"bridge b{i} connected {n} times to the returning remote"


def test_a_remote_refusing_the_credentials_shows_in_status_and_metrics_without_a_tight_loop(
    fleet, redis_server
):
    """The remote answers CONNACK 0x86 (bad user name or password): the bridge is not connected, counts
    each refusal, says why in its status (the node's heartbeat, which the MqttBridge status shows), and
    retries on its backoff schedule, not in a loop."""
    slam = Slammer(reply=bytes([0x20, 3, 0, 0x86, 0]))  # a v5 CONNACK: Bad User Name or Password
    bridge = {"name": "cloud", "remote": {"host": slam.host, "port": slam.port, "username": "edge"},
              "forwards": [{"filter": "up/#", "destination": "site1/{#}"}],
              "reconnect": {"initial_delay": "200ms", "max_delay": "1600ms", "jitter": 0.25}}  # fmt: skip
    (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})
    try:
        wait_until(lambda: slam.attempts, timeout=15, msg="a first attempt")
        time.sleep(6.0)
        attempts = len(slam.attempts)
    finally:
        slam.close()
    # 6 s hold the delays 0.2 + 0.4 + 0.8 + 1.6 + 1.6 (+ up to a quarter each) after the first attempt
    assert 4 <= attempts <= 7, f"{attempts} attempts in 6 s"
    assert bp.metric("fleetmq_bridge_connected", bridge="cloud") == 0
    assert bp.metric("fleetmq_bridge_reconnects_total", bridge="cloud", reason="refused") >= attempts - 1
    info = redis_server.command("HGET", "fmq:nodeinfo:{node-0}", "bridges", decode=True)
    status = json.loads(info)["cloud"]
    assert status["connected"] is False and "0x86" in status["last_error"], status


def test_a_remote_that_requires_a_client_certificate_gets_the_one_in_the_tls_secret(fleet, pki, tmp_path):
    """The bridge's TLS files (as the operator renders them from its TLS Secret: ca.crt, tls.crt, tls.key)
    verify the remote and authenticate the bridge to a remote that requires a client certificate."""
    import shutil
    import ssl

    secret = tmp_path / "tls-secret"
    secret.mkdir()
    shutil.copy(pki["ca"], secret / "ca.crt")
    shutil.copy(pki["client"][0], secret / "tls.crt")
    shutil.copy(pki["client"][1], secret / "tls.key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*pki["server"])
    ctx.load_verify_locations(pki["ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    peers: list[str] = []
    held: list[socket.socket] = []

    def serve(raw: socket.socket) -> None:
        try:
            conn = ctx.wrap_socket(raw, server_side=True)
            conn.recv(4096)  # its CONNECT
            subject = dict(x[0] for x in conn.getpeercert()["subject"])
            peers.append(subject["commonName"])
            conn.sendall(bytes([0x20, 3, 0, 0, 0]))  # CONNACK: success, no properties
            held.append(conn)
        except (OSError, ssl.SSLError):
            raw.close()

    srv = TcpServer(serve)
    port = srv.port
    bridge = {"name": "cloud",
              "remote": {"host": "127.0.0.1", "port": port, "transport": "tls", "tls": {"cafile": str(secret / "ca.crt"), "certfile": str(secret / "tls.crt"),
                                                                                "keyfile": str(secret / "tls.key")}},
              "forwards": [{"filter": "up/#", "destination": "site1/{#}"}]}  # fmt: skip
    try:
        (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})
        wait_until(lambda: bp.metric("fleetmq_bridge_connected", bridge="cloud") == 1, timeout=20,
                   msg="the bridge connected over TLS with its client certificate")  # fmt: skip
        assert peers[-1] == "client"
    finally:
        srv.close()
        for c in held:
            c.close()


@pytest.mark.parametrize("transport", ["ws", "wss"])
def test_a_bridge_forwards_over_websocket(fleet, tmp_path, pki, transport):
    """A ws remote (mosquitto's WebSocket listener, path /mqtt), and a wss one (the same over TLS, the
    remote's certificate verified against the bridge's CA): QoS 1 and 2 messages arrive once each."""
    rem = start_mosquitto(tmp_path / "remote", websockets=transport == "ws",
                          wss=pki["server"] if transport == "wss" else None)  # fmt: skip
    try:
        col = Collector(rem.host, rem.port, "site1/#")
        remote = {"host": rem.host, "port": rem.ports[transport], "transport": transport}
        if transport == "wss":
            remote["tls"] = {"cafile": str(pki["ca"])}
        bridge = {
            "name": "cloud",
            "remote": remote,
            "forwards": [{"filter": "up/#", "destination": "site1/{#}"}],
        }
        (bp,) = fleet(1, None, {"event_log": {"fleet": "edge"}, "bridges": [bridge]})
        wait_until(lambda: bp.metric("fleetmq_bridge_connected", bridge="cloud") == 1, timeout=20,
                   msg=f"the bridge connected over {transport}")  # fmt: skip
        every = [f"{i:06d}".encode() for i in range(200)]
        pub = _publisher(bp)
        try:
            for q in (1, 2):
                _publish_all(pub, f"up/q{q}", every, q)
        finally:
            pub.loop_stop()
            pub.disconnect()
        wait_until(lambda: all(col.has_all(f"site1/up/q{q}", every) for q in (1, 2)), timeout=30,
                   msg="everything at the remote")  # fmt: skip
        time.sleep(1.0)
        col.stop()
    finally:
        rem.stop()
    assert sorted(col.payloads("site1/up/q2")) == every, "QoS 2 lost or duplicated over WebSocket"


def test_a_bridge_lease_taken_by_a_request_whose_reply_was_lost_is_read_back(fleet, remote, redis_proxy):
    """Issue 25: the request that takes a bridge's lease runs (the lease is this node's), its reply is lost.
    The node reads the lease back (its holder is this node) and leads: it does not wait for its own
    lease to lapse, nor take the failure for a lease another node holds."""
    lost = redis_proxy.lose_reply(b":lease", b"NX")
    (bp,) = fleet(1, None, {"bridges": [_bridge(remote)]}, redis_url=redis_proxy.url)
    assert lost.wait(10), "the lease's request never went through the proxy"
    col = Collector(remote.host, remote.port, "site1/#")
    pub = _publisher(bp)
    try:
        pub.publish("up/lease", b"1", qos=1).wait_for_publish(10)
        wait_until(lambda: _arrived(col, "site1/up/lease", b"1"), timeout=10,
                   msg="the message at the remote")  # fmt: skip
        assert bp.metric("fleetmq_bridge_leader", bridge="cloud") == 1
    finally:
        pub.loop_stop()
        pub.disconnect()
        col.stop()
