"""Takeover across nodes (issue 3): a client whose session has a full Inflight Window and 1,000 queued
messages on node A reconnects on node B. B answers CONNACK with session present, resends the unacked
PUBLISHes (DUP=1) and PUBRELs with their original packet ids and in original order before anything new,
then drains the queue: nothing lost, QoS2 delivered to the application once, first deliveries in order."""

from __future__ import annotations

import time

import pytest

from tests.integration import mqttraw
from tests.integration.fleet_support import (
    SESSION_EXPIRY,
    AppView,
    ack_loop,
    first_occurrences,
    parse_seq,
    pipeline_publish,
    raw_connect,
    session_keys,
    wait_route,
)
from tests.integration.harness import uid
from tests.integration.mqttraw import DISCONNECT, PUBLISH, PUBREC, PUBREL, RawClient
from tests.support import wait_until

pytestmark = pytest.mark.redis

WINDOW = 10
QUEUED = 1000
TOTAL = WINDOW + QUEUED
PUBREC_FIRST = 4  # QoS2: the client PUBRECs this many of the inflight messages (they move to PUBREL)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
@pytest.mark.parametrize("qos", [1, 2], ids=["qos1", "qos2"])
def test_takeover_full_window_and_1000_queued(fleet, redis_server, qos, version):
    a, b = fleet(2, zone_overrides={"max_inflight": WINDOW, "max_mqueue_len": 5000})
    cid = uid("tk-")
    topic = uid("tk/")
    old, ack = raw_connect(a, cid, version)
    assert not ack.session_present
    old.subscribe([(topic, qos)])
    wait_route(b, old, topic)

    # 1,010 messages published on B (the subscriber is on A), all acked by the broker
    pipeline_publish(b, topic, "m", qos, TOTAL, version=version)

    view = AppView()
    first = old.recv_n(WINDOW, timeout=10, ptype=PUBLISH)
    for p in first:
        view.on_publish(p)
    assert [parse_seq(p.payload)[1] for p in first] == list(range(WINDOW))
    assert all(p.qos == qos and not p.dup for p in first)
    # the window is full: nothing more comes while nothing is acked
    extra = [p for p in old.recv_all(0.5) if p.type == PUBLISH]
    assert extra == [], f"more than max_inflight={WINDOW} unacked deliveries: {extra[:3]}"
    pids = [p.packet_id for p in first]
    assert len(set(pids)) == WINDOW
    if qos == 2:  # PUBREC some of them; their PUBREL comes and is left without PUBCOMP
        for p in first[:PUBREC_FIRST]:
            old.send(mqttraw.ack(PUBREC, p.packet_id, version=version))
        rels = old.recv_n(PUBREC_FIRST, timeout=5, ptype=PUBREL)
        assert [r.packet_id for r in rels] == pids[:PUBREC_FIRST]
        for r in rels:
            view.on_pubrel(r)
    meta_before = redis_server.hgetall(session_keys(cid)[0])

    # takeover on B
    new = RawClient(b.host, b.port, version=version, timeout=10)
    props = {"session_expiry_interval": SESSION_EXPIRY} if version == 5 else None
    t0 = time.perf_counter()
    new.send(mqttraw.connect(cid, version=version, clean=False, props=props))
    connack = new.expect(mqttraw.CONNACK, timeout=10)
    t_connack = time.perf_counter() - t0
    assert connack.reason == 0, connack
    assert connack.session_present, "takeover across nodes: CONNACK without session present"
    resent = new.recv_n(1, timeout=10)
    t_first = time.perf_counter() - t0
    resent += new.recv_n(WINDOW - 1, timeout=10)
    expected = []
    for i, p in enumerate(first):
        if qos == 2 and i < PUBREC_FIRST:
            expected.append(("PUBREL", p.packet_id, None, None))
        else:
            expected.append(("PUBLISH", p.packet_id, True, p.payload))
    got = [
        (r.name, r.packet_id, r.dup if r.type == PUBLISH else None, r.payload if r.type == PUBLISH else None)
        for r in resent
    ]
    print(
        f"\ntakeover qos{qos} v{version}: CONNECT->CONNACK {t_connack * 1000:.1f} ms, "
        f"CONNECT->first resend {t_first * 1000:.1f} ms"
    )
    assert got == expected, "resends are not the unacked window in original order with original ids"

    # the old connection on A was closed (v5: DISCONNECT 0x8E Session taken over)
    closed, seen = old.wait_closed(5)
    assert closed, "old connection on node A still open after takeover"
    if version == 5:
        disc = [p for p in seen if p.type == DISCONNECT]
        assert disc and disc[0].reason == 0x8E, f"old connection got {seen[-3:]}, not DISCONNECT 0x8E"
    old.close()
    # nothing the old node sent after the resend snapshot counts as application delivery
    for r in resent:
        if r.type == PUBLISH:
            view.on_publish(r)
            new.ack(r)
        else:
            view.on_pubrel(r)
            new.ack(r)

    assert ack_loop(new, view, until=TOTAL, timeout=30, tag="m"), "connection on B closed while draining"
    ack_loop(new, view, quiet=0.5, timeout=5)  # anything extra
    seqs = first_occurrences(view.delivered, "m")
    missing = sorted(set(range(TOTAL)) - set(seqs))
    assert not missing, f"lost {len(missing)} messages, e.g. {missing[:10]}"
    assert seqs == list(range(TOTAL)), "first deliveries out of order"
    after = view.publishes[WINDOW * 2 - (PUBREC_FIRST if qos == 2 else 0) :]
    assert not [p for p in after if p.dup], "queued messages (never sent before) carried DUP=1"
    if qos == 2:
        dups = len(view.delivered) - len(set(view.delivered))
        assert dups == 0, f"QoS2: {dups} messages delivered to the application twice"
    meta_after = redis_server.hgetall(session_keys(cid)[0])
    assert meta_after.get(b"node") == b"node-1", meta_after
    assert int(meta_after[b"epoch"]) > int(meta_before[b"epoch"])
    new.disconnect()
    wait_until(lambda: redis_server.command("HGET", session_keys(cid)[0], "online") != b"1", timeout=5)
