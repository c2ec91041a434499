"""EventLog against a real redis-server: complete records, few round trips, trimming, sampling, overload,
and sends whose outcome is unknown (a proxy loses the reply, Redis is killed): each record stored once."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from fleetmq.broker.events import MARK_TTL, EventLog, partition
from fleetmq.broker.eventschema import (
    ACK,
    CONNECT,
    DELIVER,
    DISCONNECT,
    DROP,
    FIELDS,
    PUBLISH_IN,
    ZONE_CONFIG,
    client_hash,
    sample_threshold,
    sampled,
)
from fleetmq.broker.store import keys
from fleetmq.broker.zones import ZoneSettings

pytestmark = pytest.mark.redis


def partitions(rs, fleet: str = "f") -> list[list[dict[str, str]]]:
    """Every partition stream's entries, in stream order."""
    out = []
    for key in keys.event_streams(fleet):
        raw = rs.command("XRANGE", key, "-", "+", decode=True)
        out.append([dict(zip(fv[::2], fv[1::2], strict=True)) for _, fv in raw])
    return out


def entries(rs, fleet: str = "f") -> list[dict[str, str]]:
    """Every entry of the fleet's log, in the order each writer emitted them (eid = <run>-<seq>)."""
    every = [e for p in partitions(rs, fleet) for e in p]
    return sorted(every, key=lambda e: (e["eid"].split("-")[0], int(e["eid"].split("-")[1])))


def stored(rs, fleet: str = "f") -> int:
    return sum(rs.pipeline(*(("XLEN", k) for k in keys.event_streams(fleet))))


async def until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def storing(url: str, **kw: Any) -> EventLog:
    """A started EventLog (fleet "f", node "n1") whose first record, a delivery of message 1, is stored."""
    ev = EventLog(url, fleet="f", node="n1", **kw)
    await ev.start()
    ev.emit(DELIVER, "z", "c", 1)
    await until(lambda: ev.written == 1)
    return ev


async def test_records_arrive_with_every_field(redis_server):
    ev = EventLog(redis_server.url, fleet="f", node="n1")
    await ev.start()
    before = time.time() * 1000
    ev.emit(DELIVER, "external", "client-1", 7, "a/b", 1, 12, 345, "", 3, 4)
    ev.emit(DROP, "external", "client-2", msg_id=8, topic="a/c", qos=2, reason="queue_full", mqueue_len=1000)
    await ev.stop()
    got = entries(redis_server)
    assert len(got) == 2
    d, x = got
    assert set(d) == set(FIELDS) - {"reason", "max_inflight", "max_mqueue_len", "sample"}
    assert d["node"] == "n1" and d["zone"] == "external" and d["event"] == "deliver"
    assert d["client"] == client_hash("client-1") and len(d["client"]) == 16
    assert (d["msg_id"], d["topic"], d["qos"], d["packet_id"], d["bytes"]) == ("7", "a/b", "1", "12", "345")
    assert (d["inflight_len"], d["mqueue_len"]) == ("3", "4")
    assert before - 0.001 <= float(d["ts_ms"]) <= time.time() * 1000
    assert len(d["ts_ms"].partition(".")[2]) == 3  # microseconds
    assert x == {
        "eid": x["eid"],
        "ts_ms": x["ts_ms"],
        "node": "n1",
        "zone": "external",
        "event": "drop",
        "client": client_hash("client-2"),
        "msg_id": "8",
        "topic": "a/c",
        "qos": "2",
        "reason": "queue_full",
        "mqueue_len": "1000",
    }
    assert d["eid"] != x["eid"] and d["eid"].startswith(ev.run)
    assert (ev.written, ev.dropped) == (2, 0)


async def test_a_thousand_events_take_a_few_round_trips(redis_server):
    ev = EventLog(redis_server.url, fleet="f", node="n1", batch=500, interval=0.05)
    await ev.start()
    await asyncio.sleep(0.1)  # connected, idle
    redis_server.command("CONFIG", "RESETSTAT")
    for i in range(1000):
        ev.emit(PUBLISH_IN, "z", f"c{i % 10}", i + 1, "t", 1, 1, 10)
    await until(lambda: ev.written == 1000)
    stats = redis_server.commandstats()
    assert stats["xadd"] == 1000
    # two full batches (maybe a third split by the timer), each one EVAL per partition in one round trip
    assert ev.round_trips <= 3 and stats["eval"] <= ev.round_trips * keys.EVENT_PARTITIONS, stats
    # message ids 1..1000 take the partitions in turn
    assert sorted(len(p) for p in partitions(redis_server)) == [62] * 8 + [63] * 8
    await ev.stop()


async def test_records_go_to_their_message_s_partition_else_their_client_s(redis_server):
    """A message's events share a stream (whatever node wrote them), in the order they were written; a
    client's session events share one; a node's zone_config records go to the node's."""
    a = EventLog(redis_server.url, fleet="f", node="n1")
    b = EventLog(redis_server.url, fleet="f", node="n2")
    a.set_zones({"z": ZoneSettings()})
    await a.start()
    await b.start()
    await until(lambda: a.written == 1)  # the zone_config record
    for m in range(100, 140):
        a.emit(PUBLISH_IN, "z", "pub", m, "t", 1, 1, 10)
        b.emit(DELIVER, "z", f"sub{m % 3}", m, "t", 1, 1, 10, "", 1, 0)
        b.emit(ACK, "z", f"sub{m % 3}", m, "", 1, 1)
    for c in ("sub0", "sub1", "sub2", "pub"):
        b.emit(CONNECT, "z", c)
        b.emit(DISCONNECT, "z", c, reason="normal")
    await a.stop()
    await b.stop()
    by_partition = partitions(redis_server)
    assert sum(map(len, by_partition)) == 40 * 3 + 8 + 1
    for p, records in enumerate(by_partition):
        for r in records:
            if "msg_id" in r:
                assert int(r["msg_id"]) % keys.EVENT_PARTITIONS == p
            elif r["event"] == ZONE_CONFIG:
                assert p == partition(-1, client_hash("n1"))
            else:
                assert p == partition(-1, r["client"])
        for m in {r["msg_id"] for r in records if "msg_id" in r}:
            mine = [r["event"] for r in records if r.get("msg_id") == m and r["node"] == "n2"]
            assert mine == ["deliver", "ack"]
    assert sum(1 for records in by_partition if records) > keys.EVENT_PARTITIONS // 2


async def test_maxlen_trims_each_partition_to_its_share(redis_server):
    ev = EventLog(redis_server.url, fleet="f", node="n1", max_len=1000)
    await ev.start()
    for i in range(10_000):
        ev.emit(DELIVER, "z", "c", i + 1)
    await ev.stop()
    assert ev.written == 10_000
    # MAXLEN ~ frees whole stream nodes (100 entries by default): each partition keeps at least its share,
    # never far above; together never below 1000
    share = -(-1000 // keys.EVENT_PARTITIONS)
    lengths = [len(p) for p in partitions(redis_server)]
    assert all(share <= n < share + 100 for n in lengths), lengths
    assert sum(lengths) >= 1000
    last = partitions(redis_server)[10_000 % keys.EVENT_PARTITIONS][-1]
    assert last["msg_id"] == "10000"


async def test_redis_down_drops_with_a_counter_and_never_blocks(redis_server, monkeypatch):
    """emit() never touches a socket (it only buffers; a task sends), whatever Redis does. (Told by the
    socket calls made during emit, not by how long it took: a busy machine stalls any call for a while.)"""
    ev = await storing(redis_server.url, max_buffer=2000, batch=100, timeout=0.5)
    redis_server.stop()
    inside, in_emit = [False], []
    for name in ("connect", "connect_ex", "send", "sendall", "recv", "recv_into"):

        def spy(self, *a, _real=getattr(socket.socket, name), _name=name, **kw):
            if inside[0]:
                in_emit.append(_name)
            return _real(self, *a, **kw)

        monkeypatch.setattr(socket.socket, name, spy)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    for i in range(5000):
        inside[0] = True
        ev.emit(DELIVER, "z", "c", i + 2)
        inside[0] = False
        if i % 500 == 0:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert in_emit == [], "emit waited for Redis"
    assert ticks > 40, "the event loop was blocked"
    assert ev.errors >= 1
    assert ev.buffered <= 2000
    assert ev.dropped >= 3000  # 5000 emitted, at most max_buffer kept
    redis_server.start()
    await until(lambda: ev.buffered == 0, timeout=15)
    await ev.stop()
    t.cancel()
    assert ev.written + ev.dropped == 5001
    assert stored(redis_server) == ev.written
    assert ev.written >= 1 + 1000  # what the buffer held while Redis was away is sent on its return


async def test_paused_redis_is_a_slow_redis_drops_not_waits(redis_server):
    ev = await storing(redis_server.url, max_buffer=1000, batch=100, timeout=0.3)
    redis_server.pause()
    try:
        t0 = time.perf_counter()
        for i in range(3000):
            ev.emit(DELIVER, "z", "c", i + 2)
            if i % 300 == 0:
                await asyncio.sleep(0.02)
        assert time.perf_counter() - t0 < 2.0
        await until(lambda: ev.errors >= 1)
        assert ev.dropped >= 2000
    finally:
        redis_server.resume()
    await until(lambda: ev.buffered == 0, timeout=15)
    await ev.stop()
    assert ev.written + ev.dropped == 3001
    # a send that timed out reached Redis after the resume: stored though not confirmed (counted dropped if
    # its resend did not fit), never stored twice
    eids = [e["eid"] for e in entries(redis_server)]
    assert len(eids) == len(set(eids))
    assert ev.written <= len(eids) <= ev.written + ev.errors * ev.batch


def test_sampling_is_a_function_of_the_message_id():
    thr = sample_threshold(0.25)
    kept = sum(sampled(m, thr) for m in range(10**9, 10**9 + 40_000))
    assert 0.24 * 40_000 < kept < 0.26 * 40_000
    assert all(sampled(m, sample_threshold(1.0)) for m in range(100))
    assert not any(sampled(m, sample_threshold(0.0)) for m in range(100))
    with pytest.raises(ValueError, match=r"0\.\.1"):
        sample_threshold(1.5)


async def test_sampling_keeps_a_message_s_events_together_across_nodes(redis_server):
    publisher = EventLog(redis_server.url, fleet="f", node="n1", sample=0.3)
    subscriber = EventLog(redis_server.url, fleet="f", node="n2", sample=0.3)
    await publisher.start()
    await subscriber.start()
    n = 3000
    for m in range(5000, 5000 + n):
        publisher.emit(PUBLISH_IN, "z", "pub", m, "t", 1, 1, 10)
        subscriber.emit(DELIVER, "z", "sub", m, "t", 1, 1, 10, "", 1, 0)
        subscriber.emit(ACK, "z", "sub", m, "", 1, 1)
    publisher.emit(DROP, "z", "pub", 1, reason="no_subscribers")  # not a sampled kind: always kept
    await publisher.stop()
    await subscriber.stop()
    by_msg: dict[str, set[str]] = {}
    for e in entries(redis_server):
        by_msg.setdefault(e["msg_id"], set()).add(e["event"])
    assert by_msg.pop("1") == {"drop"}
    assert all(events == {"publish_in", "deliver", "ack"} for events in by_msg.values())
    assert 0.25 * n < len(by_msg) < 0.35 * n


async def test_zone_config_records_the_zones_limits(redis_server):
    ev = EventLog(redis_server.url, fleet="f", node="n1", sample=0.5)
    ev.set_zones({"external": ZoneSettings(max_inflight=32, max_mqueue_len=1000)})
    await ev.start()
    await until(lambda: ev.written == 1)
    await ev.stop()
    (z,) = entries(redis_server)
    assert z["event"] == ZONE_CONFIG and z["zone"] == "external"
    assert (z["max_inflight"], z["max_mqueue_len"], z["sample"]) == ("32", "1000", "0.5")


async def test_a_malformed_record_is_dropped_and_counted_not_raised(redis_server):
    ev = EventLog(redis_server.url, fleet="f", node="n1")
    await ev.start()
    ev.emit(DELIVER, "z", "c", None)  # type: ignore[arg-type]  # not a value Redis can take
    ev.emit(DELIVER, "z", "c", 2)
    await until(lambda: ev.written + ev.dropped == 2)
    await ev.stop()
    assert (ev.written, ev.dropped) == (1, 1)
    assert [e["msg_id"] for e in entries(redis_server)] == ["2"]


def test_bad_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="fleet name"):
        EventLog("redis://127.0.0.1:1/0", fleet="", node="n")
    with pytest.raises(ValueError, match="max_len"):
        EventLog("redis://127.0.0.1:1/0", fleet="f", node="n", max_len=0)
    with pytest.raises(ValueError, match="sample"):
        EventLog("redis://127.0.0.1:1/0", fleet="f", node="n", sample=-0.1)
    with pytest.raises(ValueError, match="redis url"):
        EventLog("http://nowhere", fleet="f", node="n")


def test_emit_needs_no_loop_and_keeps_to_its_bound():
    """The data path's share is synchronous buffering: no event loop, no connection, a hard bound."""
    ev = EventLog("redis://127.0.0.1:1/0", fleet="f", node="n", max_buffer=1000, batch=100)
    for i in range(1500):
        ev.emit(DELIVER, "external", "client-17", i + 1, "sensors/1/temp", 1, i & 0xFFFF, 64, "", 5, 0)
    assert (ev.buffered, ev.dropped, ev.written) == (1000, 500, 0)


def test_overload_samples_fewer_messages_and_recovers():
    """Past max_rate per-message events a second (the node's delivery counters say how many are offered),
    fewer messages are kept: the log's cost stays bounded whatever the message rate, and the same message ids
    are kept on every node (a lower rate keeps a subset of a higher rate's messages)."""
    offered = [0]
    ev = EventLog("redis://127.0.0.1:1/0", fleet="f", node="n", max_rate=1000, offered=lambda: offered[0])
    t0 = ev._adjusted
    offered[0] += 20_000  # 20,000 offered in one second
    ev._adapt(t0 + 1.0)
    assert ev.effective_sample == pytest.approx(1000 / 20_000)
    kept = [m for m in range(100_000, 120_000) if ev.keeps(m)]
    assert 900 < len(kept) < 1100  # any run of message ids is sampled evenly
    offered[0] += 20_000
    ev._adapt(t0 + 2.0)  # the rate holds
    assert ev.effective_sample == pytest.approx(1000 / 20_000)
    ev._adapt(t0 + 3.0)  # quiet: it recovers, doubling each interval, up to the configured sample
    assert ev.effective_sample == pytest.approx(2 * 1000 / 20_000)
    for i in range(4, 12):
        ev._adapt(t0 + i)
    assert ev.effective_sample == 1.0 and all(ev.keeps(m) for m in range(100))
    low = sample_threshold(0.05)
    assert all(sampled(m, sample_threshold(0.5)) for m in range(10_000) if sampled(m, low))


# -- sends whose outcome is unknown (issue 25) ------------------------------------------------------------
LOST = (b"EVAL", b"'XADD'")  # the proxy's needles for an event batch


async def test_a_batch_whose_reply_was_lost_is_stored_once_when_sent_again(redis_server, redis_proxy):
    """Redis ran the batch and its reply never came back: its records go back to the buffer and are sent
    again, and the script skips those at or below their partition's mark. Before, each was stored twice."""
    ev = EventLog(redis_proxy.url, fleet="f", node="n1", interval=0.05)
    await ev.start()
    lost = redis_proxy.lose_reply(*LOST)
    for m in range(100):
        ev.emit(DELIVER, "z", f"c{m % 7}", m + 1, "t", 1, m + 1, 10)
    await until(lambda: ev.written == 100, timeout=10)
    await ev.stop()
    assert lost.is_set() and ev.errors >= 1
    eids = [e["eid"] for e in entries(redis_server)]
    assert len(eids) == len(set(eids)) == 100
    assert (ev.repeated, ev.dropped) == (100, 0)
    mark = f"{keys.event_streams('f')[0]}:stored:{ev.run}"  # msg_ids 16, 32... 96
    assert redis_server.command("GET", mark) == b"96"
    assert 0 < redis_server.command("TTL", mark) <= MARK_TTL


async def test_records_buffered_across_a_redis_kill_are_stored_once_or_counted_dropped(
    redis_server, redis_proxy
):
    """A batch runs, its reply is lost and Redis is killed (kill -9, AOF fsynced at every write); records
    emitted meanwhile are buffered as far as they fit. Restarted on its AOF, Redis gets the lost batch again
    (skipped: its records and marks came back from the AOF) and the rest: each record is stored once, or
    counted dropped (it did not fit). Before, the lost batch was stored twice."""
    ev = EventLog(
        redis_proxy.url, fleet="f", node="n1", batch=100, max_buffer=300, interval=0.05, timeout=0.5
    )
    await ev.start()
    redis_proxy.lose_reply(*LOST)
    for m in range(100):
        ev.emit(DELIVER, "z", "c", m + 1, "t", 1, 1, 10)
    await until(lambda: stored(redis_server) == 100)
    ran = {e["eid"] for e in entries(redis_server)}
    redis_server.kill()
    for m in range(100, 500):
        ev.emit(DELIVER, "z", "c", m + 1, "t", 1, 1, 10)
        if m % 50 == 0:
            await asyncio.sleep(0.02)  # sends fail meanwhile (connection refused): the records wait
    await until(lambda: ev.errors >= 2)
    redis_server.start()
    await until(lambda: ev.buffered == 0, timeout=15)
    await ev.stop()
    eids = [e["eid"] for e in entries(redis_server)]
    assert len(eids) == len(set(eids)), "a record was stored twice"
    assert ran <= set(eids)
    # the buffer held 300 (the lost batch first, unless records emitted during a failed send pushed some of
    # it out): each of the 500 records is written or dropped, and only the lost batch is stored unconfirmed
    assert ev.written + ev.dropped == 500 and ev.dropped >= 200
    assert len(eids) == len(ran) + ev.written - ev.repeated


async def test_a_refused_batch_holds_back_the_later_records_of_its_partition(redis_server, redis_proxy):
    """Redis refuses a batch (OOM) and would take the next batch of the same flush: that one waits for the
    next flush, behind the refused one. Sent, it would have left a mark above the refused records, whose
    resend would then be skipped (lost); before marks, they were stored after it, out of order."""
    ev = EventLog(redis_proxy.url, fleet="f", node="n1", batch=50, interval=0.05)
    await ev.start()
    redis_proxy.delay(0.5, b"second-half")  # (a second batch sent would wait here while Redis recovers)
    redis_server.command("CONFIG", "SET", "maxmemory", "1")
    try:
        for m in range(100):  # all in partition 0; one flush, two batches
            ev.emit(DELIVER, "z", "c", 16 * (m + 1), "first-half" if m < 50 else "second-half", 1, 1, 10)
        await until(lambda: ev.errors >= 1)
    finally:
        redis_server.command("CONFIG", "SET", "maxmemory", "0")
    await until(lambda: ev.written == 100, timeout=10)
    await ev.stop()
    assert [int(e["msg_id"]) for e in partitions(redis_server)[0]] == [16 * (m + 1) for m in range(100)]
    assert (ev.repeated, ev.dropped) == (0, 0)


async def test_zone_config_records_sent_ahead_of_older_records_hide_none_of_them(redis_server):
    """zone_config records go first in a flush, numbered after records still buffered for the same partition:
    they keep a mark of their own, or those records would be skipped as stored already."""
    ev = EventLog(redis_server.url, fleet="f", node="n1")
    p = partition(-1, client_hash("n1"))
    for m in range(10):
        ev.emit(DELIVER, "z", "c", p + 16 * (m + 1))
    ev.set_zones({"z": ZoneSettings()})
    await ev.start()
    await until(lambda: ev.written == 11)
    await ev.stop()
    assert [e["event"] for e in entries(redis_server)] == [DELIVER] * 10 + [ZONE_CONFIG]
    assert ev.repeated == 0


async def test_records_are_not_resent_once_their_marks_may_have_expired(redis_server):
    """A mark lives MARK_TTL after its run's last batch: after failing for half that, the records of failed
    sends are dropped and counted, never sent again over a mark that may be gone."""
    ev = EventLog(redis_server.url, fleet="f", node="n1", interval=3600, timeout=0.5)
    await ev.start()
    redis_server.stop()
    for m in range(10):
        ev.emit(DELIVER, "z", "c", m + 1)
    await ev.flush()
    assert (ev.buffered, ev.dropped, ev.errors) == (10, 0, 1)
    ev._failing_since -= MARK_TTL / 2  # (half a day of failing)
    await ev.flush()
    assert (ev.buffered, ev.dropped) == (0, 10)
    redis_server.start()
    await ev.stop()
    assert stored(redis_server) == 0
