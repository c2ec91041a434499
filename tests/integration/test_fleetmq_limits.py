"""Per-zone limits: connections, connect rate, publish rate (v5 told with 0x97, v3 throttled)."""

from __future__ import annotations

import time

import pytest

from .harness import MOSQUITTO, uid
from .mqttraw import PUBACK, PUBLISH

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


@pytest.mark.parametrize("version", [4, 5])
def test_max_connections(start_broker, raw_clients, version):
    bp = start_broker(zone_overrides={"max_connections": 2})
    held = [raw_clients(bp, version) for _ in range(2)]
    for c in held:
        assert c.connect(uid("mc")).reason == 0
    extra = raw_clients(bp, version)
    ack = extra.connect(uid("mc"), check=False)
    assert ack.reason == (0x97 if version == 5 else 3)
    held[0].close()
    time.sleep(0.3)  # the freed slot is counted back
    again = raw_clients(bp, version)
    assert again.connect(uid("mc")).reason == 0
    assert bp.metric("fleetmq_disconnects_total", reason="max_connections") == 1


def test_connect_rate(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_conn_rate": 2})
    codes = []
    for _ in range(6):
        c = raw_clients(bp, 5)
        codes.append(c.connect(uid("cr"), check=False).reason)
        c.close()
    assert codes[:2] == [0, 0]
    assert 0x9F in codes[2:], codes
    time.sleep(1.1)  # the bucket refills
    assert raw_clients(bp, 5).connect(uid("cr")).reason == 0


def test_publish_rate_v5_is_told(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_publish_rate": 5})
    sub = raw_clients(bp, 5)
    sub.connect(uid("s"))
    topic = uid("pr/")
    sub.subscribe([(topic, 1)])
    pub = raw_clients(bp, 5)
    pub.connect(uid("p"))
    for i in range(20):
        pub.publish(topic, b"%d" % i, qos=1)
    acks = pub.recv_n(20, timeout=5, ptype=PUBACK)
    refused = [a for a in acks if a.reason == 0x97]
    accepted = [a for a in acks if a.reason == 0]
    assert 5 <= len(accepted) <= 7 and len(refused) == 20 - len(accepted)
    got = [p for p in sub.recv_all(1.0) if p.type == PUBLISH]
    assert len(got) == len(accepted), "refused messages must not be delivered"


def test_publish_rate_v3_is_throttled_not_dropped(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_publish_rate": 10})
    sub = raw_clients(bp, 4)
    sub.connect(uid("s"))
    topic = uid("pr3/")
    sub.subscribe([(topic, 1)])
    pub = raw_clients(bp, 4)
    pub.connect(uid("p"))
    t0 = time.monotonic()
    for i in range(30):
        pub.publish(topic, b"%d" % i, qos=1)
    acks = pub.recv_n(30, timeout=10, ptype=PUBACK)
    elapsed = time.monotonic() - t0
    assert len(acks) == 30
    assert elapsed >= 1.5, f"30 publishes at 10/s (burst 10) took only {elapsed:.2f}s"
    got = [p.payload for p in sub.recv_all(1.0) if p.type == PUBLISH]
    assert got == [b"%d" % i for i in range(30)], "throttling loses nothing"
