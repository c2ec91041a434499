"""Every broker node restarted (SIGTERM, then started again) with Redis kept (issue 3): persistent sessions,
their subscriptions, queued and inflight messages, and retained messages are all intact."""

from __future__ import annotations

import pytest

from tests.integration import mqttraw
from tests.integration.fleet_support import (
    AppView,
    ack_loop,
    first_occurrences,
    pipeline_publish,
    raw_connect,
    wait_route,
)
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBLISH

pytestmark = pytest.mark.redis

WINDOW = 5
N = 20


def test_all_nodes_restarted_sessions_subscriptions_queues_retained_intact(fleet, redis_server):
    a, b = fleet(2, zone_overrides={"max_inflight": WINDOW, "max_mqueue_len": 1000})
    base = uid("rs/")
    t_off, t_v5, t_on, t_ret = f"{base}/off", f"{base}/v5", f"{base}/on", f"{base}/ret"
    cid_off, cid_v5, cid_on = uid("off-"), uid("v5-"), uid("on-")

    # three persistent sessions: two offline with a subscription, one online with unacked deliveries
    s, _ = raw_connect(a, cid_off, 4)
    s.subscribe([(t_off, 1)])
    s.disconnect()
    s, _ = raw_connect(b, cid_v5, 5)
    s.subscribe([(t_v5 + "/#", 2)])
    s.disconnect()
    on, _ = raw_connect(a, cid_on, 4)
    on.subscribe([(t_on, 1)])
    wait_route(b, on, t_on)

    pipeline_publish(b, t_off, "m", 1, N)
    pipeline_publish(a, t_v5 + "/x", "m", 2, N, version=5)
    pipeline_publish(b, t_on, "m", 1, N)
    pub = mqttraw.RawClient(a.host, a.port, version=4)
    pub.connect(uid("ret-"))
    pub.publish(t_ret, b"retained-before-restart", qos=1, retain=True)
    assert pub.expect(mqttraw.PUBACK).packet_id == 1
    pub.disconnect()
    window = on.recv_n(WINDOW, timeout=5, ptype=PUBLISH)  # not acked
    assert [p.payload for p in window] == [f"m:{i:06d}".encode() for i in range(WINDOW)]

    # restart the whole fleet: every node stops (SIGTERM) before any starts again
    for n in (a, b):
        n.terminate()
        assert not n.alive()
    closed, _ = on.wait_closed(5)
    assert closed
    on.close()
    for n in (a, b):
        n.restart()

    # published after the restart, before the clients are back: reach them without resubscribing
    pipeline_publish(a, t_off, "after", 1, 3)
    pipeline_publish(b, t_v5 + "/y", "after", 2, 3, version=5)
    pipeline_publish(a, t_on, "after", 1, 3)

    # the offline v3.1.1 session, back on the other node
    s, ack = raw_connect(b, cid_off, 4)
    assert ack.session_present, "session of an offline client lost across a fleet restart"
    view = AppView()
    ack_loop(s, view, quiet=0.7, timeout=10)
    assert first_occurrences(view.delivered, "m") == list(range(N))
    assert first_occurrences(view.delivered, "after") == [0, 1, 2]
    assert len(view.delivered) == N + 3
    s.disconnect()

    # the offline v5 session with QoS2
    s, ack = raw_connect(a, cid_v5, 5)
    assert ack.session_present
    view = AppView()
    ack_loop(s, view, quiet=0.7, timeout=10)
    assert first_occurrences(view.delivered, "m") == list(range(N))
    assert first_occurrences(view.delivered, "after") == [0, 1, 2]
    assert len(view.delivered) == N + 3, "QoS2 duplicates after restart"
    assert all(p.qos == 2 for p in view.publishes)
    s.disconnect()

    # the session that was online with a full window: unacked resent first (DUP, same ids), then the rest
    s, ack = raw_connect(b, cid_on, 4)
    assert ack.session_present
    resent = s.recv_n(WINDOW, timeout=5)
    assert [(p.type, p.packet_id, p.payload, p.dup) for p in resent] == [
        (PUBLISH, w.packet_id, w.payload, True) for w in window
    ], "inflight of a connected client not resent after a fleet restart"
    view = AppView()
    for p in resent:
        view.on_publish(p)
        s.ack(p)
    ack_loop(s, view, quiet=0.7, timeout=10)
    assert first_occurrences(view.delivered, "m") == list(range(N))
    assert first_occurrences(view.delivered, "after") == [0, 1, 2]
    # still subscribed: a live message reaches the reconnected session
    pipeline_publish(a, t_on, "live", 1, 1)
    ack_loop(s, view, quiet=0.5, timeout=5)
    assert first_occurrences(view.delivered, "live") == [0]
    s.disconnect()

    # retained messages survived, on both nodes
    for n in (a, b):
        r, _ = raw_connect(n, uid("r-"), 4, clean=True)
        r.subscribe([(t_ret, 1)])
        p = r.expect(PUBLISH, timeout=3)
        assert (p.payload, p.retain) == (b"retained-before-restart", True)
        r.disconnect()


def test_a_stopping_node_evicts_its_clients_at_the_configured_rate(fleet):
    """SIGTERM with `shutdown.eviction_rate` 40/s and 80 MQTT 5 clients: each is told to use another
    server (DISCONNECT 0x9C), spread over about two seconds, never more than the rate allows in any
    second; each finds its session on the other node, and the stopping node exits cleanly."""
    import threading
    import time

    rate, n = 40, 80
    a, b = fleet(2, None, {"shutdown": {"eviction_rate": rate, "timeout": 20}})
    cids = [uid("ev-") for _ in range(n)]
    clients = [raw_connect(a, cid, 5)[0] for cid in cids]
    closed_at: dict[str, tuple[float, list[int]]] = {}

    def watch(cid: str, c) -> None:
        closed, seen = c.wait_closed(15)
        closed_at[cid] = (
            time.monotonic(),
            [p.reason for p in seen if p.type == mqttraw.DISCONNECT] if closed else [],
        )

    threads = [threading.Thread(target=watch, args=(cid, c)) for cid, c in zip(cids, clients, strict=True)]
    for t in threads:
        t.start()
    a.proc.send_signal(15)
    for t in threads:
        t.join(20)
    assert a.proc.wait(20) == 0
    assert len(closed_at) == n
    assert all(reasons == [0x9C] for _, reasons in closed_at.values()), closed_at
    times = sorted(t for t, _ in closed_at.values())
    assert times[-1] - times[0] >= (n - 1) / rate * 0.8, f"not paced: {times[-1] - times[0]:.2f}s"
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= rate + 2, f"{busiest} evictions within one second (rate {rate}/s)"
    for cid, c in zip(cids, clients, strict=True):
        c.close()
        again, ack = raw_connect(b, cid, 5)
        assert ack.session_present, f"{cid}: its session did not move to the other node"
        again.close()
