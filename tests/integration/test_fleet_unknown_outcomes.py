"""Issue 25: a store call whose outcome is unknown (Redis ran it, its reply never came back) is never taken
for one that did not run, and a client resending after an outage gets each QoS 2 message once, whichever
node it resumes on. Each test puts the fault at one point of one path: a proxy between a node and Redis
(tests/redisproxy.py) lets a request through and loses its reply, or a node runs on another clock; each
failed before its fix."""

from __future__ import annotations

import shutil
import time

import pytest
from fleetmq.broker.store import keys

from tests.integration import mqttraw
from tests.integration.fleet_support import (
    AppView,
    ack_loop,
    app_deliveries,
    closed_without,
    parse_seq,
    publish_qos2,
    raw_connect,
    resend_after_an_unknown_outcome,
    seq_payload,
    sha,
    wait_route,
    will_client,
)
from tests.integration.harness import MOSQUITTO, Client, uid
from tests.integration.mqttraw import PUBREC
from tests.support import wait_until

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")

#: a node on a host that booted a day before the others: its monotonic clock is a day ahead
DAY_AHEAD = ("unshare", "-T", "--monotonic", "86400")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare (time namespaces)")
def test_a_qos2_receipt_resumed_on_a_node_with_another_monotonic_clock_is_kept(fleet):
    """An awaiting-PUBREL record was stored with the monotonic time of the node that received it, and read
    as a time of the clock of the node that restored it. On a node whose host booted earlier (every
    Kubernetes node has its own clock), the record looked older than await_rel_timeout and was discarded
    at once, so the client's resend was routed again: every subscriber got the message twice."""
    [a] = fleet(1)
    [b] = fleet(1, wrap=DAY_AHEAD)
    topic = uid("clock/")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(a, sub, topic)
    pcid = uid("pub")
    pub, _ = raw_connect(a, pcid, 5)
    pub.send(mqttraw.publish(topic, seq_payload("c", 1), qos=2, packet_id=21, version=5))
    pub.expect(PUBREC)  # stored: a's record of packet id 21, awaiting PUBREL
    pub.close()  # the PUBREC is lost with the connection, as far as the client knows
    pub, ack = raw_connect(b, pcid, 5)
    assert ack.session_present
    time.sleep(0.3)  # (b's timer for the record it restored has had its chance)
    publish_qos2(pub, topic, seq_payload("c", 1), 21, dup=True)
    assert app_deliveries(sub) == [("c", 1)], "a QoS 2 message reached the subscriber twice"


def test_a_session_parked_in_a_failed_commit_is_parked_when_the_store_answers(
    fleet, redis_server, redis_proxy
):
    """A client dropped off with a will delay: its node parks the session (offline, its expiry as TTL, the
    will and when it is due). When that commit failed, the park was never sent again: the session stayed
    marked online at the node for good, with no TTL, and the will was never published (its node's timer
    found no will due in the store). Idempotent writes of a failed commit now go out again."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("parked/")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(topic, 1)
    cid = uid("w")
    w = will_client(a, cid, topic, b"due", delay=1)
    cut = redis_proxy.cut_after(b"EVALSHA", sha("park"))  # the commit's MULTI never gets its EXEC
    w.stop()  # gone without DISCONNECT: parked, its will due in 1 s
    assert cut.wait(5), "the park never went through the proxy"
    got, _ = watcher.wait_topic(topic, timeout=10)
    assert got.payload == b"due"
    meta = keys.session_keys(cid)[keys.META]
    assert redis_server.command("HGET", meta, "online") == b"0"
    assert redis_server.command("PTTL", meta) > 0, "a parked session expires with its session expiry"
    watcher.disconnect()


def test_a_session_ended_in_a_failed_commit_is_ended_when_the_store_answers(fleet, redis_server, redis_proxy):
    """A clean session ends when its client leaves. When that commit failed, the session stayed in the
    store for good (no TTL), still in the fleet's route table: what other nodes routed to it piled up in
    its queue, which is never trimmed while it is marked online."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("ended/")
    cid = uid("clean")
    c, _ = raw_connect(a, cid, 4, clean=True)
    c.subscribe([(topic, 1)])
    wait_route(b, c, topic)
    cut = redis_proxy.cut_after(b"EVALSHA", sha("discard"))
    c.close()
    assert cut.wait(5), "the discard never went through the proxy"
    wait_until(
        lambda: not redis_server.keys(f"fmq:{{{cid}}}:*"), timeout=10, msg="the ended session left the store"
    )


def _parked_with_a_will(a, cid: str, topic: str, will_topic: str) -> None:
    """A persistent v5 session on `a` subscribed to `topic`, whose client dropped off with a will due in
    60 s: parked in the store, the will waiting."""
    c = mqttraw.RawClient(a.host, a.port, version=5)
    c.connect(
        cid,
        clean=False,
        props={"session_expiry_interval": 300},
        will={"topic": will_topic, "payload": b"ended", "qos": 1, "props": {"will_delay_interval": 60}},
    )
    c.subscribe([(topic, 1)])
    c.close()  # no DISCONNECT: the will waits for its delay


def test_a_clean_start_claim_sent_again_after_its_reply_was_lost_gets_the_same_answer(fleet, redis_proxy):
    """A claim is sent again on a fresh connection when its reply is lost. Run twice, a Clean Start claim
    ended the stored session the first time and the fresh one it had just made the second time, and
    answered as if there had been nothing to end: the node kept routing the old subscriptions to the new
    session (which never subscribed), and the old session's waiting will, due at its end, was never
    published."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic, will_topic, cid = uid("cs/"), uid("csw/"), uid("c")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(will_topic, 1)
    _parked_with_a_will(a, cid, topic, will_topic)
    time.sleep(0.3)
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("claim"))
    c = mqttraw.RawClient(a.host, a.port, version=5)
    ack = c.connect(cid, clean=True, props={"session_expiry_interval": 300})
    assert lost.is_set(), "the claim never went through the proxy"
    assert not ack.session_present
    got, _ = watcher.wait_topic(will_topic, timeout=5)
    assert got.payload == b"ended", "the will of the session Clean Start ended"
    assert not [m for m in watcher.drain(1.0) if m.topic == will_topic], "the will published twice"
    pub, _ = raw_connect(a, uid("pub"), 5, clean=True)
    pub.send(mqttraw.publish(topic, b"old subscription", qos=1, packet_id=1, version=5))
    pub.expect(mqttraw.PUBACK)
    assert c.recv(1.0) is None, "a message for a subscription of the session Clean Start ended"
    watcher.disconnect()


def test_a_claim_whose_client_was_refused_is_read_back_and_undone(fleet, redis_server, redis_proxy):
    """A claim ran but neither it nor its resend was answered (Redis went away): the client was refused
    (server unavailable), yet the store kept its session marked connected to the node for good, with no
    TTL. Once Redis answers, the node reads the claim back and parks the session again."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    topic, cid = uid("rb/"), uid("c")
    c = mqttraw.RawClient(a.host, a.port, version=5)
    c.connect(cid, clean=False, props={"session_expiry_interval": 300})
    c.subscribe([(topic, 1)])
    c.send(mqttraw.disconnect(version=5))
    c.close()
    meta = keys.session_keys(cid)[keys.META]
    wait_until(lambda: redis_server.command("HGET", meta, "online") == b"0", timeout=5, msg="parked")
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("claim"))
    c = mqttraw.RawClient(a.host, a.port, version=5, timeout=15)
    c.send(mqttraw.connect(cid, version=5, clean=False, props={"session_expiry_interval": 300}))
    assert lost.wait(5), "the claim never went through the proxy"
    redis_proxy.hold(True)  # the resend gets no answer either
    ack = c.expect(mqttraw.CONNACK, timeout=15)
    assert ack.reason == 0x88, ack
    assert redis_server.command("HGET", meta, "online") == b"1", "(the claim ran)"
    redis_proxy.hold(False)
    wait_until(
        lambda: redis_server.command("HGET", meta, "online") == b"0", timeout=10, msg="the claim undone"
    )
    assert redis_server.command("PTTL", meta) > 0
    c, ack = raw_connect(a, cid, 5)
    assert ack.session_present, "the session is still there for its client"


def test_the_will_of_a_session_clean_start_ends_is_published_once(fleet):
    """A client reconnecting with Clean Start to the node that parked its session: the node published the
    waiting will from its own memory, and again as the claim's answer (the store's copy)."""
    [a] = fleet(1)
    topic, will_topic, cid = uid("cs/"), uid("csw/"), uid("c")
    watcher = Client(a.host, a.port, uid("watch"), version=5)
    watcher.subscribe(will_topic, 1)
    _parked_with_a_will(a, cid, topic, will_topic)
    time.sleep(0.3)
    c = mqttraw.RawClient(a.host, a.port, version=5)
    c.connect(cid, clean=True, props={"session_expiry_interval": 300})
    got, _ = watcher.wait_topic(will_topic, timeout=5)
    assert got.payload == b"ended"
    assert not [m for m in watcher.drain(1.0) if m.topic == will_topic], "the will published twice"
    watcher.disconnect()


def test_a_reconnect_during_a_short_redis_restart_waits_instead_of_being_refused(fleet, redis_server):
    """A client reconnecting while Redis restarts (SIGTERM, back 1.5 s later) waits for its CONNACK
    instead of being refused: paho-mqtt, refused once, resends a QoS 2 PUBLISH it had already released
    as a new message on its next attempt (a second copy for every subscriber); refusing only past
    store.connect_wait_ms keeps that to outages longer than that."""
    [a] = fleet(1)
    cid = uid("c")
    c, _ = raw_connect(a, cid, 5)
    c.close()
    redis_server.stop()  # SIGTERM: a graceful shutdown, as a pod deletion does
    c = mqttraw.RawClient(a.host, a.port, version=5, timeout=15)
    c.send(mqttraw.connect(cid, version=5, clean=False, props={"session_expiry_interval": 300}))
    time.sleep(1.5)
    redis_server.start()
    ack = c.expect(mqttraw.CONNACK, timeout=15)
    assert ack.reason == 0 and ack.session_present, ack


def test_a_paho_client_whose_pubrel_met_a_redis_restart_gets_its_message_delivered_once(
    fleet, redis_server, redis_proxy
):
    """Issue 25's duplicates, as a user saw them with paho-mqtt: a QoS 2 message whose PUBREL was being
    stored when Redis shut down (SIGTERM) reached every subscriber twice. paho turns a PUBREL it still
    owes into a PUBLISH of the same message (DUP=0) when a reconnect is refused and the next one is
    accepted: a new message by the protocol, since the id was released. Holding CONNECTs while Redis is
    back within store.connect_wait_ms keeps paho's first reconnect from being refused."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("paho/")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(a, sub, topic)
    redis_proxy.delay(1.0, b"EVALSHA", sha("enqueue"))  # the PUBLISH's commit (routing + record) waits
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=uid("pub"), clean_session=False)
    pub.reconnect_delay_set(min_delay=1, max_delay=1)
    pub.connect(a.host, a.port, keepalive=30)
    pub.loop_start()
    try:
        time.sleep(0.5)
        pub.publish(topic, seq_payload("p", 1), qos=2)
        time.sleep(0.2)
        # the PUBREL's commit (the record's removal, no routing) runs, its reply is lost, Redis goes
        lost = redis_proxy.lose_reply(b"EVALSHA", sha("journal"))
        assert lost.wait(10), "the PUBREL's commit never went through the proxy"
        redis_server.stop()
        time.sleep(2.5)  # paho reconnects meanwhile
        redis_server.start()
        assert app_deliveries(sub, quiet=4.0) == [("p", 1)], "a QoS 2 message reached the subscriber twice"
    finally:
        pub.loop_stop()
        pub.disconnect()


def test_a_will_whose_take_lost_its_reply_is_published_once(fleet, redis_proxy):
    """A will falls due: the node takes it from the store (exactly one taker publishes it). The take ran
    but its reply was lost: the will was gone from the store and never published."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("take/")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(topic, 1)
    w = will_client(a, uid("w"), topic, b"due", delay=1)
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("takewill"))
    w.stop()
    assert lost.wait(10), "the take never went through the proxy"
    got, _ = watcher.wait_topic(topic, timeout=10)
    assert got.payload == b"due"
    assert not [m for m in watcher.drain(1.5) if m.topic == topic], "the will published twice"
    watcher.disconnect()


def test_the_wills_of_a_dead_node_survive_a_release_whose_reply_was_lost(fleet, redis_server, redis_proxy):
    """A node dies; another releases its sessions and publishes their wills. The release ran but its reply
    was lost: the wills were gone from the store (taken with the release) and never published, and the
    releasing node kept the routes of the sessions that had ended."""
    [a] = fleet(1)
    [b] = fleet(1, redis_url=redis_proxy.url)  # the node that releases a's sessions
    topic = uid("reap/")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(topic + "/w/#", 1)
    now = will_client(a, uid("now"), topic + "/w/now", b"n")
    later = will_client(a, uid("later"), topic + "/w/later", b"l", delay=1)
    clean_cid = uid("clean")
    clean, _ = raw_connect(a, clean_cid, 4, clean=True)
    clean.subscribe([(topic + "/c", 1)])
    wait_route(b, clean, topic + "/c")
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("reap"))
    a.kill()
    for c in (now, later):
        c.stop()
    clean.close()
    assert lost.wait(30), "the release never went through the proxy"
    got = {m.topic: m.payload for m in watcher.wait_for(2, timeout=15)}
    assert got == {topic + "/w/now": b"n", topic + "/w/later": b"l"}
    assert not watcher.drain(1.5), "a will published twice"
    pub, _ = raw_connect(b, uid("pub"), 4, clean=True)
    pub.send(mqttraw.publish(topic + "/c", b"x", qos=1, packet_id=1))
    pub.expect(mqttraw.PUBACK)
    assert not redis_server.keys(f"fmq:{{{clean_cid}}}:*"), "an ended session routed to"
    watcher.disconnect()


def test_a_node_that_missed_a_route_removal_while_cut_off_drops_the_route_when_back(fleet, redis_proxy):
    """A node back from losing Redis reloads the fleet's routes. It only added what it found: a filter
    removed while it was cut off (the event never reached it) stayed routed from it for good, and its
    publishers' messages reached a client that had unsubscribed."""
    [a] = fleet(1)
    [b] = fleet(1, redis_url=redis_proxy.url)
    t, u, cid = uid("t/"), uid("u/"), uid("c")
    c, _ = raw_connect(a, cid, 4)
    c.subscribe([(t, 1), (u, 1)])
    wait_route(b, c, t)
    wait_route(b, c, u)
    redis_proxy.hold(True)  # b hears nothing
    c.send(mqttraw.unsubscribe(7, [t]))
    assert c.expect(mqttraw.UNSUBACK).packet_id == 7
    time.sleep(0.5)
    redis_proxy.drop_all()  # b's connections reset (what was held is lost): it reconnects and resyncs
    redis_proxy.hold(False)
    wait_route(b, c, u, timeout=15)  # (b routes through Redis again)
    pub, _ = raw_connect(b, uid("pub"), 4, clean=True)
    pub.send(mqttraw.publish(t, b"unsubscribed", qos=1, packet_id=1))
    pub.expect(mqttraw.PUBACK)
    got = c.recv(1.5)
    assert got is None, f"a message on a filter the client had unsubscribed from: {got}"


def test_a_publisher_moving_while_its_subscriber_catches_up_keeps_publish_order(fleet, redis_proxy):
    """The race README "Known limits" called known in theory, made to happen: a subscriber opens on node b
    and catches up on what Redis queued for it (its last pull ran, its reply is late). Its publisher,
    still on node a, publishes m1: queued in Redis after that pull ran, and b woken, which leaves the wake
    to the catch-up (the session pulls itself until it has caught up, then once more). The publisher moves
    to b and publishes m2, straight to the subscriber. It cannot overtake m1: the move's sync waits for a
    pull of every session being pulled when it looked, begun after it looked (here the one after the
    catch-up, which brings m1, its reply late too), and the CONNACK waits for the sync."""
    [a] = fleet(1)
    [b] = fleet(1, redis_url=redis_proxy.url)
    topic, scid, pcid = uid("order/"), uid("sub"), uid("pub")
    s, _ = raw_connect(a, scid, 4)
    s.subscribe([(topic, 1)])
    s.send(mqttraw.disconnect())
    s.close()
    pub, _ = raw_connect(a, pcid, 4)
    pub.send(mqttraw.publish(uid("warm/"), b"w", qos=1, packet_id=1))
    pub.expect(mqttraw.PUBACK)
    held = redis_proxy.hold_reply(1.5, b"EVALSHA", sha("pull"))  # b's catch-up pull: its reply late
    s, ack = raw_connect(b, scid, 4)
    assert ack.session_present
    assert held.wait(5), "the catch-up pull never went through the proxy"
    redis_proxy.hold_reply(1.0, b"EVALSHA", sha("pull"))  # and the pull that brings m1, after it
    pub.send(mqttraw.publish(topic, seq_payload("o", 1), qos=1, packet_id=2))  # m1, through Redis
    pub.expect(mqttraw.PUBACK)
    pub.close()
    pub, ack = raw_connect(b, pcid, 4)  # the publisher moves to the subscriber's node
    assert ack.session_present
    pub.send(mqttraw.publish(topic, seq_payload("o", 2), qos=1, packet_id=3))  # m2, straight to it
    pub.expect(mqttraw.PUBACK, timeout=10)
    view = AppView()
    ack_loop(s, view, until=2, timeout=10, tag="o")
    assert [parse_seq(p) for p in view.delivered] == [("o", 1), ("o", 2)], "a newer message overtook"


@pytest.mark.parametrize("subscriber_here", [False, True], ids=["subscriber-elsewhere", "subscriber-here"])
def test_a_qos2_publish_whose_commit_ran_unheard_is_routed_once(fleet, redis_proxy, subscriber_here):
    """The commit that stores a QoS 2 message's routing and its publisher's awaiting-PUBREL record runs,
    its reply is lost: the publisher is not acknowledged, resends on another node, and that resend finds
    the record the first attempt stored: every subscriber gets the message once."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic, scid = uid("gc/"), uid("sub")
    sub, _ = raw_connect(a if subscriber_here else b, scid, 5)
    sub.subscribe([(topic, 2)])
    if not subscriber_here:
        wait_route(a, sub, topic)
    lost = lambda: redis_proxy.lose_reply(b"EVALSHA", sha("journal"))  # noqa: E731
    resend_after_an_unknown_outcome(a, b, lost, topic, seq_payload("g", 1), 9)
    if subscriber_here:  # (its session was closed too: its copy is journaled, it resumes elsewhere)
        sub.close()
        sub, ack = raw_connect(b, scid, 5)
        assert ack.session_present
    assert app_deliveries(sub, quiet=3.0) == [("g", 1)], "a QoS 2 message reached the subscriber twice"


def test_queued_messages_whose_pull_ran_unheard_are_delivered_once(fleet, redis_proxy):
    """A node pulls what Redis queued for a session connected to it; the pull runs (the messages move into
    the session's journal) and its reply is lost. The session resumes from Redis: each message once."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic, scid = uid("pull/"), uid("sub")
    sub, _ = raw_connect(a, scid, 5)
    sub.subscribe([(topic, 2)])
    wait_route(b, sub, topic)
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("pull"))
    pub, _ = raw_connect(b, uid("pub"), 5, clean=True)
    for n in range(1, 4):
        publish_qos2(pub, topic, seq_payload("q", n), n)
    assert lost.wait(5), "the pull never went through the proxy"
    view = AppView()
    ack_loop(sub, view, quiet=1.0, timeout=5)  # until the node closes it (it resynchronises)
    sub.close()
    sub, ack = raw_connect(b, scid, 5)
    assert ack.session_present
    ack_loop(sub, view, quiet=2.0, timeout=10)
    assert sorted(parse_seq(p) for p in view.delivered) == [("q", 1), ("q", 2), ("q", 3)]


def test_a_session_handed_over_by_a_commit_that_ran_unheard_resumes_whole(fleet, redis_proxy):
    """A takeover: the old node stores the session it hands over; that commit runs, its reply is lost. The
    new node claims the session all the same (fencing the old one) and the client gets what was queued."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic, scid = uid("ho/"), uid("sub")
    old, _ = raw_connect(a, scid, 5)
    old.subscribe([(topic, 1)])
    wait_route(b, old, topic)
    pub, _ = raw_connect(b, uid("pub"), 5, clean=True)
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("park"))
    new, ack = raw_connect(b, scid, 5, timeout=10)
    assert ack.session_present
    assert lost.wait(5), "the handover's park never went through the proxy"
    for n in range(1, 4):
        pub.send(mqttraw.publish(topic, seq_payload("h", n), qos=1, packet_id=n, version=5))
        pub.expect(mqttraw.PUBACK)
    view = AppView()
    ack_loop(new, view, until=3, timeout=10, tag="h")
    assert [parse_seq(p) for p in view.delivered] == [("h", 1), ("h", 2), ("h", 3)]
    old.close()


def test_a_publish_refused_for_a_publisher_taken_over_meanwhile_is_not_acknowledged(
    fleet, redis_server, redis_proxy
):
    """Found by `python -m chaos --store sentinel --nemesis redis-term --seed 1` (8 QoS 1 messages lost): a
    node routes what a publisher connected to it sends, guarded by the publisher's session epoch, and its
    commit is slow. Meanwhile another node takes the session over without it (its event stream was down:
    nobody answered the handover). The commit then lands: the routing is refused (the publisher's session
    is the other node's), yet the publisher was acknowledged and never sent the message again: lost."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic, pcid = uid("refused/"), uid("pub")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 1)])
    wait_route(a, sub, topic)
    old, _ = raw_connect(a, pcid, 5)
    redis_proxy.delay(3.0, b"EVALSHA", sha("enqueue"))  # a's routing of the message lands 3 s late
    redis_proxy.delay(10.0, b"SUBSCRIBE")  # and its event stream, once broken, stays down
    old.send(mqttraw.publish(topic, seq_payload("r", 1), qos=1, packet_id=5, version=5))
    time.sleep(0.2)
    redis_server.command("CLIENT", "KILL", "TYPE", "pubsub")
    time.sleep(0.2)
    new, ack = raw_connect(b, pcid, 5, timeout=10)  # b: nobody listens for a; it claims at once
    assert ack.session_present
    assert closed_without(old, mqttraw.PUBACK, timeout=10), "acknowledged, yet stored for nobody"
    new.send(mqttraw.publish(topic, seq_payload("r", 1), qos=1, packet_id=5, dup=True, version=5))
    new.expect(mqttraw.PUBACK)
    view = AppView()
    ack_loop(sub, view, until=1, timeout=10, tag="r")
    assert [parse_seq(p) for p in view.delivered] == [("r", 1)]
