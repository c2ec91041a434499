"""--redis-wait-replicas N: a publisher's ack also waits until N Redis replicas have the writes (WAIT)."""

from __future__ import annotations

import pytest

from tests.support import RedisServer, wait_until

from .harness import MOSQUITTO, Client, uid
from .mqttraw import PUBACK, RawClient

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")


def test_acks_wait_for_replicas(fleet, redis_server, tmp_path):
    replica = RedisServer(tmp_path / "replica", replicaof=redis_server)
    try:
        wait_until(
            lambda: "state=online" in redis_server.info("replication").get("slave0", ""),
            timeout=20,
            msg="replica in sync",
        )
        (node,) = fleet(1, extra_args=("--redis-wait-replicas", "1"))
        topic = uid("rep/")
        sub = Client(node.host, node.port, uid("rs"), version=4, clean=False)
        sub.subscribe(topic, 1)
        sub.stop()  # offline persistent session: every publish to it is a store write
        pub = RawClient(node.host, node.port)
        pub.connect(uid("rp"))
        pub.publish(topic, b"replicated", qos=1)
        assert pub.expect(PUBACK, timeout=5).type == PUBACK
        # With the replica gone, WAIT cannot be satisfied: the publish is not acknowledged.
        replica.stop()
        wait_until(
            lambda: redis_server.info("replication").get("connected_slaves") == "0",
            timeout=10,
            msg="replica gone",
        )
        pub.publish(topic, b"not-replicated", qos=1)
        closed, seen = pub.wait_closed(timeout=10)
        assert not [p for p in seen if p.type == PUBACK], "acked a write no replica has"
        assert closed, "the publisher is disconnected unacknowledged, so it resends later"
        assert node.metric("fleetmq_store_errors_total") >= 1
    finally:
        replica.stop()
