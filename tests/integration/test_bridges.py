"""Bridges to a remote broker (issue 16), against mosquitto started here with persistence on: the fleet's
nodes run on a real redis-server; clients are paho."""

from __future__ import annotations

import re
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from tests.integration.harness import MOSQUITTO, start_mosquitto, uid
from tests.support import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")]


@pytest.fixture
def remote(tmp_path):
    bp = start_mosquitto(tmp_path / "remote", persistence=True)
    yield bp
    bp.stop()


class Collector:
    """A paho v5 subscriber at the remote: every message with its topic, QoS and user properties."""

    def __init__(self, host: str, port: int, topic_filter: str) -> None:
        self.got: list[tuple[str, bytes, int, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=uid("col-"), protocol=mqtt.MQTTv5)
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.connect(host, port)
        self.c.loop_start()
        self.c.subscribe(topic_filter, qos=2)
        assert subscribed.wait(10)

    def _on_message(self, _c, _u, m) -> None:
        props = dict(getattr(m.properties, "UserProperty", []) or [])
        with self.lock:
            self.got.append((m.topic, m.payload, m.qos, props))

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


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
