"""Access control tried as an attacker would, with paho over real sockets: wildcards, shared subscriptions,
retained messages and wills cannot reach what a zone's rules deny, on one node, across nodes and zones,
and after a live change of the rules."""

from __future__ import annotations

import contextlib

import pytest
import yaml

from tests.support import wait_until

from .harness import MOSQUITTO, Client, uid

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")

V311, V5 = 4, 5
REFUSED = {V311: 0x80, V5: 0x87}

DENY_READ = [
    {"permission": "deny", "action": "subscribe", "filter": "secret/#"},
    {"permission": "allow", "action": "all", "filter": "#"},
]


def prefixed(rules: list[dict], prefix: str) -> list[dict]:
    """The rules with every filter under `prefix` (tests share a broker's topic space)."""
    return [{**r, "filter": f"{prefix}/{r['filter']}"} for r in rules]


def topics(msgs) -> list[str]:
    return sorted(m.topic for m in msgs)


def warm_up(pub: Client, sub: Client, timeout: float = 10.0) -> None:
    """Publish until the subscriber receives: its route reached the publisher's node."""
    wait_until(
        lambda: pub.publish("public/warm", b"w", qos=1) and sub.drain(0.2), timeout=timeout, msg="route known"
    )
    sub.drain(0.5)


@pytest.mark.parametrize("version", [V311, V5])
def test_wildcards_shared_and_retained_cannot_read_denied_topics(start_broker, client_factory, version):
    bp = start_broker(zone_overrides={"acl": DENY_READ})
    pub = client_factory(uid("pub"), broker=bp, version=version)
    pub.publish("secret/r", b"retained secret", qos=1, retain=True)
    pub.publish("public/r", b"retained public", qos=1, retain=True)

    subs: dict[str, Client] = {}
    codes: dict[str, int] = {}
    for f in ("secret/+", "secret/#", "#", "+/#", "+/x", "$share/g/secret/#", "$share/g/#"):
        c = client_factory(uid("sub"), broker=bp, version=version)
        [codes[f]] = c.subscribe(f, 1)
        subs[f] = c
    # a filter that can only reach denied topics is refused; '$share/g/' is stripped before the rules
    for f in ("secret/+", "secret/#", "$share/g/secret/#"):
        assert codes[f] == REFUSED[version], f
    for f in ("#", "+/#", "+/x", "$share/g/#"):
        assert codes[f] == 1, f

    pub.publish("secret/x", b"secret", qos=1)
    pub.publish("public/x", b"public", qos=1)
    expected = {
        "#": ["public/r", "public/x"],  # the retained message on subscribe, then the live one
        "+/#": ["public/r", "public/x"],
        "+/x": ["public/x"],
        "$share/g/#": ["public/x"],  # shared subscriptions get no retained messages
    }
    for f, want in expected.items():
        got = subs[f].wait_for(len(want), timeout=5)
        assert topics(got) == want, f
    for f, c in subs.items():
        assert not [m for m in c.drain(0.5) if m.topic.startswith("secret/")], f
    # never sent, so never dropped: the secret live message is counted once per subscriber it was kept from
    assert bp.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 4
    pub.publish("secret/r", b"", qos=1, retain=True)
    pub.publish("public/r", b"", qos=1, retain=True)


@pytest.mark.parametrize("version", [V311, V5])
def test_will_is_authorized_as_a_publish(start_broker, client_factory, version):
    rules = [
        {"permission": "deny", "action": "publish", "filter": "secret/#"},
        {"permission": "allow", "action": "all", "filter": "#"},
    ]
    bp = start_broker(zone_overrides={"acl": rules})
    watcher = client_factory(uid("watch"), broker=bp, version=version)
    assert watcher.subscribe("secret/#", 1) == [1]
    assert watcher.subscribe("public/#", 1) == [1]
    pub = client_factory(uid("p"), broker=bp, version=version)
    pub.publish("secret/p", b"x", qos=1, wait=False)  # a plain PUBLISH is refused, as before

    cid = uid("w")
    will = Client(
        bp.host,
        bp.port,
        cid,
        version=version,
        will={"topic": "secret/w", "payload": b"bye", "qos": 1},
        connect=False,
    )
    if version == V5:
        # told at CONNECT: Not authorized, with a reason string that names the will
        with pytest.raises(AssertionError, match="connection refused"):
            will.connect()
        assert will.connack["reason_code"] == 0x87
        assert "will" in will.connack["props"].get("ReasonString", "")
        assert bp.metric("fleetmq_disconnects_total", reason="will_not_authorized") == 1
    else:
        # a v3 client cannot be told why: accepted, and the will is dropped when it would go out
        will.connect()
        will.stop()  # the connection drops without DISCONNECT: the will falls due
        wait_until(
            lambda: bp.metric("fleetmq_messages_dropped_total", reason="not_authorized") >= 2,
            msg="the will dropped as not authorized",
        )
        assert "dropped the will of" in bp.log()
    # an allowed will still goes out
    ok = Client(
        bp.host, bp.port, uid("w"), version=version, will={"topic": "public/w", "payload": b"bye", "qos": 1}
    )
    ok.stop()
    got = watcher.wait_for(1, timeout=5)
    assert [m.topic for m in got] == ["public/w"]
    assert not watcher.drain(0.5)


def test_live_acl_change_revokes_read_without_a_reconnect(start_broker, client_factory):
    bp = start_broker()
    sub = client_factory(uid("sub"), broker=bp, version=V5)
    assert sub.subscribe("#", 1) == [1]
    pub = client_factory(uid("pub"), broker=bp, version=V5)
    pub.publish("secret/x", b"before", qos=1)
    assert [m.payload for m in sub.wait_for(1)] == [b"before"]

    before = bp.http_get("/readyz")[1]
    cfg = yaml.safe_load(bp.config_path.read_text())
    cfg["zones"]["default"]["acl"] = DENY_READ
    bp.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    wait_until(lambda: bp.http_get("/readyz")[1] != before, msg="config reloaded")

    pub.publish("secret/x", b"after", qos=1)
    pub.publish("public/x", b"public", qos=1)
    assert [m.payload for m in sub.wait_for(1)] == [b"public"]
    assert not sub.drain(0.5)
    assert sub.is_connected()  # the same connection throughout
    assert bp.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 1


def test_subscribers_zone_decides(start_broker):
    config = {
        "zones": {"open": {}, "tenant": {"acl": DENY_READ}},
        "listeners": [
            {"name": "open", "zone": "open", "bind": "127.0.0.1:0", "protocol": "tcp"},
            {"name": "tenant", "zone": "tenant", "bind": "127.0.0.1:0", "protocol": "tcp"},
        ],
    }
    bp = start_broker(config)
    with contextlib.ExitStack() as stack:
        pub, free, tenant = (
            stack.enter_context(Client(bp.host, bp.ports[listener], uid(listener), version=version))
            for listener, version in (("open", V5), ("open", V5), ("tenant", V311))
        )
        check_zones(bp, pub, free, tenant)


def check_zones(bp, pub: Client, free: Client, tenant: Client) -> None:
    """A publisher and a subscriber in a zone without rules, a subscriber in a zone that denies secret/#."""
    free.subscribe("#", 1)
    tenant.subscribe("#", 1)
    pub.publish("secret/x", b"s", qos=1)
    pub.publish("public/x", b"p", qos=1)
    assert topics(free.wait_for(2)) == ["public/x", "secret/x"]
    assert topics(tenant.wait_for(1)) == ["public/x"]
    assert not tenant.drain(0.5)
    assert bp.metric("fleetmq_messages_dropped_total", zone="tenant", reason="not_authorized") == 1


@pytest.mark.parametrize("version", [V311, V5])
def test_across_nodes_the_delivering_node_checks(fleet, client_factory, version):
    a, b = fleet(2, zone_overrides={"acl": DENY_READ})
    cid = uid("sub")
    sub = client_factory(cid, broker=b, version=version, clean=False, session_expiry=300)
    assert sub.subscribe("#", 1) == [1]
    pub = client_factory(uid("pub"), broker=a, version=version)
    warm_up(pub, sub)
    # routed through Redis from A to the session on B: B applies its rules
    pub.publish("secret/x", b"s", qos=1)
    pub.publish("public/x", b"p", qos=1)
    assert [m.topic for m in sub.wait_for(1, timeout=10)] == ["public/x"]
    assert not sub.drain(0.5)
    assert b.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 1
    # queued in Redis while the subscriber is away, then resumed on A: checked on the way out
    sub.stop()
    wait_until(lambda: b.metric("fleetmq_connections") == 0, msg="subscriber gone from B")
    pub.publish("secret/y", b"s", qos=1)
    pub.publish("public/y", b"p", qos=1)
    back = client_factory(cid, broker=a, version=version, clean=False, session_expiry=300)
    assert back.session_present
    assert [m.topic for m in back.wait_for(1, timeout=10)] == ["public/y"]
    assert not back.drain(0.5)
    assert a.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 1


def test_dead_nodes_denied_will_is_dropped_by_the_node_that_reaps_it(fleet, client_factory):
    rules = [
        {"permission": "deny", "action": "publish", "filter": "secret/#"},
        {"permission": "allow", "action": "all", "filter": "#"},
    ]
    a, b = fleet(2, zone_overrides={"acl": rules})
    watcher = client_factory(uid("watch"), broker=b, version=V5)
    watcher.subscribe("secret/#", 1)
    watcher.subscribe("public/#", 1)
    # v3 clients are accepted with a will they may not publish; their node dies
    denied = client_factory(
        uid("d"), broker=a, version=V311, will={"topic": "secret/w", "payload": b"x", "qos": 1}
    )
    allowed = client_factory(
        uid("ok"), broker=a, version=V311, will={"topic": "public/w", "payload": b"y", "qos": 1}
    )
    a.kill()
    denied.stop()
    allowed.stop()
    got = watcher.wait_for(1, timeout=15)  # heartbeat TTL + reaper interval
    assert [m.topic for m in got] == ["public/w"]
    assert not watcher.drain(1.0)
    assert b.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 1
    assert "dropped the will of" in b.log()
