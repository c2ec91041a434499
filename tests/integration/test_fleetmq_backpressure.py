"""A subscriber that stops reading must not grow the broker's memory without bound.

Once the socket's write buffer passes its high-water mark, QoS1/2 deliveries wait in the session's
Message Queue (bounded by max_mqueue_len, oldest dropped) and QoS0 deliveries are dropped and counted.
"""

from __future__ import annotations

import pytest

from tests.support import wait_until

from .harness import MOSQUITTO, uid
from .mqttraw import PUBLISH

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")

PAYLOAD = b"x" * 16384
MESSAGES = 2500  # 40 MiB: far beyond the 4 MiB high-water mark plus the kernel's socket buffers


@pytest.mark.parametrize("transport", ["epoll", "loop"])
def test_stalled_subscriber_is_bounded(start_broker, raw_clients, transport):
    """On fleetmq's own transport (the default for tcp listeners) and on the event loop's."""
    listener = {"name": "mqtt", "bind": "127.0.0.1:0", "protocol": "tcp", "transport": transport}
    bp = start_broker({"listeners": [listener]}, zone_overrides={"max_mqueue_len": 50, "max_inflight": 10})
    t0, t1 = uid("bp0/"), uid("bp1/")
    sub = raw_clients(bp)
    sub.connect(uid("stalled"))
    sub.subscribe([(t0, 0), (t1, 1)])
    # The subscriber now reads nothing. A publisher floods both topics.
    pub = raw_clients(bp)
    pub.connect(uid("flood"))
    rss_before = bp.rss_bytes()
    for i in range(MESSAGES):
        pub.publish(t0, PAYLOAD, qos=0)
        if i % 10 == 0:
            pub.publish(t1, PAYLOAD, qos=1)
    # Every QoS1 publish is acknowledged: the broker owns them (queued, oldest dropped past the limit).
    acks = pub.recv_n(MESSAGES // 10, timeout=20)
    assert len(acks) == MESSAGES // 10
    wait_until(
        lambda: bp.metric("fleetmq_messages_dropped_total", reason="queue_full") > 0,
        timeout=10,
        msg="queue_full drops",
    )
    grown = bp.rss_bytes() - rss_before
    assert grown < 30 * 1024 * 1024, f"broker grew by {grown / 2**20:.1f} MiB for a stalled subscriber"

    # The subscriber recovers: it reads what was buffered, then queued QoS1 messages flow again.
    got_qos1 = []
    while True:
        p = sub.recv(timeout=3)
        if p is None:
            break
        if p.type == PUBLISH and p.qos == 1:
            got_qos1.append(p)
            sub.ack(p)
    assert got_qos1, "queued QoS1 deliveries resume once the subscriber reads again"
    assert len(got_qos1) <= 10 + 50 + 64, "no more than window + queue (+ what was already on the wire)"
    # The node stayed healthy for everyone else.
    other = raw_clients(bp)
    other.connect(uid("other"))
    assert bp.alive()
