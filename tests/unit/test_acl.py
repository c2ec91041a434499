"""Access control that cannot be walked around: filter relations, rule decisions and deliveries, each
checked against a brute-force reference over every topic of a small universe.

The references are written independently of broker code: topics are enumerated, and a filter is the set
of topics it matches.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from fleetmq.broker.auth import Access, Acl
from fleetmq.broker.codec import MQTT5, MQTT311, RC, Connect, Publish, Suback, SubOpts, Subscribe, Will
from fleetmq.broker.config import load_config
from fleetmq.broker.node import Node
from fleetmq.broker.topic import covers, overlaps, topic_matches
from fleetmq.broker.zones import AclRule
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes import Client, Clock, connected, settle
from tests.unit.topics_support import reference_match

# -----------------------------------------------------------------------------------------------
# the reference: filters as sets of topics
# -----------------------------------------------------------------------------------------------

# Literals used in filters, plus 'z' which no filter names (a witness for '+') and '$s' (a '$' topic).
FILTER_LEVELS = ["a", "b", "", "$s", "+"]
TOPIC_LEVELS = ["a", "b", "", "$s", "z"]
MAX_FILTER_LEVELS = 3  # plus an optional trailing '#'
UNIVERSE = [
    topic
    for n in range(1, MAX_FILTER_LEVELS + 3)
    for topic in ("/".join(levels) for levels in itertools.product(TOPIC_LEVELS, repeat=n))
    if topic  # the empty topic name is not valid
]


def topics_of(topic_filter: str) -> set[str]:
    return {t for t in UNIVERSE if reference_match(topic_filter, t)}


@st.composite
def filters(draw) -> str:
    levels = draw(st.lists(st.sampled_from(FILTER_LEVELS), min_size=0, max_size=MAX_FILTER_LEVELS))
    if levels == [""] or not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


topics = st.sampled_from(UNIVERSE)


ALL_FILTERS = sorted(
    {
        "/".join([*levels, *tail])
        for n in range(MAX_FILTER_LEVELS + 1)
        for levels in itertools.product(FILTER_LEVELS, repeat=n)
        for tail in ((), ("#",))
    }
    - {""}  # no levels at all: not a filter
)


def test_covers_and_overlaps_agree_with_topic_sets_for_every_pair():
    """Exhaustive over every filter of up to three levels (and a '#') of the universe's levels."""
    sets = {f: frozenset(topics_of(f)) for f in ALL_FILTERS}
    wrong = []
    for a in ALL_FILTERS:
        ta = sets[a]
        for b in ALL_FILTERS:
            tb = sets[b]
            if covers(a, b) != (tb <= ta) or overlaps(a, b) != (not ta.isdisjoint(tb)):
                wrong.append((a, b))
    assert not wrong, wrong[:20]


@settings(max_examples=200, deadline=None)
@given(f=filters(), t=topics)
def test_topic_matches_agrees_with_reference(f, t):
    assert topic_matches(f, t) == reference_match(f, t)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("secret/#", "#", True),
        ("secret/#", "+/x", True),
        ("secret/#", "+/+/#", True),
        ("secret/#", "public/#", False),
        ("a/#", "a", True),  # 'a/#' matches 'a' itself
        ("a/+", "a", False),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/+", True),
    ],
)
def test_overlap_examples(a, b, expected):
    assert overlaps(a, b) is expected


# -----------------------------------------------------------------------------------------------
# rule decisions
# -----------------------------------------------------------------------------------------------

rules_st = st.lists(
    st.tuples(
        st.sampled_from(["allow", "deny"]), st.sampled_from(["publish", "subscribe", "all"]), filters()
    ),
    max_size=5,
)


def make_acl(rules: list[tuple[str, str, str]], default: str) -> Acl:
    return Acl([AclRule(permission=p, action=a, filter=f) for p, a, f in rules], default)


def ref_decide(rules, default: str, action: str, topic: str) -> bool:
    for permission, rule_action, pattern in rules:
        if rule_action in (action, "all") and reference_match(pattern, topic):
            return permission == "allow"
    return default == "allow"


def ref_granted(rules, default: str, topic_filter: str) -> bool:
    """SUBSCRIBE as EMQX and mosquitto decide it: the first rule whose filter holds every topic of the
    subscription's filter decides, else the default."""
    mine = topics_of(topic_filter)
    for permission, rule_action, pattern in rules:
        if rule_action in ("subscribe", "all") and mine <= topics_of(pattern):
            return permission == "allow"
    return default == "allow"


@settings(max_examples=300, deadline=None)
@given(rules=rules_st, default=st.sampled_from(["allow", "deny"]), f=filters(), t=topics)
def test_decisions_agree_with_reference(rules, default, f, t):
    acl = make_acl(rules, default).bind("u", "c")
    assert acl.can_publish(t) == ref_decide(rules, default, "publish", t)
    assert acl.can_read(t) == ref_decide(rules, default, "subscribe", t)
    assert acl.can_read(t) == ref_decide(rules, default, "subscribe", t)  # the cached answer too
    access = acl.subscribe_access(f)
    assert (access is not Access.DENIED) == ref_granted(rules, default, f), access
    if access is Access.ALLOWED:  # no per-delivery check: so every topic it reaches must be readable
        denied = [x for x in topics_of(f) if not ref_decide(rules, default, "subscribe", x)]
        assert not denied, (f, denied)


def test_the_issue_cases():
    acl = make_acl([("deny", "subscribe", "secret/#"), ("allow", "all", "#")], "allow").bind(None, "c")
    assert acl.subscribe_access("secret/+") is Access.DENIED
    assert acl.subscribe_access("secret/#") is Access.DENIED
    for f in ("#", "+/#", "+/x"):
        assert acl.subscribe_access(f) is Access.FILTERED, f
    assert acl.subscribe_access("public/#") is Access.ALLOWED
    assert not acl.can_read("secret/x") and acl.can_read("public/x")
    assert acl.can_publish("secret/x")  # a subscribe rule does not restrict publishing


def test_zone_without_deny_rules_checks_nothing():
    acl = make_acl([("allow", "all", "#")], "allow").bind(None, "c")
    assert not acl.guards_read
    assert acl.subscribe_access("#") is Access.ALLOWED
    # deny rules about publishing only do not guard reading either
    acl = make_acl([("deny", "publish", "secret/#")], "allow").bind(None, "c")
    assert not acl.guards_read


def test_substitution_cannot_widen_an_allow_rule():
    rules = [("allow", "all", "users/%u/#"), ("allow", "all", "clients/%c/#"), ("deny", "all", "#")]
    acl = make_acl(rules, "deny")
    assert acl.bind("al", "c1").can_publish("users/al/x")
    assert not acl.bind(None, "c1").can_publish("users/al/x")  # a %u rule skips anonymous clients
    # a name with '/', '+' or '#' would reach other users' topics: the allow rule is left out
    assert not acl.bind("al/..", "c1").can_publish("users/al/../x")
    assert not acl.bind("+", "c1").can_publish("users/bo/x")
    assert not acl.bind("al", "#").can_publish("clients/other/x")
    assert acl.bind("al", "c1").can_publish("clients/c1/x")
    # while a deny rule is kept as substituted (it can only deny more)
    acl = make_acl([("deny", "publish", "clients/%c/#")], "allow")
    assert not acl.bind(None, "+").can_publish("clients/anyone/x")


# -----------------------------------------------------------------------------------------------
# deliveries: a subscriber never receives what its rules deny, and receives everything else
# -----------------------------------------------------------------------------------------------


def acl_node(rules, default: str, zone: str = "default", extra: dict | None = None) -> Node:
    zones: dict[str, Any] = {
        zone: {
            "acl": [{"permission": p, "action": a, "filter": f} for p, a, f in rules],
            "acl_default": default,
        }
    }
    zones.update(extra or {})
    return Node(load_config(overrides={"node_id": "t1", "zones": zones}))


def subscribe_many(c: Client, fs: list[str]) -> list[int]:
    """SUBSCRIBE and return the reason codes; what follows the SUBACK (retained messages) stays to be
    received."""
    c.send(Subscribe(1, [(f, SubOpts(qos=1)) for f in fs]))
    ack, *rest = c.received()
    assert type(ack) is Suback
    c._backlog = rest
    return ack.reason_codes


@settings(max_examples=150, deadline=None)
@given(
    rules=rules_st,
    default=st.sampled_from(["allow", "deny"]),
    fs=st.lists(filters(), min_size=1, max_size=3, unique=True),
    ts=st.lists(topics, min_size=1, max_size=8),
    shared=st.booleans(),
    retained=st.booleans(),
)
def test_subscriber_receives_exactly_what_its_rules_allow(rules, default, fs, ts, shared, retained):
    async def scenario() -> None:
        clock = Clock()
        node = acl_node(rules, default)
        # the publisher sits in a zone without rules: the subscriber's zone decides what it reads
        node.apply_config(
            load_config(
                overrides={
                    "node_id": "t1",
                    "zones": {"default": dict(node.config.zones["default"]), "open": {}},
                }
            )
        )
        sub = await connected(node, clock, "sub", MQTT5, clean_start=True)
        pub = await connected(node, clock, "pub", MQTT5, zone="open", clean_start=True)
        if retained:  # published before the SUBSCRIBE: sent on subscribe, where the rules apply too
            for t in ts:
                pub.send(Publish(t, b"r", qos=0, retain=True))
            await settle()
        codes = subscribe_many(sub, [f"$share/g/{f}" if shared else f for f in fs])
        granted = [f for f, rc in zip(fs, codes, strict=True) if rc < 0x80]
        for f, rc in zip(fs, codes, strict=True):
            assert (rc < 0x80) == ref_granted(rules, default, f), (f, rc)
            if rc >= 0x80:
                assert rc == RC.NOT_AUTHORIZED
        await settle()
        got = sub.received()
        if retained:
            for p in got:
                assert ref_decide(rules, default, "subscribe", p.topic), p.topic
            if not shared:  # shared subscriptions get no retained messages [MQTT-4.8.2-?]
                expect = {t for t in ts if any(reference_match(f, t) for f in granted)}
                expect = {t for t in expect if ref_decide(rules, default, "subscribe", t)}
                assert {p.topic for p in got} == expect
        for i, t in enumerate(ts):
            pub.send(Publish(t, b"%d" % i, qos=0))
        await settle()
        got = [p for p in sub.received() if type(p) is Publish]
        expect = [
            t
            for t in ts
            if any(reference_match(f, t) for f in granted) and ref_decide(rules, default, "subscribe", t)
        ]
        assert [p.topic for p in got] == expect

    asyncio.run(scenario())


async def test_live_acl_change_stops_deliveries_on_existing_subscriptions():
    clock = Clock()
    node = acl_node([], "allow")
    sub = await connected(node, clock, "sub", MQTT311, clean_start=False)
    assert subscribe_many(sub, ["#"]) == [1]
    pub = await connected(node, clock, "pub", MQTT311, clean_start=True)
    pub.send(Publish("secret/x", b"1", qos=0))
    await settle()
    assert [p.payload for p in sub.publishes()] == [b"1"]
    # the subscriber stops acking: QoS 1 deliveries fill its window and then its queue
    cfg = node.config.model_dump()
    cfg["zones"]["default"]["max_inflight"] = 1
    node.apply_config(load_config(overrides=cfg))
    node.cm.channels["sub"].apply_zone()
    pub.publish_each("secret/x", [b"q0", b"q1", b"q2"])
    await settle()
    sub.received()
    assert len(node.cm.channels["sub"].session.mqueue) == 2
    cfg["zones"]["default"]["acl"] = [{"permission": "deny", "action": "subscribe", "filter": "secret/#"}]
    node.apply_config(load_config(overrides=cfg))
    for ch in list(node.cm.channels.values()):
        ch.apply_zone()
    # what was queued is taken out (and counted), and nothing new arrives, without a reconnect
    assert len(node.cm.channels["sub"].session.mqueue) == 0
    assert node.metrics.zone("default").dropped["not_authorized"] == 2
    pub.send(Publish("secret/x", b"2", qos=0))
    pub.send(Publish("public/x", b"3", qos=0))
    await settle()
    assert [p.payload for p in sub.publishes()] == [b"3"]
    assert node.metrics.zone("default").dropped["not_authorized"] == 3


async def test_v5_will_on_a_denied_topic_is_refused_at_connect():
    clock = Clock()
    node = acl_node([("deny", "publish", "secret/#")], "allow")
    c = Client(node, clock, MQTT5)
    c.send(Connect("w", proto_level=MQTT5, will=Will("secret/w", b"bye")))
    await settle()
    [ack] = c.received()
    assert ack.reason_code == RC.NOT_AUTHORIZED
    assert "will" in ack.properties[0x1F]  # the reason string says why
    assert c.io.closed
    ok = Client(node, clock, MQTT5)
    ok.send(Connect("w", proto_level=MQTT5, will=Will("public/w", b"bye")))
    await settle()
    assert ok.received()[0].reason_code == 0


async def test_v3_will_on_a_denied_topic_is_dropped_when_due():
    clock = Clock()
    node = acl_node([("deny", "publish", "secret/#")], "allow")
    watcher = await connected(node, clock, "watch", MQTT311, clean_start=True)
    assert subscribe_many(watcher, ["#"]) == [1]
    c = Client(node, clock, MQTT311)
    c.send(Connect("w", proto_level=MQTT311, will=Will("secret/w", b"bye")))
    await settle()
    assert c.received()[0].reason_code == 0
    c.ch.connection_lost()
    await settle()
    assert watcher.received() == []
    assert node.metrics.zone("default").dropped["not_authorized"] == 1


def test_user_rules_come_before_the_zones_and_only_for_that_user():
    zone = [AclRule(permission="deny", action="publish", filter="devices/#")]
    own = {"dev": [AclRule(permission="allow", action="publish", filter="devices/%u/#")]}
    acl = Acl(zone, "allow", own)
    dev = acl.bind("dev", "c1")
    assert dev.can_publish("devices/dev/t")
    assert not dev.can_publish("devices/other/t")
    assert not acl.bind("other", "c2").can_publish("devices/other/t")  # another user's rules never apply
    assert not acl.bind(None, "c3").can_publish("devices/dev/t")  # nor to anonymous clients
    assert dev.subscribe_access("devices/#") is Access.ALLOWED  # reading: no rule, the default


def test_a_rule_may_name_the_clients_address_and_does_not_apply_where_it_is_unknown():
    rules = [AclRule(permission="allow", filter="sites/%a/#"), AclRule(permission="deny", filter="#")]
    acl = Acl(rules)
    assert acl.bind("u", "c", (), "203.0.113.7").can_publish("sites/203.0.113.7/t")
    assert not acl.bind("u", "c", (), "203.0.113.7").can_publish("sites/10.0.0.1/t")
    assert not acl.bind("u", "c").can_publish("sites//t")  # (no address: the rule is left out)


def test_clients_the_rules_do_not_name_share_one_bound_view():
    """Without %u/%c/%a in the zone's rules, a client without rules of its own (user's, an identity's, an
    authorization service) gets the view every such client gets: one object and its caches, not one per
    connection. Any of those makes the view its own."""
    rule = AclRule(permission="deny", action="all", filter="secret/#")
    acl = Acl(
        [rule], default="allow", user_rules={"bob": [AclRule(permission="deny", action="all", filter="b")]}
    )
    a, b = acl.bind("alice", "c1"), acl.bind(None, "c2", peerhost="10.0.0.1")
    assert a is b and not a.can_read("secret/x") and a.can_read("b")
    own = acl.bind("alice", "c3", own=[AclRule(permission="deny", action="all", filter="own")])
    bob = acl.bind("bob", "c4")
    assert own is not a and not own.can_read("own") and a.can_read("own")
    assert bob is not a and not bob.can_read("b")
    named = Acl([AclRule(permission="allow", action="all", filter="%c/#")], default="deny")
    c5, c6 = named.bind(None, "c5"), named.bind(None, "c6")
    assert c5 is not c6 and c5.can_read("c5/x") and not c6.can_read("c5/x")
    assert Acl([rule]).bind(None, "c1") is not a, "new rules, a new view"
