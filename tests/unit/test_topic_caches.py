"""The per-topic caches (the codec's topic bytes, the router's matches, ACL decisions) hold no topic longer
than 256 bytes: made-up topics cannot fill them, whatever their number (issue 25, item 6)."""

from __future__ import annotations

from fleetmq.broker import codec
from fleetmq.broker.auth import CACHE_LIMIT, Acl
from fleetmq.broker.codec import MQTT311, Parser, Publish, encode
from fleetmq.broker.router import Router, Subscription
from fleetmq.broker.topic import CACHED_TOPIC_MAX
from fleetmq.broker.zones import AclRule


def test_codec_topic_cache_keeps_no_long_topics():
    codec._TOPIC_CACHE.clear()
    p = Parser(version=MQTT311)
    for i in range(100):
        p.feed(encode(Publish(f"long/{i}/" + "t" * 60000, b"x", 0), MQTT311))
    p.feed(encode(Publish("short/topic", b"x", 0), MQTT311))
    assert max(len(k) for k in codec._TOPIC_CACHE) <= 256
    assert b"short/topic" in codec._TOPIC_CACHE


def test_codec_topic_cache_bytes_stay_bounded():
    codec._TOPIC_CACHE.clear()
    p = Parser(version=MQTT311)
    for i in range(10_000):
        p.feed(encode(Publish(f"{i}/" + "t" * 1000, b"x", 0), MQTT311))
    assert sum(len(k) for k in codec._TOPIC_CACHE) <= 4096 * 256


def test_router_cache_keeps_no_long_topics():
    r = Router()
    r.add("c", "a/+", Subscription())
    long_topic = "b/" + "t" * (CACHED_TOPIC_MAX * 4)
    for _ in range(3):
        assert r.match(long_topic, lambda cid: True) == []
    assert long_topic not in r._cache
    r.match("b/short", lambda cid: True)
    assert "b/short" in r._cache


def test_acl_caches_keep_no_long_topics():
    acl = Acl([AclRule(permission="deny", action="all", filter="secret/#")]).bind("u", "c")
    long_topic = "x/" + "t" * (CACHED_TOPIC_MAX * 4)
    assert acl.can_publish(long_topic) and acl.can_read(long_topic)
    assert not acl.can_publish("secret/" + "t" * 1000)
    assert acl._pub_cache == {} and acl._read_cache == {}
    for i in range(CACHE_LIMIT * 2):
        acl.can_publish(f"{i}/" + "t" * 200)
    assert sum(len(k) for k in acl._pub_cache) <= CACHE_LIMIT * CACHED_TOPIC_MAX
