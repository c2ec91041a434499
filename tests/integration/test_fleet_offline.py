"""Offline sessions in Redis: QoS 0 sent to one whose zone does not keep QoS 0 (mqueue_store_qos0: false) is
not queued, and is counted as a qos0_offline drop on the node that published it."""

from __future__ import annotations

import time

import pytest

from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBACK, PUBLISH
from tests.support import wait_until

pytestmark = pytest.mark.redis


def test_qos0_to_an_offline_session_is_dropped_and_counted(fleet):
    a, b = fleet(2, {"mqueue_store_qos0": False})
    topic = uid("offline/")
    cid = uid("away")
    c, _ = raw_connect(a, cid, 5)
    c.subscribe([(topic, 1)])
    c.close()
    time.sleep(0.3)
    pub, _ = raw_connect(b, uid("pub"), 5)
    for i in range(3):
        pub.publish(topic, b"q0-%d" % i, qos=0)
    pub.publish(topic, b"q1", qos=1)
    assert pub.expect(PUBACK).reason == 0
    wait_until(lambda: b.metric("fleetmq_messages_dropped_total", reason="qos0_offline") == 3, timeout=5)
    c, _ = raw_connect(a, cid, 5)
    assert [p.payload for p in c.recv_n(1, timeout=5, ptype=PUBLISH)] == [b"q1"]  # only the QoS 1 waited
    assert [p for p in c.recv_all(0.5) if p.type == PUBLISH] == []
