"""The broker's event log (`--event-log` / event_log:): what a real broker writes to its fleet's Redis
Streams for a scenario with a full window, queue drops, acks and a takeover, and that a batch whose reply
was lost is stored once."""

from __future__ import annotations

import time

import pytest
from fleetmq.broker.store import keys

from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.integration.mqttraw import PUBACK, PUBLISH, RawClient, ack
from tests.support import wait_until

pytestmark = pytest.mark.redis


def stream(redis_server, fleet: str) -> list[dict[str, str]]:
    """The fleet's log, every partition, in the order the node wrote it (eids number its records)."""
    out = []
    for key in keys.event_streams(fleet):
        for _id, fields in redis_server.command("XRANGE", key, "-", "+", decode=True) or []:
            out.append(dict(zip(fields[::2], fields[1::2], strict=True)))
    return sorted(out, key=lambda e: int(e["eid"].rpartition("-")[2]))


def test_events_of_a_full_window_drops_acks_and_takeover(fleet, redis_server):
    (bp,) = fleet(
        1, {"max_inflight": 1, "max_mqueue_len": 2}, {"event_log": {"enabled": True, "fleet": "t1"}}
    )
    topic = uid("ev/")
    sub_id = uid("sub")
    sub, _ = raw_connect(bp, sub_id, 5)
    sub.subscribe([(topic, 1)])
    pub, _ = raw_connect(bp, uid("pub"), 5)
    for i in range(5):
        pub.publish(topic, b"m%d" % i, qos=1)
    pub.recv_n(5, ptype=PUBACK)
    first = sub.expect(PUBLISH)
    sub.send(ack(PUBACK, first.packet_id, version=5))  # frees the window: the queue head goes next
    sub.expect(PUBLISH)
    taker = RawClient(bp.host, bp.port, version=5)  # the same client id from a new connection
    taker.connect(sub_id, clean=False, props={"session_expiry_interval": 300})

    def have_all() -> bool:
        return any(e["event"] == "takeover" for e in stream(redis_server, "t1"))

    wait_until(have_all, timeout=5, msg="events in the stream")
    time.sleep(0.3)
    events = stream(redis_server, "t1")
    by = lambda kind: [e for e in events if e["event"] == kind]  # noqa: E731
    published = [e["msg_id"] for e in by("publish_in")]
    assert len(published) == 5 and len(set(published)) == 5
    assert {e["zone"] for e in events} >= {"default"} and all(e["node"] == "node-0" for e in events)
    # window 1, queue 2: m0 sent; m1, m2 queued; m3 and m4 push the oldest (m1, m2) out
    assert [e["msg_id"] for e in by("drop") if e.get("reason") == "queue_full"] == published[1:3]
    assert len(by("inflight_full")) == 4
    delivered = [e["msg_id"] for e in by("deliver")]
    assert delivered[:2] == [published[0], published[3]]
    assert [e["msg_id"] for e in by("ack")] == [published[0]]
    assert by("ack")[0]["packet_id"] == str(first.packet_id)
    assert by("takeover") and len({e["client"] for e in by("connect")}) == 2
    assert sub_id not in {e.get("client") for e in events}  # client ids are hashed
    assert bp.metric("fleetmq_event_log_records_total", outcome="written") >= len(events)


def test_an_event_batch_whose_reply_was_lost_is_stored_once(fleet, redis_server, redis_proxy):
    """Issue 25: Redis ran a batch of the node's events and its reply never came back (the proxy lost it and
    reset the connection). The node sends the batch again, and Redis skips what it stored: every event
    once. Before, every record of the batch was stored twice."""
    (bp,) = fleet(1, None, {"event_log": {"enabled": True, "fleet": "t2"}}, redis_url=redis_proxy.url)
    wait_until(lambda: stream(redis_server, "t2"), timeout=5, msg="the zone_config record")
    lost = redis_proxy.lose_reply(b"EVAL", b"'XADD'")  # (only the event log's script holds an XADD)
    topic = uid("ev/")
    pub, _ = raw_connect(bp, uid("pub"), 5)
    for i in range(20):
        pub.publish(topic, b"m%d" % i, qos=1)
    pub.recv_n(20, ptype=PUBACK)
    wait_until(lost.is_set, timeout=5, msg="an event batch sent")

    def confirmed() -> bool:  # the resend's reply came: every event stored is counted written
        stored = {e["eid"] for e in stream(redis_server, "t2")}
        return bp.metric("fleetmq_event_log_records_total", outcome="written") >= len(stored)

    wait_until(confirmed, timeout=10, msg="the batch sent again")
    events = stream(redis_server, "t2")
    eids = [e["eid"] for e in events]
    assert len(eids) == len(set(eids)), "an event was stored twice"
    assert len([e for e in events if e["event"] == "publish_in"]) == 20
    assert bp.metric("fleetmq_event_log_records_total", outcome="dropped") == 0
