"""Faults put at a chosen point, one test per way the fleet once went wrong after a Redis outage (issue 13):
each failed before its fix. A proxy between a node and Redis (tests/redisproxy.py) cuts a pipeline between
two scripts, delays a script, or cuts a node off; redis-server is killed and restarted with its AOF."""

from __future__ import annotations

import time

import pytest
from fleetmq.broker.store import keys

from tests.integration import mqttraw
from tests.integration.fleet_support import (
    AppView,
    ack_loop,
    app_deliveries,
    first_occurrences,
    parse_seq,
    publish_qos2,
    raw_connect,
    resend_after_an_unknown_outcome,
    seq_payload,
    sha,
    wait_route,
)
from tests.integration.harness import MOSQUITTO, uid
from tests.integration.mqttraw import CONNACK, PUBACK
from tests.support import wait_until

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")

HEARTBEAT_TTL = 5.0  # cluster.HEARTBEAT_TTL


def test_qos2_receipt_and_its_routing_are_stored_together(fleet, redis_proxy):
    """Bug 1: the routing of a QoS 2 PUBLISH reached Redis but the publisher's "awaiting PUBREL" record
    did not (Redis went away between the two), so the resend after reconnecting was routed again and every
    subscriber got the message twice. Here the pipeline is cut right after its enqueue script."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the publisher's node, through the proxy
    [b] = fleet(1)
    topic = uid("x2/")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(a, sub, topic)
    cut = lambda: redis_proxy.cut_after(b"EVALSHA", sha("enqueue"))  # noqa: E731
    resend_after_an_unknown_outcome(a, b, cut, topic, seq_payload("m", 1), 119)
    assert app_deliveries(sub, quiet=2.0, timeout=10) == [("m", 1)], (
        "a QoS 2 message reached the subscriber twice"
    )


def test_a_redis_outage_longer_than_the_heartbeat_releases_no_live_session(fleet, redis_server, redis_proxy):
    """Bug 2: Redis down longer than the heartbeat TTL, then back: the first node to reconnect took a node
    whose heartbeat had lapsed meanwhile for dead and released its sessions under its connected clients,
    which went deaf. Here node a stays silent a little longer after Redis is back (the proxy holds it)."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("out/")
    cid = uid("sub")
    sub, _ = raw_connect(a, cid, 4)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    redis_server.kill()
    time.sleep(HEARTBEAT_TTL + 1.5)  # every heartbeat key lapses
    redis_proxy.hold(True)  # a's reconnection is slower than b's
    redis_server.start()
    time.sleep(3.0)  # b is back, beats, and checks for dead nodes
    redis_proxy.hold(False)
    wait_until(lambda: redis_server.command("EXISTS", keys.alive("node-0")) == 1, timeout=10, msg="a beats")
    meta = keys.session_keys(cid)[keys.META]
    assert redis_server.command("HGET", meta, "node") == b"node-0", "a live node's session was released"
    pub, _ = raw_connect(b, uid("pub"), 4, clean=True)
    for i in range(20):
        pub.send(mqttraw.publish(topic, seq_payload("o", i), qos=1, packet_id=i + 1))
    view = AppView()
    ack_loop(sub, view, until=20, timeout=10, tag="o")
    assert sorted(n for _, n in map(parse_seq, view.delivered)) == list(range(20)), "connected but deaf"


def test_a_node_cut_off_longer_than_the_heartbeat_never_leaves_a_client_deaf(
    fleet, redis_server, redis_proxy
):
    """Bug 2, the other side: a node really cut off from Redis (for longer than the fleet waits) has its
    sessions released by the others; when it is back it takes back what nobody else took (and lets go of
    the rest), so its client gets what was published meanwhile and later: never connected and deaf."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("cut/")
    cid = uid("sub")
    sub, _ = raw_connect(a, cid, 4)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    redis_proxy.hold(True)
    redis_proxy.drop_all()
    meta = keys.session_keys(cid)[keys.META]
    wait_until(lambda: redis_server.command("HGET", meta, "online") == b"0", timeout=30, msg="released by b")
    pub, _ = raw_connect(b, uid("pub"), 4, clean=True)
    for i in range(10):  # queued for the released session
        pub.send(mqttraw.publish(topic, seq_payload("c", i), qos=1, packet_id=i + 1))
    redis_proxy.hold(False)
    wait_until(lambda: redis_server.command("EXISTS", keys.alive("node-0")) == 1, timeout=15, msg="a beats")
    time.sleep(1.0)
    for i in range(10, 20):  # published after a is back
        pub.send(mqttraw.publish(topic, seq_payload("c", i), qos=1, packet_id=i + 1))
    view = AppView()
    still_connected = ack_loop(sub, view, until=20, timeout=10, tag="c")
    got = sorted(n for _, n in map(parse_seq, view.delivered))
    # nobody else took the session meanwhile: a takes it back, and its client misses nothing
    assert still_connected and got == list(range(20)), f"connected={still_connected}, got only {got}"
    assert redis_server.command("HGET", meta, "node") == b"node-0"


def test_first_deliveries_keep_publish_order_while_a_session_resumes(fleet, redis_proxy):
    """Bug 3: a message the node had queued in Redis for a session (its client was reconnecting) reached
    the client after newer ones the node delivered directly once the session was open here. The enqueue
    of message 0 is held back so that it lands after the claim; messages 1..20 follow directly."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("ord/")
    cid = uid("sub")
    sub, _ = raw_connect(b, cid, 4)
    sub.subscribe([(topic, 1)])
    wait_route(a, sub, topic)
    sub.close()  # the session waits in Redis; its client comes back on a
    pub, _ = raw_connect(a, uid("pub"), 4, clean=True)
    redis_proxy.delay(0.5, b"EVALSHA", sha("enqueue"))
    redis_proxy.delay(0.2, b"EVALSHA", sha("claim"))
    back = mqttraw.RawClient(a.host, a.port, version=4)
    back.send(mqttraw.connect(cid, clean=False, version=4))
    time.sleep(0.05)  # the claim is on its way (and held)
    pub.send(mqttraw.publish(topic, seq_payload("r", 0), qos=1, packet_id=1))  # routed through Redis
    assert back.expect(CONNACK, timeout=10).session_present
    redis_proxy.clear()
    for i in range(1, 21):  # the session is open here now: routed directly
        pub.send(mqttraw.publish(topic, seq_payload("r", i), qos=1, packet_id=i + 1))
    view = AppView()
    ack_loop(back, view, until=21, timeout=10, tag="r")
    first = first_occurrences(view.delivered)
    assert first == list(range(21)), f"first deliveries out of publish order: {first}"


def test_takeover_after_a_crash_does_not_wait_for_the_dead_node(fleet):
    """Bug 4: after kill -9 of the node holding a session, its client reconnecting to another node waited
    seconds for the dead node to hand the session over. A node whose connections to Redis are gone is
    dead at once: the takeover claims the session without waiting."""
    a, b = fleet(2)
    topic = uid("crash/")
    cid = uid("sub")
    sub, _ = raw_connect(a, cid, 5)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    a.kill()
    sub.close()
    t0 = time.monotonic()
    back, ack = raw_connect(b, cid, 5)
    took = time.monotonic() - t0
    assert ack.type == CONNACK and ack.reason == 0 and ack.session_present
    assert took < 1.0, f"CONNACK {took:.2f}s after the CONNECT: the takeover waited for the dead node"
    back.close()


def test_publish_on_takeover_node_meanwhile_reaches_the_session(fleet):
    """With the takeover fast, what the surviving node routes to the session meanwhile is not lost."""
    a, b = fleet(2)
    topic = uid("crash2/")
    cid = uid("sub")
    sub, _ = raw_connect(a, cid, 4)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    pub, _ = raw_connect(b, uid("pub"), 4, clean=True)
    for i in range(5):
        pub.send(mqttraw.publish(topic, seq_payload("k", i), qos=1, packet_id=i + 1))
    a.kill()
    sub.close()
    back, ack = raw_connect(b, cid, 4)
    assert ack.session_present
    for i in range(5, 10):
        pub.send(mqttraw.publish(topic, seq_payload("k", i), qos=1, packet_id=i + 1))
    view = AppView()
    ack_loop(back, view, until=10, timeout=10, tag="k")
    assert {n for _, n in map(parse_seq, view.delivered)} == set(range(10))
    back.close()
    pub.close()


def test_qos2_publish_routed_by_a_fenced_node_is_not_routed_twice(fleet, redis_proxy):
    """Found by `python -m chaos --seed 101` (two QoS 2 duplicates after a proxy black hole): the node of a
    v5 publisher routed a QoS 2 PUBLISH while cut off from Redis (its commit held). The client resumed on
    another node, which took the session over without the silent node (fencing it) and, finding no
    awaiting-PUBREL record, routed the resent PUBLISH. Then the held commit landed: the publisher's record
    was refused (stale epoch) but the routing in the same transaction was not, so every subscriber got the
    message twice. The routing of a fenced publisher's QoS 2 message must be refused with its record."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the publisher's first node, through the proxy
    [b] = fleet(1)
    topic = uid("fence/")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(a, sub, topic)
    pcid = uid("pub")
    old, _ = raw_connect(a, pcid, 5)
    redis_proxy.hold(True)  # a is cut off: its commit (routing + awaiting PUBREL) waits in the proxy
    old.send(mqttraw.publish(topic, seq_payload("f", 1), qos=2, packet_id=7, version=5))
    time.sleep(0.2)
    # the client gives up on a and resumes on b, which cannot reach a and fences it (HANDOVER_TIMEOUT)
    pub, ack = raw_connect(b, pcid, 5, timeout=10)
    assert ack.session_present
    publish_qos2(pub, topic, seq_payload("f", 1), 7, dup=True)
    redis_proxy.hold(False)  # a's held commit reaches Redis now, with a stale epoch for the publisher
    assert app_deliveries(sub, quiet=3.0, timeout=10) == [("f", 1)], (
        "a QoS 2 message reached the subscriber twice"
    )
    old.close()


def test_qos2_publish_of_a_fenced_publisher_is_taken_back_from_local_subscribers(fleet, redis_proxy):
    """The same fence, for a subscriber on the stale node itself: its copy goes into its journal, not
    through Redis' queue, and its PUBLISH waits for the commit; the commit that finds the publisher
    fenced takes it back, so only the copy the new owner routes arrives."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("fence2/")
    sub, _ = raw_connect(a, uid("sub"), 5)  # on the stale node
    sub.subscribe([(topic, 2)])
    wait_route(b, sub, topic)
    pcid = uid("pub")
    old, _ = raw_connect(a, pcid, 5)
    redis_proxy.hold(True)
    old.send(mqttraw.publish(topic, seq_payload("g", 1), qos=2, packet_id=7, version=5))
    time.sleep(0.2)
    pub, ack = raw_connect(b, pcid, 5, timeout=10)
    assert ack.session_present
    publish_qos2(pub, topic, seq_payload("g", 1), 7, dup=True)
    redis_proxy.hold(False)
    assert app_deliveries(sub, quiet=3.0, timeout=10) == [("g", 1)], (
        "a QoS 2 message reached the subscriber twice"
    )
    old.close()


def test_a_message_routed_to_a_session_taken_over_meanwhile_is_not_lost(fleet, redis_proxy):
    """Found by `python -m chaos --seed 302` (and 304): one acknowledged QoS 1 message never delivered. Its
    subscriber had just been taken over by another node that could not reach the old one (its event stream
    was down after a Redis restart), so the old node still held a stale copy of the session and delivered
    the message into it. The commit found that copy fenced and refused its journal, yet the publisher was
    acknowledged: the message was stored for nobody. Here the old node is cut off while the takeover fences
    it, and a publisher on it publishes meanwhile."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the subscriber's first node, through the proxy
    [b] = fleet(1)
    topic = uid("stale/")
    scid = uid("sub")
    old, _ = raw_connect(a, scid, 4)
    old.subscribe([(topic, 1)])
    wait_route(b, old, topic)
    pub, _ = raw_connect(a, uid("pub"), 4, clean=True)
    redis_proxy.hold(True)  # a hears neither the handover request nor the kick
    sub, ack = raw_connect(b, scid, 4, timeout=10)  # b fences a (HANDOVER_TIMEOUT) and claims the session
    assert ack.session_present
    pub.send(mqttraw.publish(topic, seq_payload("s", 1), qos=1, packet_id=1))  # into a's stale copy
    time.sleep(0.3)
    redis_proxy.hold(False)  # a's commit lands and finds the subscriber's session fenced
    assert pub.expect(PUBACK, timeout=10).packet_id == 1
    view = AppView()
    ack_loop(sub, view, until=1, timeout=10, tag="s")
    assert [parse_seq(p) for p in view.delivered] == [("s", 1)], "an acknowledged message was lost"
    old.close()


def test_first_deliveries_keep_publish_order_while_a_node_cannot_hear_the_fleet(
    fleet, redis_server, redis_proxy
):
    """Found by `python -m chaos --seed 303`: a QoS 2 message arrived after three newer ones, just after a
    Redis black hole. The subscriber's node had lost its event stream, so it missed the wake for a message
    another node queued in Redis for its session; the publisher then moved to the subscriber's node, whose
    newer messages went straight to the subscriber, ahead of the queued one. A node that cannot hear the
    fleet holds its sessions' new deliveries back until it has pulled what Redis queued meanwhile. Here
    node a's event stream is reset and its re-subscription held back by the proxy."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the subscriber's node
    [b] = fleet(1)
    topic = uid("gap/")
    sub, _ = raw_connect(a, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(b, sub, topic)
    pcid = uid("pub")
    pub, _ = raw_connect(b, pcid, 5, clean=True, expiry=None)
    redis_proxy.delay(2.0, b"SUBSCRIBE")  # a's event stream comes back late
    redis_proxy.drop_all()
    time.sleep(0.3)
    publish_qos2(pub, topic, seq_payload("g", 0), 1)  # queued in Redis
    pub.disconnect()  # (its session ends, so a needs no handover from b, which a could not hear)
    wait_until(lambda: redis_server.command("EXISTS", keys.session_keys(pcid)[keys.META]) == 0, timeout=5)
    pub, _ = raw_connect(a, pcid, 5, clean=True, expiry=None)  # the publisher moves to the subscriber's node
    for i in range(1, 11):
        pub.send(mqttraw.publish(topic, seq_payload("g", i), qos=2, packet_id=i + 1, version=5))
    view = AppView()
    ack_loop(sub, view, until=11, timeout=15, tag="g")
    first = first_occurrences(view.delivered)
    assert first == list(range(11)), f"first deliveries out of publish order: {first}"


def test_first_deliveries_keep_publish_order_when_the_publisher_moves_to_its_subscribers_node(
    fleet, redis_server, redis_proxy
):
    """Found by `python -m chaos --seed 307` (just as a paused Redis resumed): a publisher moved to its
    subscribers' node while the pull of its last message routed through Redis was still on its way, and
    its newer messages went to the subscribers directly, ahead of it. A session opening on a node waits
    until the node has pulled what Redis had queued for the sessions connected there. Here the pull is
    held back by the proxy."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the subscriber's node
    [b] = fleet(1)
    topic = uid("move/")
    sub, _ = raw_connect(a, uid("sub"), 4)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    pcid = uid("pub")
    pub, _ = raw_connect(b, pcid, 4, clean=True)
    pulled = redis_proxy.delay(1.0, b"EVALSHA", sha("pull"))
    pub.send(mqttraw.publish(topic, seq_payload("v", 0), qos=1, packet_id=1))  # through Redis to a
    assert pub.expect(PUBACK).packet_id == 1
    assert pulled.wait(5), "a never pulled"
    pub.disconnect()
    wait_until(lambda: redis_server.command("EXISTS", keys.session_keys(pcid)[keys.META]) == 0, timeout=5)
    pub, _ = raw_connect(a, pcid, 4, clean=True)  # the publisher moves to the subscriber's node
    for i in range(1, 11):
        pub.send(mqttraw.publish(topic, seq_payload("v", i), qos=1, packet_id=i + 1))
    view = AppView()
    ack_loop(sub, view, until=11, timeout=15, tag="v")
    first = first_occurrences(view.delivered)
    assert first == list(range(11)), f"first deliveries out of publish order: {first}"


def test_a_node_whose_event_stream_does_not_answer_keeps_publish_order_by_holding_back(
    fleet, redis_server, redis_proxy
):
    """The same move, with the node's event stream silent (its PING held back past the node's patience):
    the client is still accepted, and the node takes the stream for broken, reconnects it, and holds its
    sessions' new deliveries until they have pulled what Redis queued for them."""
    [a] = fleet(1, redis_url=redis_proxy.url)
    [b] = fleet(1)
    topic = uid("silent/")
    sub, _ = raw_connect(a, uid("sub"), 4)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    pcid = uid("pub")
    pub, _ = raw_connect(b, pcid, 4, clean=True)
    redis_proxy.delay(4.0, b"EVALSHA", sha("pull"))  # longer than the node waits for its sync
    pub.send(mqttraw.publish(topic, seq_payload("q", 0), qos=1, packet_id=1))
    assert pub.expect(PUBACK).packet_id == 1
    pub.disconnect()
    wait_until(lambda: redis_server.command("EXISTS", keys.session_keys(pcid)[keys.META]) == 0, timeout=5)
    silent = redis_proxy.delay(10.0, b"PING", b"sync:")
    pub, ack = raw_connect(a, pcid, 4, clean=True, timeout=10)
    assert silent.is_set() and ack.reason == 0
    for i in range(1, 11):
        pub.send(mqttraw.publish(topic, seq_payload("q", i), qos=1, packet_id=i + 1))
    view = AppView()
    ack_loop(sub, view, until=11, timeout=20, tag="q")
    first = first_occurrences(view.delivered)
    assert first == list(range(11)), f"first deliveries out of publish order: {first}"
    assert "event stream did not answer" in a.log()


def test_first_deliveries_keep_publish_order_when_a_publisher_leaves_a_node_that_cannot_hear_the_fleet(
    fleet, redis_server, redis_proxy
):
    """Found by `python -m chaos --seed 308`: the other direction of the move above. While a node's event
    stream was down, a publisher connected there delivered straight to a subscriber there, then moved to
    another node, whose newer messages reached the subscriber through Redis; once the stream was back
    they must come after the older ones, not ahead of them."""
    [a] = fleet(1, redis_url=redis_proxy.url)  # the subscriber's node
    [b] = fleet(1)
    topic = uid("leave/")
    sub, _ = raw_connect(a, uid("sub"), 5)
    sub.subscribe([(topic, 1)])
    wait_route(b, sub, topic)
    pcid = uid("pub")
    redis_proxy.delay(2.0, b"SUBSCRIBE")  # a's event stream comes back late
    redis_proxy.drop_all()
    time.sleep(0.3)
    pub, _ = raw_connect(a, pcid, 5, clean=True, expiry=None)
    for i in range(5):  # straight to the subscriber on a
        pub.send(mqttraw.publish(topic, seq_payload("l", i), qos=1, packet_id=i + 1, version=5))
    for i in range(5):
        assert pub.expect(PUBACK).packet_id == i + 1
    pub.disconnect()
    wait_until(lambda: redis_server.command("EXISTS", keys.session_keys(pcid)[keys.META]) == 0, timeout=5)
    pub, _ = raw_connect(b, pcid, 5, clean=True, expiry=None)  # the publisher moves away
    for i in range(5, 10):  # through Redis, pulled by a once its stream is back
        pub.send(mqttraw.publish(topic, seq_payload("l", i), qos=1, packet_id=i + 1, version=5))
    view = AppView()
    ack_loop(sub, view, until=10, timeout=15, tag="l")
    first = first_occurrences(view.delivered)
    assert first == list(range(10)), f"first deliveries out of publish order: {first}"
