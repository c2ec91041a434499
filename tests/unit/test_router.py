"""Unit tests of topic routing (fleetmq.broker.router) and the retained-message index that uses it."""

from __future__ import annotations

import time

import pytest
from fleetmq.broker.message import Message
from fleetmq.broker.retained import Retained
from fleetmq.broker.router import Router, Subscription
from fleetmq.broker.topic import parse_share, topic_matches, valid_filter
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topics_support import reference_match


def everyone_online(_cid: str) -> bool:
    return True


def clients(router: Router, topic: str, online=everyone_online) -> list[str]:
    return sorted(cid for cid, _ in router.match(topic, online))


def router_with(*pairs: tuple[str, str]) -> Router:
    r = Router()
    for cid, f in pairs:
        r.add(cid, f, Subscription(qos=1))
    return r


# -----------------------------------------------------------------------------------------------
# matching
# -----------------------------------------------------------------------------------------------


def test_exact_filter_matches_only_its_topic():
    r = router_with(("c1", "a/b"))
    assert clients(r, "a/b") == ["c1"]
    for other in ("a", "a/b/c", "a/c", "A/b", "a/b/", "/a/b"):
        assert clients(r, other) == [], other


def test_match_returns_the_subscription_object():
    r = Router()
    sub = Subscription(qos=2, no_local=True, sub_id=7)
    assert r.add("c1", "x/+", sub) is True
    [(cid, got)] = r.match("x/y", everyone_online)
    assert cid == "c1" and got is sub


@pytest.mark.parametrize(
    ("topic_filter", "matching", "not_matching"),
    [
        ("a/+/c", ["a/b/c", "a//c", "a/x/c"], ["a/c", "a/b/b/c", "a/b/c/d", "b/b/c"]),
        ("+", ["a", "b", ""], ["a/b", "/a"]),
        ("+/+", ["a/b", "/x", "x/", "/"], ["a", "a/b/c"]),
        ("a/#", ["a", "a/b", "a/b/c", "a/"], ["b", "ab", "b/a"]),
        ("#", ["a", "a/b", "/", "x/y/z"], []),
        ("+/#", ["a", "a/b", "a/b/c"], []),
        ("a/+/#", ["a/b", "a/b/c", "a/b/c/d"], ["a", "b/c"]),
        ("/+", ["/a", "/"], ["a", "a/b", "//a"]),
    ],
)
def test_wildcards(topic_filter, matching, not_matching):
    r = router_with(("c1", topic_filter))
    for t in matching:
        if t:  # the empty topic is not a valid PUBLISH topic; topic_matches still defines it
            assert clients(r, t) == ["c1"], (topic_filter, t)
        assert topic_matches(topic_filter, t), (topic_filter, t)
    for t in not_matching:
        assert clients(r, t) == [], (topic_filter, t)
        assert not topic_matches(topic_filter, t), (topic_filter, t)


def test_dollar_topics_not_matched_by_root_wildcards():
    r = router_with(
        ("hash", "#"), ("plus", "+/x"), ("plusall", "+/#"), ("sys", "$SYS/#"), ("sysplus", "$SYS/+")
    )
    assert clients(r, "$SYS/x") == ["sys", "sysplus"]
    assert clients(r, "$SYS") == ["sys"]  # '$SYS/#' includes the parent level
    assert clients(r, "$SYS/x/y") == ["sys"]
    assert clients(r, "$other/x") == []
    assert clients(r, "a/x") == ["hash", "plus", "plusall"]
    # '$' in a non-first level is an ordinary character
    assert clients(r, "a/$x") == ["hash", "plusall"]
    assert not topic_matches("#", "$SYS/x")
    assert not topic_matches("+/x", "$SYS/x")
    assert topic_matches("$SYS/#", "$SYS/x")


def test_several_clients_and_filters():
    r = router_with(("c1", "a/b"), ("c2", "a/b"), ("c3", "a/+"), ("c4", "#"), ("c5", "b/#"))
    assert clients(r, "a/b") == ["c1", "c2", "c3", "c4"]
    assert clients(r, "b") == ["c4", "c5"]
    # one client with overlapping filters appears once per filter (the node merges them)
    r.add("c1", "a/#", Subscription(qos=0))
    assert clients(r, "a/b") == ["c1", "c1", "c2", "c3", "c4"]


def test_add_replaces_subscription_of_same_client():
    r = Router()
    assert r.add("c1", "a/+", Subscription(qos=0)) is True
    assert r.add("c1", "a/+", Subscription(qos=2)) is False
    [(_, sub)] = r.match("a/b", everyone_online)
    assert sub.qos == 2
    assert r.filters() == 1


# -----------------------------------------------------------------------------------------------
# removal
# -----------------------------------------------------------------------------------------------


def test_a_clients_filters_are_kept_whether_it_has_one_or_several():
    """(One filter is kept as itself, more as a set: the transitions both ways lose nothing.)"""
    r = router_with(("c1", "a"), ("c1", "a"), ("c2", "x"))
    assert r.filters_of("c1") == {"a"} and r.subscriptions("c1").keys() == {"a"}
    r.add("c1", "$share/g/b/+", Subscription(qos=1))
    r.add("c1", "c/#", Subscription(qos=1))
    assert r.filters_of("c1") == {"a", "$share/g/b/+", "c/#"}
    assert r.subscriptions("c1").keys() == {"a", "$share/g/b/+", "c/#"}
    assert r.remove("c1", "a") and r.remove("c1", "c/#")
    assert r.filters_of("c1") == {"$share/g/b/+"}
    assert r.remove("c1", "$share/g/b/+") and r.filters_of("c1") == set() and r.clients() == ["c2"]
    assert r.remove("c2", "y") is False and r.filters_of("c2") == {"x"}
    assert r.remove_client("c2") == ["x"] and r.clients() == [] and clients(r, "x") == []


def test_remove_stops_matching_and_prunes_the_trie():
    r = router_with(("c1", "a/+/c/#"), ("c1", "a/b"), ("c2", "a/+/c/#"))
    assert r.remove("c1", "a/+/c/#") is True
    assert clients(r, "a/x/c/d") == ["c2"]
    assert r.remove("c2", "a/+/c/#") is True
    assert clients(r, "a/x/c/d") == []
    assert r._root.children == {}  # every emptied branch is pruned
    assert r.remove("c1", "a/b") is True
    assert clients(r, "a/b") == []
    assert r._exact == {}
    assert r.filters() == 0


def test_remove_keeps_sibling_branches():
    r = router_with(("c1", "a/+/x"), ("c2", "a/+"), ("c3", "a/#"))
    assert r.remove("c1", "a/+/x")
    assert clients(r, "a/b") == ["c2", "c3"]
    assert clients(r, "a/b/x") == ["c3"]
    assert r.remove("c3", "a/#")
    assert clients(r, "a/b") == ["c2"]
    assert clients(r, "a") == []


def test_remove_unknown_returns_false():
    r = router_with(("c1", "a/+"), ("c1", "x"))
    assert r.remove("c2", "a/+") is False
    assert r.remove("c1", "a/#") is False
    assert r.remove("c1", "a/+/b") is False
    assert r.remove("c1", "y") is False
    assert r.remove("c1", "$share/g/a/+") is False
    assert clients(r, "a/b") == ["c1"]
    assert r.filters() == 2
    assert r.remove("c1", "a/+") is True
    assert r.remove("c1", "a/+") is False
    assert r.filters() == 1


# -----------------------------------------------------------------------------------------------
# shared subscriptions
# -----------------------------------------------------------------------------------------------


def test_parse_share():
    assert parse_share("$share/g/a/b") == ("g", "a/b")
    assert parse_share("a/b") == (None, "a/b")
    assert parse_share("$share/g") == ("g", "")


def test_shared_subscription_round_robin():
    r = router_with(("c1", "$share/g/t/#"), ("c2", "$share/g/t/#"), ("c3", "$share/g/t/#"))
    picks = []
    for _ in range(6):
        got = r.match("t/x", everyone_online)
        assert len(got) == 1  # exactly one member per message
        picks.append(got[0][0])
    assert picks == ["c1", "c2", "c3", "c1", "c2", "c3"]
    [(_, sub)] = r.match("t/y", everyone_online)
    assert sub.group == "g"
    assert r.match("u/x", everyone_online) == []


def test_shared_subscription_prefers_online_members():
    r = router_with(("c1", "$share/g/t"), ("c2", "$share/g/t"), ("c3", "$share/g/t"))
    online = {"c1", "c3"}
    picks = [r.match("t", online.__contains__)[0][0] for _ in range(6)]
    assert picks == ["c1", "c3", "c1", "c3", "c1", "c3"]
    online = {"c2"}
    assert {r.match("t", online.__contains__)[0][0] for _ in range(4)} == {"c2"}


def test_shared_subscription_all_offline_still_picks_one_round_robin():
    r = router_with(("c1", "$share/g/t"), ("c2", "$share/g/t"))
    picks = [r.match("t", lambda _c: False)[0][0] for _ in range(4)]
    assert sorted(picks) == ["c1", "c1", "c2", "c2"]


def test_shared_groups_and_normal_subscriptions_each_get_a_copy():
    r = router_with(
        ("a1", "$share/ga/t/+"),
        ("a2", "$share/ga/t/+"),
        ("b1", "$share/gb/t/+"),
        ("n", "t/+"),
    )
    for _ in range(4):
        got = clients(r, "t/1")
        assert len(got) == 3
        assert "n" in got and "b1" in got
        assert ("a1" in got) != ("a2" in got)


def test_shared_member_removal():
    r = router_with(("c1", "$share/g/t"), ("c2", "$share/g/t"))
    assert r.remove("c1", "$share/g/t") is True
    assert {r.match("t", everyone_online)[0][0] for _ in range(3)} == {"c2"}
    assert r.remove("c2", "$share/g/t") is True
    assert r.match("t", everyone_online) == []
    assert r._groups == {}
    assert r.filters() == 0


# -----------------------------------------------------------------------------------------------
# filter syntax
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f",
    [
        "a",
        "a/b",
        "#",
        "+",
        "a/#",
        "a/+/b",
        "+/+/#",
        "/",
        "a//b",
        "$SYS/#",
        "$share/g/a/#",
        "$share/g/+",
        "a b",
    ],
)
def test_valid_filters(f):
    assert valid_filter(f)


@pytest.mark.parametrize(
    "f",
    [
        "",
        "#/a",
        "a/#/b",
        "a#",
        "a/b#",
        "#a",
        "a+",
        "a/+b",
        "+a/b",
        "a/++",
        "$share/g",  # no filter
        "$share/g/",  # empty filter
        "$share//x",  # empty group
        "$share/g+/x",
        "$share/g#/x",
        "$share/g/a/#/b",
    ],
)
def test_invalid_filters(f):
    assert not valid_filter(f)


# -----------------------------------------------------------------------------------------------
# property: Router.match and topic_matches agree with a reference matcher
# -----------------------------------------------------------------------------------------------


LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "sport"])
topics = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw):
    levels = draw(st.lists(st.sampled_from(["a", "b", "", "$SYS", "+", "sport"]), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    f = "/".join(levels)
    return f or "#"


@settings(max_examples=50, deadline=None)
@given(
    fs=st.lists(filters(), min_size=1, max_size=6, unique=True), ts=st.lists(topics, min_size=1, max_size=8)
)
def test_router_match_agrees_with_topic_matches(fs, ts):
    r = Router()
    for i, f in enumerate(fs):
        assert valid_filter(f), f
        r.add(f"c{i}", f, Subscription())
    for t in ts:
        expected = sorted(f"c{i}" for i, f in enumerate(fs) if reference_match(f, t))
        assert clients(r, t) == expected, (fs, t)
        for f in fs:
            assert topic_matches(f, t) == reference_match(f, t), (f, t)
    # and after removing every other filter
    for i, f in enumerate(fs):
        if i % 2 == 0:
            assert r.remove(f"c{i}", f)
    for t in ts:
        expected = sorted(f"c{i}" for i, f in enumerate(fs) if i % 2 and reference_match(f, t))
        assert clients(r, t) == expected, (fs, t)


@settings(max_examples=40, deadline=None)
@given(f=filters(), ts=st.lists(topics, min_size=1, max_size=6))
def test_shared_group_matches_like_plain_filter(f, ts):
    r = Router()
    r.add("m", f"$share/g/{f}", Subscription())
    for t in ts:
        assert bool(r.match(t, everyone_online)) == reference_match(f, t), (f, t)


# -----------------------------------------------------------------------------------------------
# retained messages
# -----------------------------------------------------------------------------------------------


def test_retained_put_match_and_clear():
    ret = Retained()
    now = time.time()
    ret.put(Message("a/b", b"1", 1, retain=True))
    ret.put(Message("a/c", b"2", 0, retain=True))
    ret.put(Message("$SYS/x", b"s", 0, retain=True))
    assert [m.payload for m in ret.match("a/b", now)] == [b"1"]
    assert sorted(m.payload for m in ret.match("a/+", now)) == [b"1", b"2"]
    assert sorted(m.payload for m in ret.match("#", now)) == [b"1", b"2"]  # not $SYS
    assert [m.payload for m in ret.match("$SYS/#", now)] == [b"s"]
    ret.put(Message("a/b", b"new", 1, retain=True))
    assert [m.payload for m in ret.match("a/b", now)] == [b"new"]
    ret.put(Message("a/b", b"", 0, retain=True))  # empty payload clears
    assert ret.match("a/b", now) == []
    assert len(ret) == 2


def test_retained_expired_messages_are_not_returned():
    ret = Retained()
    ret.put(Message("e", b"x", 0, retain=True, expiry=10, ts=1000.0))
    assert len(ret.match("e", 1005.0)) == 1
    assert ret.match("e", 1010.0) == []
    assert len(ret) == 0


def test_match_cache_follows_subscription_changes():
    """Matches are cached per topic; every wildcard or shared change must show in the next match."""
    r = Router()
    online = lambda cid: True  # noqa: E731
    r.add("a", "x/+", Subscription(qos=1))
    assert [c for c, _ in r.match("x/1", online)] == ["a"]
    r.add("b", "x/+", Subscription(qos=0))  # same trie node, no structural change
    r.add("c", "x/#", Subscription(qos=0))
    assert sorted(c for c, _ in r.match("x/1", online)) == ["a", "b", "c"]
    r.remove("a", "x/+")
    r.add("d", "$share/g/x/1", Subscription())
    assert sorted(c for c, _ in r.match("x/1", online)) == ["b", "c", "d"]
    r.remove("b", "x/+")
    r.remove("c", "x/#")
    r.remove("d", "$share/g/x/1")
    assert r.match("x/1", online) == []
    r.add("e", "x/+", Subscription())  # a node pruned above is created anew
    assert [c for c, _ in r.match("x/1", online)] == ["e"]


def test_an_exact_topic_goes_from_one_subscriber_to_many_and_back():
    """A topic's only subscriber is kept as its (client id, subscription) pair, past it a dict: every step
    routes, replaces and removes as the other shape does."""
    r = Router()
    first, second, again = Subscription(qos=0), Subscription(qos=1), Subscription(qos=2)
    assert r.add("a", "t/1", first) is True
    assert r.match("t/1", everyone_online) == [("a", first)]
    assert r.add("a", "t/1", again) is False  # (replaced: still one subscriber)
    assert r.match("t/1", everyone_online) == [("a", again)]
    assert r.add("b", "t/1", second) is True
    assert sorted(r.match("t/1", everyone_online), key=lambda m: m[0]) == [("a", again), ("b", second)]
    assert r.subscriptions("b") == {"t/1": second}
    assert r.remove("c", "t/1") is False
    assert r.remove("a", "t/1") is True
    assert r.match("t/1", everyone_online) == [("b", second)]
    assert r.subscriptions("a") == {} and r.subscriptions("b") == {"t/1": second}
    assert r.remove("a", "t/1") is False
    assert r.filters() == 1
    assert r.remove("b", "t/1") is True
    assert r.match("t/1", everyone_online) == [] and r.filters() == 0


def test_plain_subscriptions_with_the_same_options_share_one_and_a_shared_one_has_its_own():
    from fleetmq.broker.router import plain_subscription

    a, b = plain_subscription(1, False, False, 0), plain_subscription(1, False, False, 0)
    assert a is b and a == Subscription(qos=1)
    assert plain_subscription(2, False, False, 0) is not a
    assert plain_subscription(1, True, False, 0).no_local
    r = Router()
    r.add("c1", "t/a", a)
    r.add("c2", "t/a", b)
    own = Subscription(qos=1)
    r.add("c3", "$share/g/t/a", own)
    assert own.group == "g" and a.group is None  # (the router marks only a shared subscription's own)
    assert sorted(cid for cid, _ in r.match("t/a", everyone_online)) == ["c1", "c2", "c3"]
