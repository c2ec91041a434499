"""Issue 28: an http authenticator's acl_url on a real broker process. The auth service the test runs
(authservice.py) allows a user its own topics, leaves free/... to the zone's rules and denies the rest;
its answers are cached per action and topic, and a service that cannot answer denies."""

from __future__ import annotations

import pytest

from .authservice import AuthService
from .harness import MOSQUITTO, uid
from .mqttraw import PUBACK, PUBLISH

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


def zone(service: AuthService, **extra: object) -> dict[str, object]:
    return {
        "acl_default": "deny",
        "acl": [{"permission": "allow", "action": "all", "filter": "free/ok/#"}],
        "authentication": [{"mechanism": "http", "url": service.url, "acl_url": service.acl_url,
                            "timeout": "1s", "cache_ttl": "30s", **extra}],
    }  # fmt: skip


@pytest.mark.parametrize("version", [4, 5])
def test_the_service_decides_publishes_and_subscriptions_and_ignore_leaves_them_to_the_rules(
    start_broker, raw_clients, service, version
):
    bp = start_broker(zone_overrides=zone(service))
    denied_sub = 0x87 if version == 5 else 0x80
    watcher = raw_clients(bp, 5)
    watcher.connect(uid("root"), username="root", password=b"x")  # a superuser: not asked
    watcher.subscribe([("#", 1)])
    carol = raw_clients(bp, version)
    cid = uid("carol")
    carol.connect(cid, username="carol", password=b"x")
    assert carol.subscribe([("carol/#", 1), ("dave/#", 1), ("free/ok/#", 1), ("free/no/#", 1)]).codes == [
        1, denied_sub, 1, denied_sub,
    ]  # fmt: skip
    assert {(r["action"], r["topic"]) for r in service.acl_requests} == {
        ("subscribe", "carol/#"), ("subscribe", "dave/#"), ("subscribe", "free/ok/#"), ("subscribe", "free/no/#"),
    }  # fmt: skip
    assert service.acl_requests[0]["clientid"] == cid and service.acl_requests[0]["peerhost"] == "127.0.0.1"
    assert "password" not in service.acl_requests[0]
    for i, topic in enumerate(["carol/a", "dave/a", "free/ok/a", "free/no/a"] * 3):
        carol.publish(topic, b"%d" % i, qos=1, packet_id=i + 1)
    acks = carol.recv_n(12, ptype=PUBACK)
    assert [a.packet_id for a in acks] == list(range(1, 13)), "acks in publish order"
    if version == 5:
        assert [a.reason for a in acks[:4]] == [0, 0x87, 0, 0x87]
    got = [(p.topic, p.payload) for p in watcher.recv_all(1.0) if p.type == PUBLISH]
    assert sorted(got) == sorted([("carol/a", b"0"), ("carol/a", b"4"), ("carol/a", b"8"),
                                  ("free/ok/a", b"2"), ("free/ok/a", b"6"), ("free/ok/a", b"10")])  # fmt: skip
    publishes = [r for r in service.acl_requests if r["action"] == "publish"]
    assert len(publishes) == 4, "each (action, topic) asked once, then the cached answer"
    for action, result, n in (("subscribe", "allow", 1), ("subscribe", "deny", 1), ("subscribe", "ignore", 2),
                              ("publish", "allow", 1), ("publish", "deny", 1), ("publish", "ignore", 2)):  # fmt: skip
        assert bp.metric("fleetmq_authorizations_total", action=action, result=result) == n


def test_a_service_that_cannot_answer_denies_in_time_and_the_connection_goes_on(
    start_broker, raw_clients, service
):
    bp = start_broker(zone_overrides=zone(service, cache_ttl="0s"))
    carol = raw_clients(bp, 5)
    carol.connect(uid("carol"), username="carol", password=b"x")
    carol.publish("carol/a", b"1", qos=1, packet_id=1)
    assert carol.recv_n(1, ptype=PUBACK)[0].reason == 0x10, "allowed (no subscriber)"
    service.delay = 3.0  # past the 1 s timeout
    carol.publish("carol/a", b"2", qos=1, packet_id=2)
    [ack] = carol.recv_n(1, timeout=3, ptype=PUBACK)
    assert ack.reason == 0x87, "unavailable: denied"
    service.delay = 0.0
    service.stop()
    carol.publish("carol/a", b"3", qos=1, packet_id=3)
    assert carol.recv_n(1, timeout=3, ptype=PUBACK)[0].reason == 0x87
    assert carol.subscribe([("carol/#", 1)]).codes == [0x87]
    assert bp.metric("fleetmq_authorizations_total", result="unavailable") == 3
    assert "authorization service of zone default cannot answer" in bp.log()
