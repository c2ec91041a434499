"""Cross-node routing in a fleet sharing one Redis: a publish on any node reaches matching subscribers on
every node (plain, shared, retained), subscriptions spread through the fleet, and a persistent session
follows its client from node to node (issue 3, "Cross-node routing")."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.integration.harness import uid

pytestmark = pytest.mark.redis


def _publish_until_received(pub, sub, topic: str, payload: bytes, qos: int = 1, timeout: float = 5.0):
    """Publish `payload` until `sub` receives it (a route may take a moment to reach another node);
    returns how long it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        pub.publish(topic, payload, qos)
        for m in sub.drain(0.1):
            if m.payload == payload:
                return time.monotonic() - t0
    raise AssertionError(f"{payload!r} on {topic!r} never reached the subscriber within {timeout}s")


@pytest.mark.parametrize("version", [4, 5])
def test_publish_on_one_node_reaches_subscribers_on_every_node(fleet, client_factory, version):
    a, b, c = fleet(3)
    topic = uid("route/") + "/x"
    subs = {}
    for name, bp in (("a", a), ("b", b), ("c", c)):
        s = client_factory(uid(f"sub{name}-"), broker=bp, version=version)
        assert s.subscribe(topic + "/#" if name == "c" else topic, 2)[0] in (2,)
        subs[name] = s
    pub = client_factory(uid("pub-"), broker=a, version=version)
    # routes are made on B and C: wait until A knows them (each subscriber gets a probe)
    for s in subs.values():
        _publish_until_received(pub, s, topic, b"probe-" + s.client_id.encode())
    for s in subs.values():
        s.drain(0.2)  # other probes
    for qos in (0, 1, 2):
        pub.publish(topic, f"m{qos}".encode(), qos)
    for name, s in subs.items():
        got = s.wait_for(3, timeout=5)
        assert sorted((m.payload, m.qos) for m in got) == [(b"m0", 0), (b"m1", 1), (b"m2", 2)], name
        assert all(m.topic == topic for m in got)
        assert s.drain(0.3) == [], f"{name} got extra messages"


def test_subscription_on_b_visible_on_a_quickly_and_unsubscribe_stops(fleet, client_factory):
    a, b = fleet(2)
    topic = uid("vis/")
    pub = client_factory(uid("pub-"), broker=a)
    sub = client_factory(uid("sub-"), broker=b)
    pub.publish(topic, b"before", 1)  # no subscriber anywhere yet
    sub.subscribe(topic, 1)
    took = _publish_until_received(pub, sub, topic, b"after-subscribe", timeout=3)
    print(f"subscription on B visible to a publisher on A after {took * 1000:.0f} ms")
    assert took < 1.0, f"a subscription on B took {took:.2f}s to reach A"
    assert all(m.payload != b"before" for m in sub.drain(0.2))
    sub.unsubscribe(topic)
    # the UNSUBACK is sent once stored; give the route removal ~1 s to reach A, then nothing may arrive
    time.sleep(1.0)
    for i in range(5):
        pub.publish(topic, f"gone-{i}".encode(), 1)
    assert sub.drain(0.7) == [], "messages still routed to B after unsubscribe"


def test_shared_subscription_one_member_fleet_wide(fleet, client_factory):
    a, b, c = fleet(3)
    topic = uid("shared/")
    m1 = client_factory(uid("m1-"), broker=a, version=5)
    m2 = client_factory(uid("m2-"), broker=b, version=5)
    plain = client_factory(uid("plain-"), broker=b, version=5)
    m1.subscribe(f"$share/g/{topic}", 1)
    m2.subscribe(f"$share/g/{topic}", 1)
    plain.subscribe(topic, 1)
    pub = client_factory(uid("pub-"), broker=c, version=5)
    _publish_until_received(pub, plain, topic, b"warm")
    # both members' routes must be known on C before we count
    time.sleep(0.5)
    for x in (m1, m2, plain):
        x.drain(0.2)
    n = 60
    for i in range(n):
        pub.publish(topic, f"s{i}".encode(), 1)
    got_plain = plain.wait_for(n, timeout=10)
    assert sorted(m.payload for m in got_plain) == sorted(f"s{i}".encode() for i in range(n))
    time.sleep(0.5)
    r1 = [m.payload for m in m1.drain(0.3)]
    r2 = [m.payload for m in m2.drain(0.3)]
    counts = Counter(r1 + r2)
    missing = [i for i in range(n) if counts[f"s{i}".encode()] == 0]
    dups = [p for p, k in counts.items() if k > 1]
    assert not missing, f"shared group lost {len(missing)} messages: {missing[:10]}"
    assert not dups, f"delivered to more than one member of the group: {dups[:10]}"
    assert len(r1) + len(r2) == n
    print(f"shared group split: node A member {len(r1)}, node B member {len(r2)}")
    assert r1 and r2, "all messages went to one member: the group does not span nodes"


def test_retained_set_on_a_served_by_b_cleared_on_b_gone_for_a(fleet, client_factory):
    a, b = fleet(2)
    topic = uid("ret/")
    pa = client_factory(uid("pa-"), broker=a)
    pa.publish(topic, b"kept", 1, retain=True)
    # a new subscriber on B gets it (allow the retained event to travel)
    deadline = time.monotonic() + 3
    got = []
    while time.monotonic() < deadline and not got:
        s = client_factory(uid("sb-"), broker=b)
        s.subscribe(topic, 1)
        got = s.drain(0.3)
        s.disconnect()
    assert [(m.payload, m.retain) for m in got] == [(b"kept", True)]
    pb = client_factory(uid("pb-"), broker=b)
    pb.publish(topic, b"", 1, retain=True)  # clear on B
    time.sleep(0.5)
    sa = client_factory(uid("sa-"), broker=a)
    sa.subscribe(topic, 1)
    assert sa.drain(0.5) == [], "retained message cleared on B still served by A"
    sb = client_factory(uid("sb2-"), broker=b)
    sb.subscribe(topic, 1)
    assert sb.drain(0.3) == []


@pytest.mark.parametrize("version", [4, 5])
def test_persistent_session_moves_a_to_c_with_messages_queued_on_b(fleet, client_factory, version):
    a, b, c = fleet(3)
    topic = uid("persist/")
    cid = uid("roam-")
    kw = {"clean": False} if version == 4 else {"clean": False, "session_expiry": 300}
    s = client_factory(cid, broker=a, version=version, **kw)
    assert not s.session_present
    s.subscribe(topic, 2)
    pub = client_factory(uid("pub-"), broker=b, version=version)
    _publish_until_received(pub, s, topic, b"warm", qos=1)
    s.drain(0.2)
    s.disconnect()
    n = 30
    for i in range(n):
        pub.publish(topic, f"q{i:03d}".encode(), 1 + i % 2)
    s2 = client_factory(cid, broker=c, version=version, **kw)
    assert s2.session_present, "reconnect on C: session not present"
    got = s2.wait_for(n, timeout=10)
    assert sorted(m.payload for m in got) == [f"q{i:03d}".encode() for i in range(n)]
    for qos in (1, 2):  # order is per topic and QoS (paho hands QoS2 over at PUBREL)
        assert [m.payload for m in got if m.qos == qos] == [
            f"q{i:03d}".encode() for i in range(n) if 1 + i % 2 == qos
        ], f"QoS{qos} out of order"
    assert s2.drain(0.3) == []
    # still subscribed on C without resubscribing
    pub.publish(topic, b"live", 1)
    (m,) = s2.wait_for(1)
    assert m.payload == b"live"
