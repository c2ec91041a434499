"""The Redis store's scripts on a real redis-server, driven through RedisStore itself: what a commit does to
the keys of a session when the committing node's copy of it is stale (fenced by a later claim)."""

from __future__ import annotations

import asyncio

import pytest
from fleetmq.broker.journal import JournalChanges
from fleetmq.broker.message import Delivery, Message
from fleetmq.broker.store import keys, wire
from fleetmq.broker.store.base import Enqueue, Save
from fleetmq.broker.store.redis_store import RedisStore
from fleetmq.broker.zones import ZoneSettings

pytestmark = pytest.mark.redis

ZONE = ZoneSettings()


def delivery(payload: bytes, qos: int, order: int, packet_id: int = 0, sender_epoch: int = 0) -> Delivery:
    msg = Message("t/x", payload, qos, sender="pub")
    msg.sender_epoch = sender_epoch
    d = Delivery(msg, qos, False)
    d.order, d.packet_id = order, packet_id
    return d


def changes(cid: str, epoch: int, puts: list[Delivery], fresh: list[Delivery]) -> JournalChanges:
    return JournalChanges(
        cid, epoch, 9, 100, {d.msg.msg_id: d for d in puts}, {}, [d.msg.msg_id for d in fresh]
    )


async def test_a_fenced_journal_queues_what_was_routed_into_the_stale_copy(redis_server):
    old, new = RedisStore.from_url(redis_server.url, "old"), RedisStore.from_url(redis_server.url, "new")
    await old.open()
    await new.open()
    try:
        cid = "sub-1"
        await new.claim("pub", ZONE, "default", False, expiry=60)  # the publisher's session, at epoch 1
        first = await old.claim(cid, ZONE, "default", False, expiry=60)
        second = await new.claim(cid, ZONE, "default", False, expiry=60)  # old is fenced now
        assert second.epoch == first.epoch + 1
        pubsub = new.redis.pubsub()
        await pubsub.subscribe(new.channels.node("new"))
        pulled = delivery(b"pulled", 1, 3, packet_id=7)  # came from the store: not fresh
        sent = delivery(b"sent", 1, 4, packet_id=8)  # routed here and sent already
        queued = delivery(b"queued", 2, 5, sender_epoch=1)  # routed here, publisher still at epoch 1
        stale_pub = delivery(b"stale-pub", 2, 6, sender_epoch=99)  # its publisher is fenced too
        qos0 = delivery(b"qos0", 0, 7)
        result = await old.commit(
            [
                changes(
                    cid, first.epoch, [pulled, sent, queued, stale_pub, qos0], [sent, queued, stale_pub, qos0]
                )
            ]
        )
        assert result.fenced == [(cid, first.epoch)]
        assert (result.rerouted, result.refused) == (2, 1)
        m, _s, q, i, _r = keys.session_keys(cid)
        items = [wire.unpack_delivery(raw) for raw in await new.redis.lrange(q, 0, -1)]
        assert [(d.msg.payload, d.qos, d.packet_id, d.stage) for d in items] == [
            (b"sent", 1, 0, 0),
            (b"queued", 2, 0, 0),
        ], "the routed deliveries, in order, as not sent yet"
        assert await new.redis.hlen(i) == 0, "the stale copy's journal changes were refused"
        assert await new.redis.hget(m, "epoch") == str(second.epoch).encode()
        woken = None
        for _ in range(20):
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg is not None:
                woken = wire.parse_node_message(msg["data"])
                break
        assert woken == wire.Wake(cid), "the owner is woken to pull them"
        await pubsub.aclose()
    finally:
        await asyncio.gather(old.close(), new.close())


async def test_a_fenced_journal_of_an_offline_session_keeps_its_queue_limit(redis_server):
    old, new = RedisStore.from_url(redis_server.url, "old"), RedisStore.from_url(redis_server.url, "new")
    await old.open()
    try:
        cid = "sub-2"
        zone = ZoneSettings(max_mqueue_len=2)
        first = await old.claim(cid, zone, "default", False, expiry=60)
        await old.claim(cid, zone, "default", False, expiry=60)  # claimed again...
        await old.redis.hset(
            keys.session_keys(cid)[keys.META], mapping={"online": 0, "maxq": 2}
        )  # ...and left
        routed = [delivery(b"r%d" % n, 1, n) for n in range(3)]
        result = await old.commit([changes(cid, first.epoch, routed, routed)])
        assert result.fenced == [(cid, first.epoch)] and result.dropped == [("default", cid, 1)]
        q = keys.session_keys(cid)[keys.QUEUE]
        assert [wire.unpack_delivery(r).msg.payload for r in await old.redis.lrange(q, 0, -1)] == [
            b"r1",
            b"r2",
        ]
    finally:
        await asyncio.gather(old.close(), new.close())


async def test_a_journal_does_not_store_what_a_fenced_publisher_routed(redis_server):
    """The same guard as a routing through the store: a delivery routed into an owned session here for a
    publisher whose session is another node's now is not stored (the node takes it back from its copy;
    the publisher sends it again to its new owner, which routes it once)."""
    store = RedisStore.from_url(redis_server.url, "n")
    await store.open()
    try:
        await store.claim("pub", ZONE, "default", False, expiry=60)
        pub = await store.claim("pub", ZONE, "default", False, expiry=60)  # the publisher moved on
        sub = await store.claim("sub-3", ZONE, "default", False, expiry=60)
        ok = delivery(b"ok", 2, 0, packet_id=1, sender_epoch=pub.epoch)
        stale = delivery(b"stale", 2, 1, packet_id=2, sender_epoch=pub.epoch - 1)
        result = await store.commit([changes("sub-3", sub.epoch, [ok, stale], [ok, stale])])
        assert result.fenced == [] and result.rerouted == 0
        journal = await store.redis.hgetall(keys.session_keys("sub-3")[keys.JOURNAL])
        assert [wire.unpack_journal(v).msg.payload for v in journal.values()] == [b"ok"]
    finally:
        await store.close()


@pytest.mark.parametrize(("overflow", "kept"), [("dropOldest", [b"%04d" % n for n in range(6, 10)]),
                                                ("dropNew", [b"%04d" % n for n in range(4)])])  # fmt: skip
async def test_an_offline_queue_is_bounded_by_bytes_as_its_overflow_policy_says(redis_server, overflow, kept):
    """max_mqueue_bytes (a bridge's queue.maxBytes) in the store: the queue keeps what fits, the oldest
    or the new ones going as the overflow policy says, every drop counted; the byte count drains with
    the queue."""
    from fleetmq.broker.session import Session
    from fleetmq.broker.store.base import Enqueue, Save

    store = RedisStore.from_url(redis_server.url, "n1")
    await store.open()
    try:
        cid = f"bytes-{overflow}"
        zone = ZoneSettings(max_mqueue_len=0, max_mqueue_bytes=1024, mqueue_overflow=overflow)
        claimed = await store.claim(cid, zone, "default", False, expiry=60)
        session = Session(cid, zone, "default", expiry_interval=60)
        session.epoch = claimed.epoch
        await store.commit([Save(session, 60)])  # parked: offline, its limits in the store
        big = b"x" * 190  # with topic "t/x" and the packing, 240 bytes stored: 4 fit in 1024
        dropped = 0
        for n in range(10):
            d = delivery(b"%04d" % n + big, 1, -1)
            result = await store.commit([Enqueue(cid, d)])
            dropped += sum(k for _z, _c, k in result.dropped)
        q, meta = keys.session_keys(cid)[keys.QUEUE], keys.session_keys(cid)[keys.META]
        got = [wire.unpack_delivery(r).msg.payload[:4] for r in await store.redis.lrange(q, 0, -1)]
        assert got == kept and dropped == 6
        assert 0 < int(await store.redis.hget(meta, "qb")) <= 1024
        again = await store.claim(cid, zone, "default", False, expiry=60)
        assert again.stored is not None and len(again.stored.deliveries) == 4
        assert await store.redis.hget(meta, "qb") is None  # (the queue moved into the session: drained)
    finally:
        await store.close()


async def test_a_claim_sent_again_brings_what_was_queued_between_its_two_runs(redis_server):
    """Issue 25, found by `python -m chaos --store cluster --nemesis redis-term --seed 1` (50 lost): a claim
    whose reply was lost is sent again with its token and gets the same answer. The answer was read
    afresh, its receipts (x:) counting what had been queued for the session since the first run, but what
    was queued stayed in the queue: the catch-up pulled it and took it for repeats of what the session
    had already seen. The re-run moves it into the journal, as the first run moved what was queued."""
    store = RedisStore.from_url(redis_server.url, "n")
    await store.open()
    try:
        cid = "sub-3"
        await store.claim(cid, ZONE, "default", False, expiry=60)
        await store.commit([Save(await _session(store, cid), 60.0)])  # parked: routings queue for it
        first = await store.claim(cid, ZONE, "default", False, expiry=60, token="t1")
        msg = Message("t/x", b"queued meanwhile", 2, sender="pub")
        msg.receipt = ("inc1", 5)
        await store.commit([Enqueue(cid, Delivery(msg, 2, False))])
        again = await store.claim(cid, ZONE, "default", False, expiry=60, token="t1")
        assert again.epoch == first.epoch, "the same claim, not a second one"
        assert again.stored is not None
        assert again.stored.seen == {"inc1": 5}
        assert [d.msg.payload for d in again.stored.deliveries] == [b"queued meanwhile"]
        assert await store.redis.llen(keys.session_keys(cid)[keys.QUEUE]) == 0
    finally:
        await store.close()


async def _session(store: RedisStore, cid: str):
    from fleetmq.broker.session import Session

    s = Session(cid, ZONE, expiry_interval=60)
    s.epoch = int(await store.redis.hget(keys.session_keys(cid)[keys.META], "epoch"))
    return s


async def test_what_was_queued_before_a_hold_goes_ahead_of_it_when_another_node_claims_the_session(
    redis_server,
):
    """Issue 25, found by `python -m chaos --store cluster --seed 703` (18 first deliveries out of publish
    order). A session opens on node a, which holds later deliveries back behind positions reserved for
    what Redis queued for it (Session.hold_back) and journals one there. The pull that would bring what
    was queued fails (Redis went down), so the session resynchronises, and node b claims it: what was
    queued before the hold must come before what was held back (it did not: the claim numbered it after
    everything stored), and what was queued after the hold after it."""
    from fleetmq.broker.cm import CATCH_UP

    a, b = RedisStore.from_url(redis_server.url, "a"), RedisStore.from_url(redis_server.url, "b")
    await a.open()
    await b.open()
    try:
        cid = "sub-4"
        await a.claim(cid, ZONE, "default", False, expiry=60)
        await a.commit([Save(await _session(a, cid), 60.0)])  # offline: routings queue for it
        m1 = Delivery(Message("t/x", b"m1", 1, sender="pub"), 1, False)
        await b.commit([Enqueue(cid, m1)])
        opened = await a.claim(cid, ZONE, "default", False, expiry=60)  # on node a again...
        assert opened.stored is not None and [d.msg.payload for d in opened.stored.deliveries] == [b"m1"]
        m2 = Delivery(Message("t/x", b"m2", 1, sender="pub"), 1, False)
        await b.commit([Enqueue(cid, m2)])  # ...routed through Redis just before a knew
        first = opened.stored.order
        m3 = delivery(b"m3", 1, first + CATCH_UP)  # routed to it on a, held back behind the reservation
        hold = changes(cid, opened.epoch, [m3], [m3])
        hold.order, hold.hold = first + CATCH_UP + 1, first
        assert await a.commit([hold])  # (the catch-up pull that would bring m2 never runs)
        await b.commit([Enqueue(cid, Delivery(Message("t/x", b"m4", 1, sender="pub"), 1, False))])
        claimed = await b.claim(cid, ZONE, "default", False, expiry=60)
        assert claimed.stored is not None
        journal = sorted(claimed.stored.deliveries, key=lambda d: d.order)
        assert [d.msg.payload for d in journal] == [b"m1", b"m2", b"m3", b"m4"]
        meta = await b.redis.hgetall(keys.session_keys(cid)[keys.META])
        assert b"rsv" not in meta, "the reservation outlived the claim that used it"
    finally:
        await a.close()
        await b.close()


async def test_a_copy_queued_while_the_session_took_the_message_itself_is_not_restored_after_it(redis_server):
    """Issue 25, chaos --store cluster --seed 707 (a QoS 2 message delivered twice). A publisher's node
    routed a message to a subscriber there, but its commit came late (the node had been paused), and
    meanwhile the publisher sent the message again through another node, which queued a copy under the
    same receipt through the store. The subscriber got the node's copy and acknowledged it (gone); the
    queued copy stayed, and the next owner of the session delivered it again. JOURNAL now marks which
    copy the session took (meta d:<incarnation>:<number>) and a claim hands the marks over (twins)."""
    from fleetmq.broker.session import Session

    a, b = RedisStore.from_url(redis_server.url, "a"), RedisStore.from_url(redis_server.url, "b")
    await a.open()
    await b.open()
    try:
        cid, receipt = "sub-5", ("incP", 5)
        opened = await a.claim(cid, ZONE, "default", False, expiry=60)
        queued = Delivery(Message("t/x", b"m", 2, sender="pub"), 2, False)
        queued.msg.receipt = receipt
        await b.commit([Enqueue(cid, queued)])  # the publisher's resend, routed through the store
        own = delivery(b"m", 2, opened.stored.order if opened.stored else 0, packet_id=1)
        own.msg.receipt = receipt
        took = changes(cid, opened.epoch, [own], [own])
        took.seen = {"incP": 5}
        await a.commit([took])  # the copy the node routed to it itself, committed late
        await a.commit([JournalChanges(cid, opened.epoch, 9, 100, {own.msg.msg_id: None}, {}, [])])  # PUBCOMP
        claimed = await b.claim(cid, ZONE, "default", False, expiry=60)
        assert claimed.stored is not None
        assert claimed.stored.twins == {receipt: own.msg.msg_id}
        s = Session(cid, ZONE)
        s.restore(
            epoch=claimed.epoch, expiry_interval=60.0, next_pid=9, order=claimed.stored.order,
            subscriptions=[], deliveries=claimed.stored.deliveries, awaiting_rel=[], sink=_NoSink(),
            incarnation="", received=0, seen=claimed.stored.seen, twins=claimed.stored.twins,
        )  # fmt: skip
        assert not s.inflight and not s.mqueue, "the queued copy was restored after the session's own"
    finally:
        await a.close()
        await b.close()


async def test_a_repeat_taken_unchecked_while_catching_up_is_not_kept_for_the_next_owner(redis_server):
    """Issue 25, chaos --store cluster --seed 707 at 81d3304 (a QoS 2 message delivered twice). A subscriber's
    session got a message and completed it on node a. It opened on node b, which held later deliveries back
    while catching up; there its publisher's resend was routed to it, taken unchecked (Session.admit), and
    journaled. The session moved on before catching up, and its next owner delivered the resend again.
    JOURNAL now keeps a delivery taken unchecked only if the store has not accepted its receipt yet."""
    from fleetmq.broker.cm import CATCH_UP

    a, b = RedisStore.from_url(redis_server.url, "a"), RedisStore.from_url(redis_server.url, "b")
    await a.open()
    await b.open()
    try:
        cid = "sub-6"
        opened = await a.claim(cid, ZONE, "default", False, expiry=60)
        original = delivery(b"m5", 2, opened.stored.order if opened.stored else 0, packet_id=1)
        original.msg.receipt = ("incP", 5)
        took = changes(cid, opened.epoch, [original], [original])
        took.seen = {"incP": 5}
        await a.commit([took])
        await a.commit([JournalChanges(cid, opened.epoch, 9, 100, {original.msg.msg_id: None}, {}, [])])
        moved = await b.claim(cid, ZONE, "default", False, expiry=60)
        assert moved.stored is not None and moved.stored.seen == {"incP": 5}
        first = moved.stored.order
        held_from = first + CATCH_UP
        resend = delivery(b"m5", 2, held_from)  # the publisher's resend: a new copy, same receipt
        resend.msg.receipt = ("incP", 5)
        newer = delivery(b"m6", 2, held_from + 1)  # its next message: new to the session
        newer.msg.receipt = ("incP", 6)
        hold = changes(cid, moved.epoch, [resend, newer], [resend, newer])
        hold.order, hold.hold, hold.unchecked_from = held_from + 2, first, held_from
        assert await b.commit([hold])
        meta = await b.redis.hgetall(keys.session_keys(cid)[keys.META])
        assert not [k for k in meta if k.startswith(b"d:")], "the resend was marked as the session's own"
        claimed = await a.claim(cid, ZONE, "default", False, expiry=60)  # before b caught up
        assert claimed.stored is not None
        assert [d.msg.payload for d in claimed.stored.deliveries] == [b"m6"]
    finally:
        await a.close()
        await b.close()


class _NoSink:
    def journal_changed(self, journal) -> None:
        pass
