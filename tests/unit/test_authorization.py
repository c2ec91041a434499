"""Issue 28: a client's authorization service (an http authenticator's acl_url), on the channel's side.

The channel is sans-I/O: before a PUBLISH or SUBSCRIBE that needs an answer it stops reading and asks its
host; the host's answer (tests/fakes.FakeHost.answer) lets the waiting packets through, in order. The
answers are kept per client (auth.Asked) and read by its ClientAcl before the zone's rules.
"""

from __future__ import annotations

from types import SimpleNamespace

from fleetmq.broker.auth import ASKED_CHARS, Access, Acl, Asked
from fleetmq.broker.authn.chain import Identity
from fleetmq.broker.codec import MQTT5, RC, Prop, Puback, Publish, Suback, SubOpts, Subscribe
from fleetmq.broker.zones import AclRule

from tests.fakes import FakeHost
from tests.unit.test_channel_alone import Peer


def rule(permission: str, action: str, topic: str) -> AclRule:
    return AclRule(permission=permission, action=action, filter=topic)


# -- the answers kept --------------------------------------------------------------------------------
def test_an_answer_holds_for_its_ttl_then_is_due_again():
    asked = Asked(ttl=30)
    assert asked.due("publish", "a", 0.0)
    asked.put([("publish", "a", True)], 0.0)
    asked.settle()
    assert not asked.due("publish", "a", 29.0) and asked.answer("publish", "a") is True
    assert asked.due("publish", "a", 30.0)
    assert asked.due("publish", "b", 1.0) and asked.answer("publish", "b") is None


def test_with_no_ttl_an_answer_holds_only_for_the_packets_that_waited_for_it():
    asked = Asked(ttl=0)
    asked.put([("subscribe", "a/#", False)], 5.0)
    assert not asked.due("subscribe", "a/#", 6.0), "the waiting SUBSCRIBE is decided by it"
    asked.settle()
    assert asked.due("subscribe", "a/#", 6.0)


def test_answers_are_bounded_by_topic_characters_keeping_the_latest_round():
    asked = Asked(ttl=60)
    for i in range(100):
        asked.put([("publish", f"{i:04d}/" + "x" * 1019, True)], 0.0)
        asked.settle()
    kept = [i for i in range(100) if asked.answer("publish", f"{i:04d}/" + "x" * 1019) is not None]
    assert len(kept) * 1024 <= ASKED_CHARS and kept[-1] == 99 and kept == list(range(100 - len(kept), 100))
    huge = "h" * (2 * ASKED_CHARS)
    asked.put([("publish", huge, False)], 0.0)
    assert asked.answer("publish", huge) is False, "the round being handled is never dropped"


# -- the rules with a service's answers ------------------------------------------------------------------
def test_the_service_decides_before_the_rules_and_ignore_leaves_it_to_them():
    acl = Acl([rule("allow", "all", "open/#"), rule("deny", "all", "closed/#")], default="deny")
    asked = Asked(ttl=60)
    bound = acl.bind("u", "c", asked=asked)
    asked.put([("publish", "closed/x", True), ("publish", "open/x", False), ("publish", "other", None)], 0.0)
    assert bound.can_publish("closed/x") is True
    assert bound.can_publish("open/x") is False
    assert bound.can_publish("other") is False, "ignored: the zone's default (deny) decides"
    assert bound.can_publish("open/y") is True, "never asked: the rules decide"
    asked.put(
        [("subscribe", "s/#", True), ("subscribe", "closed/#", True), ("subscribe", "open/#", False)], 0
    )
    assert bound.subscribe_access("s/#") is Access.ALLOWED
    assert bound.subscribe_access("closed/#") is Access.FILTERED, "a deny rule still holds for deliveries"
    assert bound.subscribe_access("open/#") is Access.DENIED
    assert bound.can_read("s/1") is True, "a service-decided client reads what no deny rule reaches"
    assert bound.can_read("closed/1") is False


# -- the channel -------------------------------------------------------------------------------------
def asking_peer(ttl: float = 30.0, **settings) -> tuple[FakeHost, Peer]:
    host = FakeHost()
    peer = Peer(host, MQTT5, acl_default="deny", **settings)
    peer.connect()
    peer.ch.authenticated(Identity(authorizer=SimpleNamespace(ttl=ttl)))
    return host, peer


def test_a_publish_waits_for_the_service_and_what_follows_it_keeps_its_order():
    host, peer = asking_peer()
    peer.send(Publish("t/1", b"one", 1, packet_id=1), Publish("t/2", b"two", 1, packet_id=2))
    assert peer.io.paused and host.published == [] and peer.received() == []
    assert host.answer({("publish", "t/1"): True}) == [("publish", "t/1")]
    assert [m.payload for m in host.published] == [b"one"]
    assert host.answer({("publish", "t/2"): False}) == [("publish", "t/2")]
    assert [m.payload for m in host.published] == [b"one"], "denied: not routed"
    host.commit()
    assert peer.received() == [Puback(1, 0), Puback(2, RC.NOT_AUTHORIZED)]
    assert not peer.io.paused
    peer.send(Publish("t/1", b"again", 1, packet_id=3))
    assert host.asking == [], "answered within its ttl: not asked again"
    assert [m.payload for m in host.published] == [b"one", b"again"]
    host.commit()
    assert peer.received() == [Puback(3, 0)]


def test_an_aliased_publish_is_asked_by_its_topic_and_the_alias_still_registers():
    host, peer = asking_peer()
    peer.send(Publish("long/topic", b"1", 1, packet_id=1, properties={Prop.TOPIC_ALIAS: 3}))
    host.answer({("publish", "long/topic"): True})
    peer.send(Publish("", b"2", 1, packet_id=2, properties={Prop.TOPIC_ALIAS: 3}))
    assert host.asking == []
    assert [(m.topic, m.payload) for m in host.published] == [("long/topic", b"1"), ("long/topic", b"2")]


def test_a_subscribe_asks_each_filter_once_without_its_share_group():
    host, peer = asking_peer()
    opts = SubOpts(qos=1)
    peer.send(Subscribe(1, [("a/#", opts), ("$share/g/b/+", opts), ("b/+", opts), ("c", opts)]))
    asked = host.answer({("subscribe", "a/#"): True, ("subscribe", "b/+"): True, ("subscribe", "c"): None})
    assert asked == [("subscribe", "a/#"), ("subscribe", "b/+"), ("subscribe", "c")]
    host.commit()
    [ack] = peer.received()
    assert ack == Suback(1, [1, 1, 1, RC.NOT_AUTHORIZED])  # c: ignored, and the zone's default denies
    assert set(host.subscribed) == {"a/#", "$share/g/b/+", "b/+"}


def test_with_no_ttl_every_publish_is_asked():
    host, peer = asking_peer(ttl=0.0)
    for pid in (1, 2):
        peer.send(Publish("t", b"%d" % pid, 1, packet_id=pid))
        assert host.answer({("publish", "t"): True}) == [("publish", "t")]
    assert len(host.published) == 2


def test_a_client_without_a_service_is_never_held():
    host = FakeHost(durable=False)
    peer = Peer(host, MQTT5)
    peer.connect()
    peer.send(Publish("t", b"x", 1, packet_id=1))
    assert host.asking == [] and len(host.published) == 1 and not peer.io.paused
