"""Publishing on $SYS, on a real broker: refused (MQTT 5: PUBACK/PUBREC 0x87, as mosquitto does) unless a
zone rule naming $SYS allows it; never routed to `$SYS/#` subscribers nor retained; counted."""

from __future__ import annotations

import pytest

from .harness import MOSQUITTO, uid
from .mqttraw import PUBACK, PUBLISH, PUBREC, V5, V311

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq's metrics and zone rules")


@pytest.mark.parametrize("version", [V311, V5])
def test_anonymous_sys_publish_is_refused(start_broker, raw_clients, version):
    bp = start_broker(zone_overrides={"acl": [{"permission": "allow", "action": "all", "filter": "#"}]})
    watcher = raw_clients(bp, version=V5)
    watcher.connect(uid("watch"))
    watcher.subscribe([("$SYS/#", 1)])
    pub = raw_clients(bp, version=version)
    pub.connect(uid("anon"))
    pub.publish("$SYS/broker/clients/connected", b"999", qos=1, retain=True, packet_id=5)
    ack = pub.expect(PUBACK)
    assert ack.packet_id == 5
    if version == V5:
        assert ack.reason == 0x87
    pub.publish("$SYS/broker/load", b"0", qos=2, packet_id=6)
    rec = pub.expect(PUBREC)
    if version == V5:
        assert rec.reason == 0x87
    pub.publish("$SYS/x", b"0", qos=0)
    assert watcher.recv_all(0.5) == [], "a $SYS/# subscriber got a client's $SYS publish"
    late = raw_clients(bp, version=V5)
    late.connect(uid("late"))
    late.subscribe([("$SYS/#", 1)])
    assert late.recv_all(0.5) == [], "a client's $SYS publish was retained"
    assert bp.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 3


def test_an_explicit_rule_allows_sys_publishes(start_broker, raw_clients):
    bp = start_broker(
        zone_overrides={"acl": [{"permission": "allow", "action": "publish", "filter": "$SYS/agent/#"}]}
    )
    watcher = raw_clients(bp, version=V5)
    watcher.connect(uid("watch"))
    watcher.subscribe([("$SYS/#", 0)])
    pub = raw_clients(bp, version=V5)
    pub.connect(uid("agent"))
    pub.publish("$SYS/agent/up", b"1", qos=1)
    assert pub.expect(PUBACK).reason == 0
    got = watcher.expect(PUBLISH)
    assert got.topic == "$SYS/agent/up"
