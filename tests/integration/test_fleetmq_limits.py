"""Per-zone limits: connections, connect rate, publish rate and bytes (v5 told with 0x97, v3 throttled),
subscriptions per client."""

from __future__ import annotations

import time

import pytest

from .harness import MOSQUITTO, uid
from .mqttraw import PUBACK, PUBLISH, UNSUBACK, unsubscribe

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


def test_publish_bytes_rate_v5_is_told_and_v3_throttled_losing_nothing(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_publish_bytes_rate": 10_000})  # ten 1 KB messages a second
    sub = raw_clients(bp, 5)
    sub.connect(uid("s"))
    topic = uid("pb/")
    sub.subscribe([(topic, 0)])  # (QoS 0: no window for a subscriber that does not acknowledge to fill)
    v5 = raw_clients(bp, 5)
    v5.connect(uid("p5"))
    for i in range(20):
        v5.publish(topic, b"%04d" % i + bytes(996), qos=1)
    acks = v5.recv_n(20, timeout=5, ptype=PUBACK)
    accepted = [a for a in acks if a.reason < 0x80]
    assert 10 <= len(accepted) <= 12 and all(a.reason == 0x97 for a in acks if a.reason >= 0x80), acks
    assert len([p for p in sub.recv_all(1.0) if p.type == PUBLISH]) == len(accepted)
    assert bp.metric("fleetmq_messages_dropped_total", reason="rate_limited") == 20 - len(accepted)
    v3 = raw_clients(bp, 4)
    v3.connect(uid("p3"))
    t0 = time.monotonic()
    for i in range(30):  # (a 30 KB message, above a second's worth, goes through too: the bucket owes it)
        v3.publish(topic, b"%04d" % i + bytes(30_000 if i == 15 else 996), qos=1)
    assert len(v3.recv_n(30, timeout=15, ptype=PUBACK)) == 30
    assert time.monotonic() - t0 >= 3.0  # 60 KB at 10 KB/s, a second's burst
    got = [p.payload[:4] for p in sub.recv_all(1.5) if p.type == PUBLISH]
    assert got == [b"%04d" % i for i in range(30)], "throttling loses nothing and keeps the order"


@pytest.mark.parametrize("version", [4, 5])
def test_subscriptions_beyond_the_quota_are_refused_and_counted(start_broker, raw_clients, version):
    bp = start_broker(zone_overrides={"max_subscriptions": 2})
    c = raw_clients(bp, version)
    c.connect(uid("sq"))
    refused = 0x97 if version == 5 else 0x80
    assert c.subscribe([("a", 0), ("b", 1), ("c", 1)]).codes == [0, 1, refused]
    assert c.subscribe([("a", 1)]).codes == [1]  # (one it has: replaced, not counted again)
    c.send(unsubscribe(c.pid(), ["b"], version=version))
    c.expect(UNSUBACK)
    assert c.subscribe([("c", 1)]).codes == [1]
    assert bp.metric("fleetmq_quota_refusals_total", quota="subscriptions") == 1


def test_a_users_quota_replaces_the_zones(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_subscriptions": 3,
                                      "user_quotas": {"sensor": {"max_subscriptions": 1, "max_publish_rate": 2}}})  # fmt: skip
    sensor = raw_clients(bp, 5)
    sensor.connect(uid("q"), username="sensor")
    assert sensor.subscribe([("a", 0), ("b", 0)]).codes == [0, 0x97]
    for i in range(6):
        sensor.publish("t", b"%d" % i, qos=1, packet_id=i + 1)
    acks = sensor.recv_n(6, ptype=PUBACK)
    assert 2 <= sum(a.reason < 0x80 for a in acks) <= 3, acks  # (its own rate: 2 a second)
    other = raw_clients(bp, 5)
    other.connect(uid("q"), username="someone")
    assert other.subscribe([("a", 0), ("b", 0), ("c", 0), ("d", 0)]).codes == [0, 0, 0, 0x97]  # the zone's
