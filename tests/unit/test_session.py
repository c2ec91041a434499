"""Unit tests of the sans-I/O session state machine (fleetmq.broker.session).

EMQX semantics: Inflight Window, Message Queue with drop-oldest, FIFO refill, retransmission in original
order with original packet ids, QoS2 exactly once (PUBREL stage keeps its place), awaiting_rel.
"""

from __future__ import annotations

import time

import pytest
from fleetmq.broker import inflight as window
from fleetmq.broker.message import Delivery, Message
from fleetmq.broker.session import NO_AWAITING_REL, AwaitingRelFull, Session
from fleetmq.broker.zones import ZoneSettings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule


def zone(**kw) -> ZoneSettings:
    return ZoneSettings(**kw)


def dl(n: int | str, qos: int = 1, *, msg: Message | None = None) -> Delivery:
    """A delivery whose payload names it (b"1", b"2", ...)."""
    m = msg if msg is not None else Message("t", str(n).encode(), qos)
    return Delivery(m, qos, False)


def names(ds) -> list[str]:
    return [d.msg.payload.decode() for d in ds]


def queued(s: Session) -> list[str]:
    return names(s.mqueue)


def inflight(s: Session) -> list[str]:
    return names(s.inflight.values())


# -----------------------------------------------------------------------------------------------
# the seed scenario (emqx-message-retransmission: window 2, four QoS1 messages -> 1,2,3,2,3,4)
# -----------------------------------------------------------------------------------------------


def test_seed_retransmission_ordering_scenario():
    s = Session("c", zone(max_inflight=2, retry_interval=30))
    wire: list[tuple[str, int, bool]] = []  # (message, packet id, dup)

    # #1/#2: four messages; 1 and 2 go into the window, 3 and 4 wait in the queue.
    ds = {n: dl(n) for n in range(1, 5)}
    for n in range(1, 5):
        sent, dropped = s.deliver(ds[n], now=0.0)
        assert dropped == []
        if n <= 2:
            assert sent is ds[n]
            wire.append((str(n), sent.packet_id, False))
        else:
            assert sent is None
    assert inflight(s) == ["1", "2"]
    assert queued(s) == ["3", "4"]
    pid = {n: ds[n].packet_id for n in (1, 2)}
    assert pid[1] != pid[2]

    # #3: the client acks only 1; 3 is sent.
    assert s.puback(pid[1]) is ds[1]
    sent, expired = s.refill(now=1.0)
    assert names(sent) == ["3"] and expired == []
    pid[3] = ds[3].packet_id
    assert pid[3] not in (pid[2],)
    wire.append(("3", pid[3], False))
    assert inflight(s) == ["2", "3"]
    assert queued(s) == ["4"]

    # Nothing is due before the retry interval has passed for an entry.
    assert s.retry_due(now=29.0, interval=30) == []

    # #4: the wait times out: 2 and 3 are resent, in original order with their original packet ids.
    due = s.retry_due(now=31.5, interval=30)
    assert names(due) == ["2", "3"]
    assert [d.packet_id for d in due] == [pid[2], pid[3]]
    wire.extend((d.msg.payload.decode(), d.packet_id, True) for d in due)
    assert queued(s) == ["4"]  # a retransmission never lets the queue jump ahead

    # #5: acks for 2 and 3 free the window and 4 goes out.
    assert s.puback(pid[2]) is ds[2]
    assert s.refill(now=32.0)[0][0] is ds[4]
    assert s.puback(pid[3]) is ds[3]
    assert s.refill(now=32.0) == ([], [])
    wire.append(("4", ds[4].packet_id, False))

    # #6: done; the client saw 1,2,3,2,3,4 with the repeats marked DUP.
    assert s.puback(ds[4].packet_id) is ds[4]
    assert len(s.inflight) == 0 and len(s.mqueue) == 0
    assert [w[0] for w in wire] == ["1", "2", "3", "2", "3", "4"]
    assert [w[2] for w in wire] == [False, False, False, True, True, False]
    # first occurrences are in order
    firsts = [w[0] for w in wire if not w[2]]
    assert firsts == sorted(firsts)


def test_retry_due_restarts_timers_and_only_returns_old_entries():
    s = Session("c", zone(max_inflight=0))
    a, b = dl("a"), dl("b")
    s.deliver(a, now=0.0)
    s.deliver(b, now=10.0)
    assert s.next_retry(30) == 30.0
    assert names(s.retry_due(now=30.0, interval=30)) == ["a"]  # exactly at the interval: due
    # a's timer restarted at 30; b is due at 40
    assert s.next_retry(30) == 40.0
    assert names(s.retry_due(now=40.0, interval=30)) == ["b"]
    assert names(s.retry_due(now=60.0, interval=30)) == ["a"]
    s.puback(a.packet_id)
    s.puback(b.packet_id)
    assert s.next_retry(30) is None
    assert s.retry_due(now=1000.0, interval=30) == []


# -----------------------------------------------------------------------------------------------
# Message Queue: drop oldest, unlimited, FIFO refill
# -----------------------------------------------------------------------------------------------


def test_queue_full_drops_oldest_and_returns_it():
    s = Session("c", zone(max_inflight=1, max_mqueue_len=2))
    ds = [dl(n) for n in range(1, 6)]
    assert s.deliver(ds[0], 0.0) == (ds[0], [])
    assert s.deliver(ds[1], 0.0) == (None, [])
    assert s.deliver(ds[2], 0.0) == (None, [])
    sent, dropped = s.deliver(ds[3], 0.0)
    assert sent is None
    assert dropped == [ds[1]]  # the OLDEST queued message, not the newcomer
    assert queued(s) == ["3", "4"]
    sent, dropped = s.deliver(ds[4], 0.0)
    assert dropped == [ds[2]]
    assert queued(s) == ["4", "5"]
    assert inflight(s) == ["1"]  # the window is untouched by queue drops


def test_a_session_makes_its_queue_when_the_first_delivery_waits():
    """Sessions whose deliveries go straight into the window share one empty queue (a deque is a 760-byte
    block even empty); the first delivery that waits gets the session a queue of its own, with the zone's
    limits, and the shared one refuses to hold anything."""
    s, other = Session("c", zone(max_inflight=1, max_mqueue_len=2)), Session("d", zone())
    assert s.mqueue is other.mqueue and not s.mqueue
    assert s.deliver(dl(1), 0.0)[0] is not None and s.mqueue is other.mqueue
    assert s.apply_zone(zone(max_inflight=1, max_mqueue_len=5)) == [] and s.mqueue is other.mqueue
    assert s.deliver(dl(2), 0.0) == (None, [])
    assert s.mqueue is not other.mqueue and queued(s) == ["2"] and s.mqueue.max_len == 5
    assert not other.mqueue
    with pytest.raises(RuntimeError, match="shared empty Message Queue"):
        other.mqueue.append(dl(3))
    assert other.enqueue(dl(3)) == [] and queued(other) == ["3"]


def test_receipts_and_seen_numbers_are_kept_once_there_is_one():
    """(Most sessions never get a receipt: their tables are made by the first.)"""
    s = Session("c", zone())
    assert s.deliver(dl(1), 0.0)[0] is not None and s.receipts is None and s.seen is None
    assert s.receipt_of(7) is None and s.seen_of("inc1") == 0 and s.release(7) is False
    assert s.accept(("inc1", 3)) and not s.accept(("inc1", 2)) and s.seen == {"inc1": 3}
    assert s.await_rel(7, 0.0, receipt=True) and s.receipt_of(7) == ("", 1)
    assert s.release(7) and s.receipt_of(7) is None and s.receipts == {}


def test_enqueue_offline_drops_oldest():
    s = Session("c", zone(max_mqueue_len=3))
    dropped_all = []
    for n in range(1, 8):
        dropped_all += s.enqueue(dl(n))
    assert names(dropped_all) == ["1", "2", "3", "4"]
    assert queued(s) == ["5", "6", "7"]
    assert len(s.inflight) == 0


def test_queue_full_with_drop_new_keeps_the_oldest_and_drops_the_newcomer():
    """A bridge's `overflow: dropNew`: what was queued first stays (HiveMQ's and mosquitto's choice for
    a bridge whose remote is away); a lowered limit drops the newest too."""
    s = Session("c", zone(max_inflight=1, max_mqueue_len=2, mqueue_overflow="dropNew"))
    ds = [dl(n) for n in range(1, 6)]
    assert s.deliver(ds[0], 0.0) == (ds[0], [])
    s.deliver(ds[1], 0.0)
    s.deliver(ds[2], 0.0)
    assert s.deliver(ds[3], 0.0) == (None, [ds[3]])
    assert s.enqueue(ds[4]) == [ds[4]]
    assert queued(s) == ["2", "3"]
    assert names(s.apply_zone(zone(max_inflight=1, max_mqueue_len=1, mqueue_overflow="dropNew"))) == ["3"]
    assert queued(s) == ["2"]


def test_a_byte_bound_queue_keeps_what_fits_by_its_overflow_policy():
    """max_mqueue_bytes (a bridge's queue.maxBytes): each delivery counts its payload and topic; the
    oldest go (or the newcomer, with dropNew) until the rest fits; a zone change brings the bound in or
    takes it away without losing what is queued."""

    def dl_sized(n: int) -> Delivery:
        return Delivery(Message("t", b"%d" % n + b"x" * 98, 1), 1, False)  # 100 bytes with the topic

    s = Session("c", zone(max_inflight=1, max_mqueue_len=0, max_mqueue_bytes=350))
    s.deliver(dl_sized(0), 0.0)  # (in the window)
    dropped = [d for n in range(1, 6) for d in s.deliver(dl_sized(n), 0.0)[1]]
    assert [d.msg.payload[:1] for d in dropped] == [b"1", b"2"] and len(s.mqueue) == 3
    assert s.mqueue.bytes == 300
    new = Session(
        "c", zone(max_inflight=1, max_mqueue_len=0, max_mqueue_bytes=250, mqueue_overflow="dropNew")
    )
    new.deliver(dl_sized(0), 0.0)
    kept = [new.deliver(dl_sized(n), 0.0)[1] for n in range(1, 5)]
    assert [len(k) for k in kept] == [0, 0, 1, 1] and [d.msg.payload[:1] for d in new.mqueue] == [b"1", b"2"]
    assert (
        new.apply_zone(zone(max_inflight=1, max_mqueue_len=0)) == []
        and new.mqueue.__class__.__name__ == "MQueue"
    )
    assert [d.msg.payload[:1] for d in new.mqueue] == [b"1", b"2"]
    gone = new.apply_zone(
        zone(max_inflight=1, max_mqueue_len=0, max_mqueue_bytes=150, mqueue_overflow="dropNew")
    )
    assert [d.msg.payload[:1] for d in gone] == [b"2"] and new.mqueue.bytes == 100


def test_zero_max_inflight_is_unlimited():
    s = Session("c", zone(max_inflight=0, max_mqueue_len=1))
    for n in range(500):
        sent, dropped = s.deliver(dl(n), 0.0)
        assert sent is not None and dropped == []
    assert len(s.inflight) == 500
    assert len(s.mqueue) == 0
    assert len({d.packet_id for d in s.inflight.values()}) == 500


def test_zero_max_mqueue_len_is_unlimited():
    s = Session("c", zone(max_inflight=1, max_mqueue_len=0))
    s.deliver(dl("first"), 0.0)
    for n in range(3000):
        assert s.deliver(dl(n), 0.0) == (None, [])
    assert len(s.mqueue) == 3000
    assert s.enqueue(dl("x")) == []
    assert len(s.mqueue) == 3001


def test_refill_is_fifo_and_fills_every_free_slot():
    s = Session("c", zone(max_inflight=3))
    ds = [dl(n) for n in range(10)]
    for d in ds:
        s.deliver(d, 0.0)
    assert inflight(s) == ["0", "1", "2"]
    assert queued(s) == [str(n) for n in range(3, 10)]
    # ack two, refill sends the next two in queue order
    s.puback(ds[1].packet_id)
    s.puback(ds[0].packet_id)
    sent, _ = s.refill(1.0)
    assert names(sent) == ["3", "4"]
    assert inflight(s) == ["2", "3", "4"]
    # a refill with a full window sends nothing
    assert s.refill(1.0) == ([], [])
    # newcomers go behind the queue even if a slot is free (FIFO)
    s.puback(ds[2].packet_id)
    assert s.deliver(dl("new"), 2.0) == (None, [])
    sent, _ = s.refill(2.0)
    assert names(sent) == ["5"]
    assert queued(s)[-1] == "new"


def test_refill_sends_queued_qos0_without_using_the_window():
    s = Session("c", zone(max_inflight=1))
    s.enqueue(dl("q0", qos=0))
    s.enqueue(dl("a", qos=1))
    s.enqueue(dl("b", qos=1))
    sent, expired = s.refill(0.0)
    assert names(sent) == ["q0", "a"]
    assert sent[0].packet_id == 0
    assert sent[1].packet_id != 0
    assert inflight(s) == ["a"]
    assert queued(s) == ["b"]
    assert expired == []


def test_refill_drops_expired_messages():
    s = Session("c", zone(max_inflight=1))
    live1 = dl("live1")
    old = Message("t", b"old", 1, expiry=10, ts=time.time() - 100)  # expired 90 s ago
    assert old.expired(time.time())
    dead = dl("dead", msg=old)
    live2 = dl("live2")
    s.deliver(live1, 0.0)
    s.deliver(dead, 0.0)
    s.deliver(live2, 0.0)
    s.puback(live1.packet_id)
    sent, expired = s.refill(1.0)
    assert expired == [dead]
    assert sent == [live2]
    assert inflight(s) == ["live2"]
    assert len(s.mqueue) == 0


def test_refill_keeps_unexpired_messages_with_an_expiry():
    s = Session("c", zone(max_inflight=0))
    m = Message("t", b"fresh", 1, expiry=3600)
    s.enqueue(dl("fresh", msg=m))
    sent, expired = s.refill(0.0)
    assert names(sent) == ["fresh"] and expired == []


# -----------------------------------------------------------------------------------------------
# QoS 2 outgoing
# -----------------------------------------------------------------------------------------------


def test_qos2_pubrec_keeps_place_and_retry_resends_pubrel_in_order():
    s = Session("c", zone(max_inflight=3))
    a, b, c = dl("a", 2), dl("b", 2), dl("c", 2)
    for d in (a, b, c):
        s.deliver(d, now=0.0)
    # acks of the wrong kind do nothing
    assert s.puback(a.packet_id) is None
    assert s.pubcomp(a.packet_id) is None  # PUBCOMP before PUBREC
    assert inflight(s) == ["a", "b", "c"]

    assert s.pubrec(a.packet_id, now=0.0) is a
    assert a.stage == 1
    assert inflight(s) == ["a", "b", "c"]  # a keeps its place while it awaits PUBCOMP
    assert len(s.inflight) == 3  # and still occupies its window slot
    assert s.deliver(dl("d", 2), 0.0)[0] is None

    due = s.retry_due(now=30.0, interval=30)
    assert names(due) == ["a", "b", "c"]
    assert [d.stage for d in due] == [1, 0, 0]  # a: resend PUBREL; b, c: resend PUBLISH
    assert [d.packet_id for d in due] == [a.packet_id, b.packet_id, c.packet_id]

    assert s.pubcomp(a.packet_id) is a
    assert s.pubcomp(a.packet_id) is None  # duplicate PUBCOMP
    assert inflight(s) == ["b", "c"]
    assert names(s.refill(31.0)[0]) == ["d"]


def test_pubrec_timer_restarts_at_pubrec():
    s = Session("c", zone(max_inflight=0))
    a = dl("a", 2)
    s.deliver(a, now=0.0)
    s.pubrec(a.packet_id, now=20.0)
    assert s.retry_due(now=30.0, interval=30) == []
    assert s.retry_due(now=50.0, interval=30) == [a]


def test_pubrec_with_failure_reason_frees_the_slot():
    s = Session("c", zone(max_inflight=1))
    a, b = dl("a", 2), dl("b", 2)
    s.deliver(a, 0.0)
    s.deliver(b, 0.0)
    assert s.pubrec(a.packet_id, 1.0, failed=True) is a
    assert a.packet_id not in s.inflight
    assert names(s.refill(1.0)[0]) == ["b"]


def test_ack_of_wrong_qos_or_unknown_id_is_ignored():
    s = Session("c", zone(max_inflight=0))
    one = dl("one", 1)
    s.deliver(one, 0.0)
    assert s.pubrec(one.packet_id, 0.0) is None
    assert one.stage == 0
    assert s.pubcomp(one.packet_id) is None
    assert s.puback(999) is None
    assert s.pubrec(999, 0.0) is None
    assert s.pubcomp(999) is None
    assert s.puback(one.packet_id) is one
    assert s.puback(one.packet_id) is None  # duplicate PUBACK


def test_pending_resend_mixes_publish_and_pubrel_in_original_order():
    s = Session("c", zone(max_inflight=0))
    ds = [dl("q1a", 1), dl("q2a", 2), dl("q2b", 2), dl("q1b", 1), dl("q2c", 2)]
    for d in ds:
        s.deliver(d, 0.0)
    s.pubrec(ds[2].packet_id, 1.0)  # q2b -> PUBREL stage
    s.pubrec(ds[1].packet_id, 2.0)  # q2a -> PUBREL stage
    s.puback(ds[3].packet_id)  # q1b acked
    pids = [d.packet_id for d in ds]
    out = s.pending_resend(now=100.0)
    assert names(out) == ["q1a", "q2a", "q2b", "q2c"]
    assert [d.stage for d in out] == [0, 1, 1, 0]
    assert [d.packet_id for d in out] == [pids[0], pids[1], pids[2], pids[4]]
    assert all(d.sent_at == 100.0 for d in out)
    # pending_resend does not change the window
    assert names(s.pending_resend(now=101.0)) == names(out)


# -----------------------------------------------------------------------------------------------
# packet identifiers
# -----------------------------------------------------------------------------------------------


def test_packet_ids_are_unique_and_skip_ids_in_use():
    s = Session("c", zone(max_inflight=0))
    first = [dl(n) for n in range(5)]
    for d in first:
        s.deliver(d, 0.0)
    assert [d.packet_id for d in first] == [1, 2, 3, 4, 5]
    s.puback(3)
    more = [dl(n) for n in range(5)]
    for d in more:
        s.deliver(d, 0.0)
    pids = [d.packet_id for d in s.inflight.values()]
    assert len(set(pids)) == len(pids) == 9
    assert all(1 <= p <= 65535 for p in pids)


def test_packet_id_wraps_at_65535_and_skips_ids_in_use():
    s = Session("c", zone(max_inflight=0))
    one = dl("one")
    s.deliver(one, 0.0)
    assert one.packet_id == 1
    s._next_pid = 65534
    a, b, c = dl("a"), dl("b"), dl("c")
    for d in (a, b, c):
        s.deliver(d, 0.0)
    assert (a.packet_id, b.packet_id) == (65534, 65535)
    assert c.packet_id == 2  # wrapped past 65535 to 1, which is still in use
    assert 0 not in {d.packet_id for d in s.inflight.values()}


# -----------------------------------------------------------------------------------------------
# window size: Receive Maximum and live zone changes
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_inflight", "receive_maximum", "window"),
    [(32, 0, 32), (32, 5, 5), (32, 100, 32), (32, 32, 32), (0, 10, 10), (0, 0, 0), (1, 65535, 1)],
)
def test_window_is_min_of_max_inflight_and_receive_maximum(max_inflight, receive_maximum, window):
    s = Session("c", zone(max_inflight=max_inflight), receive_maximum=receive_maximum)
    assert s.window_size == window
    sends = sum(1 for n in range(50) if s.deliver(dl(n), 0.0)[0] is not None)
    assert sends == (50 if window == 0 else min(window, 50))


def test_a_session_has_its_own_window_from_its_first_delivery_and_the_shared_one_stays_empty():
    fresh, other = Session("a", zone(max_inflight=2)), Session("b", zone(max_inflight=2))
    assert fresh.inflight is other.inflight is window.UNMADE and fresh.window_size == 2
    fresh.apply_zone(zone(max_inflight=3))
    fresh.set_receive_maximum(1)
    assert window.UNMADE.max_size == 0 and fresh.window_size == 1
    queued_first = Session("c", zone(max_inflight=2))
    for n in range(5):  # (offline: queued, no window yet)
        queued_first.enqueue(dl(n))
    assert queued_first.inflight is window.UNMADE
    sent, _ = queued_first.refill(0.0)
    assert names(sent) == ["0", "1"] and inflight(queued_first) == ["0", "1"]  # the limit held
    assert fresh.deliver(dl(9), 0.0)[0] is not None
    assert inflight(fresh) == ["9"] and fresh.inflight.max_size == 1
    assert len(window.UNMADE) == 0 and other.inflight is window.UNMADE


def test_set_receive_maximum_changes_the_window():
    s = Session("c", zone(max_inflight=32))
    s.set_receive_maximum(2)
    assert s.window_size == 2
    s.set_receive_maximum(0)
    assert s.window_size == 32


def test_apply_zone_shrinking_queue_drops_oldest():
    s = Session("c", zone(max_inflight=1, max_mqueue_len=10))
    for n in range(1, 8):
        s.deliver(dl(n), 0.0)
    assert queued(s) == ["2", "3", "4", "5", "6", "7"]
    dropped = s.apply_zone(zone(max_inflight=1, max_mqueue_len=2))
    assert names(dropped) == ["2", "3", "4", "5"]
    assert queued(s) == ["6", "7"]
    # the new limit applies to later deliveries too
    assert names(s.deliver(dl(8), 0.0)[1]) == ["6"]


def test_apply_zone_growing_window_lets_refill_send_more():
    s = Session("c", zone(max_inflight=1))
    for n in range(1, 6):
        s.deliver(dl(n), 0.0)
    assert inflight(s) == ["1"]
    assert s.apply_zone(zone(max_inflight=3)) == []
    assert s.window_size == 3
    sent, _ = s.refill(1.0)
    assert names(sent) == ["2", "3"]
    assert inflight(s) == ["1", "2", "3"]
    assert queued(s) == ["4", "5"]


def test_apply_zone_shrinking_window_sends_nothing_until_below():
    s = Session("c", zone(max_inflight=3))
    ds = [dl(n) for n in range(1, 6)]
    for d in ds:
        s.deliver(d, 0.0)
    s.apply_zone(zone(max_inflight=1))
    s.puback(ds[0].packet_id)
    assert s.refill(1.0) == ([], [])  # still 2 inflight with a window of 1
    s.puback(ds[1].packet_id)
    assert s.refill(1.0) == ([], [])
    s.puback(ds[2].packet_id)
    assert names(s.refill(1.0)[0]) == ["4"]


def test_apply_zone_keeps_receive_maximum_cap():
    s = Session("c", zone(max_inflight=10), receive_maximum=4)
    s.apply_zone(zone(max_inflight=100))
    assert s.window_size == 4
    s.apply_zone(zone(max_inflight=2))
    assert s.window_size == 2


# -----------------------------------------------------------------------------------------------
# incoming QoS 2: awaiting PUBREL
# -----------------------------------------------------------------------------------------------


def test_await_rel_detects_duplicates_until_release():
    s = Session("c", zone())
    assert s.await_rel(10, now=0.0) is True
    assert s.await_rel(10, now=1.0) is False  # resent PUBLISH before PUBREL: not delivered again
    assert s.release(10) is True
    assert s.release(10) is False  # unknown now (v5: PUBCOMP 0x92)
    assert s.await_rel(10, now=2.0) is True  # the id may be reused after PUBREL


def test_a_session_has_its_own_awaiting_rel_from_its_first_entry_and_the_shared_one_stays_empty():
    first, second = Session("a", zone()), Session("b", zone())
    assert first.awaiting_rel is second.awaiting_rel is NO_AWAITING_REL  # (none made for nothing)
    assert first.release(5) is False and first.expire_awaiting_rel(1e9) == 0
    assert first.await_rel(5, 0.0)
    assert first.awaiting_rel == {5: 0.0} and second.awaiting_rel == {} and NO_AWAITING_REL == {}
    restored = Session("c", zone())
    restored.restore(
        epoch=1, expiry_interval=60.0, next_pid=1, order=0, subscriptions=[], deliveries=[],
        awaiting_rel=[(9, 1.0, 0)], sink=Sink(),
    )  # fmt: skip
    assert restored.awaiting_rel == {9: 1.0} and NO_AWAITING_REL == {}
    assert first.release(5) is True and first.awaiting_rel == {} and NO_AWAITING_REL == {}


def test_max_awaiting_rel_raises_awaiting_rel_full():
    s = Session("c", zone(max_awaiting_rel=2))
    assert s.await_rel(1, 0.0)
    assert s.await_rel(2, 0.0)
    with pytest.raises(AwaitingRelFull):
        s.await_rel(3, 1.0)
    assert set(s.awaiting_rel) == {1, 2}
    assert s.await_rel(1, 1.0) is False  # a duplicate is still recognised when full
    s.release(1)
    assert s.await_rel(3, 1.0) is True


def test_max_awaiting_rel_zero_is_unlimited():
    s = Session("c", zone(max_awaiting_rel=0))
    for pid in range(1, 1001):
        assert s.await_rel(pid, 0.0)
    assert len(s.awaiting_rel) == 1000


def test_awaiting_rel_expires_after_await_rel_timeout():
    s = Session("c", zone(await_rel_timeout=300))
    s.await_rel(1, now=0.0)
    s.await_rel(2, now=100.0)
    assert s.next_awaiting_rel_expiry() == 300.0
    assert s.expire_awaiting_rel(299.0) == 0
    assert s.expire_awaiting_rel(300.0) == 1
    assert set(s.awaiting_rel) == {2}
    assert s.next_awaiting_rel_expiry() == 400.0
    assert s.expire_awaiting_rel(400.0) == 1
    assert s.next_awaiting_rel_expiry() is None
    assert s.release(1) is False


def test_full_awaiting_rel_makes_room_by_expiring_stale_entries():
    s = Session("c", zone(max_awaiting_rel=1, await_rel_timeout=10))
    s.await_rel(1, now=0.0)
    with pytest.raises(AwaitingRelFull):
        s.await_rel(2, now=5.0)
    assert s.await_rel(2, now=10.0) is True
    assert set(s.awaiting_rel) == {2}


# -----------------------------------------------------------------------------------------------
# property: random deliver/ack sequences
# -----------------------------------------------------------------------------------------------


class SessionMachine(RuleBasedStateMachine):
    """Drives a session like a channel does (refill after each ack) and checks the EMQX invariants."""

    @initialize(
        max_inflight=st.integers(0, 4),
        max_mqueue_len=st.integers(0, 4),
        receive_maximum=st.integers(0, 5),
    )
    def setup(self, max_inflight, max_mqueue_len, receive_maximum):
        self.s = Session(
            "c",
            zone(max_inflight=max_inflight, max_mqueue_len=max_mqueue_len),
            receive_maximum=receive_maximum,
        )
        self.now = 0.0
        self.seq = 0
        self.by_seq: dict[int, Delivery] = {}
        self.first_sends: list[int] = []
        self.resent: list[int] = []
        self.acked: set[int] = set()
        self.dropped: list[int] = []

    def _seq(self, d: Delivery) -> int:
        return int(d.msg.payload)

    def _window(self) -> int:
        return self.s.window_size

    def _sent(self, ds):
        for d in ds:
            n = self._seq(d)
            assert n not in self.first_sends, f"message {n} sent twice as a first send"
            self.first_sends.append(n)
        if ds and self._window():
            assert len(self.s.inflight) <= self._window()

    def _refill(self):
        sent, expired = self.s.refill(self.now)
        assert expired == []
        self._sent(sent)

    @rule(qos=st.sampled_from([1, 2]))
    def deliver(self, qos):
        self.seq += 1
        d = Delivery(Message("t", str(self.seq).encode(), qos), qos, False)
        self.by_seq[self.seq] = d
        sent, dropped = self.s.deliver(d, self.now)
        self.dropped += [self._seq(x) for x in dropped]
        if sent is not None:
            assert sent is d
            self._sent([d])

    @precondition(lambda self: len(self.s.inflight) > 0)
    @rule(data=st.data())
    def ack(self, data):
        entries = list(self.s.inflight.values())
        d = data.draw(st.sampled_from(entries))
        if d.qos == 1:
            assert self.s.puback(d.packet_id) is d
        elif d.stage == 0:
            assert self.s.pubrec(d.packet_id, self.now) is d
            assert d.packet_id in self.s.inflight
            return
        else:
            assert self.s.pubcomp(d.packet_id) is d
        self.acked.add(self._seq(d))
        self._refill()

    @rule(dt=st.floats(0, 40))
    def tick_and_retry(self, dt):
        before = [self._seq(d) for d in self.s.inflight.values()]
        pids = {self._seq(d): d.packet_id for d in self.s.inflight.values()}
        self.now += dt
        due = self.s.retry_due(self.now, 30.0)
        got = [self._seq(d) for d in due]
        assert got == [n for n in before if n in got]  # original order
        assert all(d.packet_id == pids[self._seq(d)] for d in due)  # original packet ids
        self.resent += got

    @rule(max_inflight=st.integers(0, 4), max_mqueue_len=st.integers(0, 4))
    def change_zone(self, max_inflight, max_mqueue_len):
        dropped = self.s.apply_zone(zone(max_inflight=max_inflight, max_mqueue_len=max_mqueue_len))
        self.dropped += [self._seq(x) for x in dropped]
        self._refill()

    @invariant()
    def accounted_exactly_once(self):
        if not hasattr(self, "s"):
            return
        inflight_ = [self._seq(d) for d in self.s.inflight.values()]
        queued_ = [self._seq(d) for d in self.s.mqueue]
        buckets = [set(self.acked), set(inflight_), set(queued_), set(self.dropped)]
        assert len(self.dropped) == len(set(self.dropped))
        total = sum(len(b) for b in buckets)
        union = set().union(*buckets)
        assert total == len(union), "a delivery is in two places at once"
        assert union == set(self.by_seq), "a delivery was lost"
        # every sent message is acked or inflight; every queued one was never sent
        assert set(self.first_sends) == set(self.acked) | set(inflight_)
        assert not set(queued_) & set(self.first_sends)

    @invariant()
    def fifo(self):
        if not hasattr(self, "s"):
            return
        queued_ = [self._seq(d) for d in self.s.mqueue]
        assert self.first_sends == sorted(self.first_sends), "first sends out of FIFO order"
        assert queued_ == sorted(queued_)
        if queued_ and self.first_sends:
            assert max(self.first_sends) < min(queued_), "a later message overtook a queued one"
        # drop-oldest: whatever was dropped is older than everything still queued
        if queued_ and self.dropped:
            assert max(self.dropped) < min(queued_)

    @invariant()
    def window_respected(self):
        if not hasattr(self, "s"):
            return
        w = self._window()
        pids = [d.packet_id for d in self.s.inflight.values()]
        assert len(set(pids)) == len(pids)
        assert all(1 <= p <= 65535 for p in pids)
        if self.s.mqueue and w:
            # no idle slot while something waits (the channel refills after every ack)
            assert len(self.s.inflight) >= w
        if self.s.mqueue and not w:
            raise AssertionError("messages queued although the window is unlimited")
        mq = self.s.mqueue.max_len
        if mq:
            assert len(self.s.mqueue) <= mq


SessionMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestSessionMachine = SessionMachine.TestCase


# -----------------------------------------------------------------------------------------------
# the journal, and catching up after opening on a node
# -----------------------------------------------------------------------------------------------


class Sink:
    """A committer that only counts the journals asking for a commit."""

    def __init__(self) -> None:
        self.asked = 0

    def journal_changed(self, journal) -> None:
        self.asked += 1


def test_the_journal_records_each_change_and_asks_once_per_commit():
    sink = Sink()
    s = Session("c", zone(max_inflight=1))
    s.enable_journal(sink)
    a, b = dl(1), dl(2)
    s.deliver(a, 0.0)  # into the window
    s.deliver(b, 0.0)  # queued behind it
    assert sink.asked == 1
    changes = s.journal.take()
    assert set(changes.deliveries.values()) == {a, b} and (a.order, b.order) == (0, 1)
    assert changes.next_pid == s.next_pid == a.packet_id + 1
    s.puback(a.packet_id)
    s.await_rel(7, 1.0)
    assert sink.asked == 2  # asked again after the take
    changes = s.journal.take()
    assert changes.deliveries == {a.msg.msg_id: None} and changes.rel == {7: (1.0, 0)}
    assert s.journal.take() is None


def test_the_journal_tells_deliveries_routed_here_from_those_the_store_had():
    """A stale copy's commit is refused; what was routed into it since the last commit is queued for the
    session's owner instead (the store has no other copy), what the store gave it is not (it has one)."""
    s = Session("c", zone(max_inflight=10))
    s.enable_journal(Sink())
    routed = dl("routed")
    s.deliver(routed, 0.0)
    pulled = dl("pulled")
    pulled.order = s.journal.reserve(1)
    s.deliver(pulled, 0.0)
    changes = s.journal.take()
    assert set(changes.deliveries) == {routed.msg.msg_id, pulled.msg.msg_id}
    assert changes.fresh == [routed.msg.msg_id]
    s.puback(routed.packet_id)  # later changes of a routed delivery are not new
    assert s.journal.take().fresh == []


def test_qos2_receipts_number_messages_and_sessions_drop_repeats():
    """Message.receipt: a journaled publisher's QoS 2 messages are numbered as they arrive (the number
    stored with the awaiting-PUBREL record); a session accepts each (incarnation, number) once per
    publisher, in order, and both facts reach the journal."""
    pub = Session("p", zone())
    pub.enable_journal(Sink())
    pub.incarnation = "inc1"
    assert pub.await_rel(7, 1.0, receipt=True) and pub.await_rel(8, 1.0, receipt=True)
    assert pub.receipt_of(7) == ("inc1", 1) and pub.receipt_of(8) == ("inc1", 2)
    assert not pub.await_rel(7, 2.0, receipt=True) and pub.receipt_of(7) == ("inc1", 1)  # a resend
    changes = pub.journal.take()
    assert changes.rel == {7: (1.0, 1), 8: (1.0, 2)} and changes.received == 2
    pub.release(7)
    assert pub.receipt_of(7) is None
    sub = Session("s", zone())
    sub.enable_journal(Sink())
    assert sub.accept(("inc1", 1)) and sub.accept(("inc1", 2))
    assert not sub.accept(("inc1", 2)) and not sub.accept(("inc1", 1))  # repeats
    assert sub.accept(("inc2", 1))  # another incarnation counts on its own
    assert sub.journal.take().seen == {"inc1": 2, "inc2": 1}
    back = Session("s", zone())
    back.restore(
        epoch=2, expiry_interval=60.0, next_pid=1, order=0, subscriptions=[], deliveries=[],
        awaiting_rel=[(9, 1.0, 4)], sink=Sink(), incarnation="inc9", received=4, seen={"inc1": 2},
    )  # fmt: skip
    assert back.receipt_of(9) == ("inc9", 4) and not back.accept(("inc1", 2)) and back.accept(("inc1", 3))
    assert back.await_rel(10, 1.0, receipt=True) and back.receipt_of(10) == ("inc9", 5)


def test_held_back_deliveries_wait_for_the_ones_reserved_ahead_of_them():
    s = Session("c", zone(max_inflight=10))
    s.enable_journal(Sink())
    s.deliver(dl("queued-before"), 0.0)  # already in the window: not held
    first = s.hold_back(5)
    late = dl("late")
    sent, dropped = s.deliver(late, 0.0)
    assert sent is None and dropped == [] and queued(s) == ["late"]
    assert s.refill(0.0) == ([], [])  # nothing held goes out
    early = dl("early")
    early.order = first  # the position the pull gave it
    assert s.insert(early) == []
    assert queued(s) == ["early", "late"]
    assert names(s.refill(0.0)[0]) == ["early"]  # reserved ones may go, held ones not yet
    s.caught_up()
    assert names(s.refill(0.0)[0]) == ["late"]
    assert inflight(s) == ["queued-before", "early", "late"]


def test_a_hold_and_its_end_reach_the_store_with_the_journal():
    """The store keeps where a hold's reservation starts, so that a claim after a failed catch-up pull
    still puts what was queued ahead of what was held back (Redis move_queue); caught up, it forgets it."""
    s = Session("c", zone(max_inflight=10))
    s.enable_journal(Sink())
    assert s.journal is not None
    s.journal.take()
    first = s.hold_back(5)
    changes = s.journal.take()
    assert changes is not None and changes.hold == first
    assert changes.unchecked_from == s.held_from == first + 5
    s.deliver(dl("late"), 0.0)
    changes = s.journal.take()
    assert changes.hold is None  # (unchanged)
    assert changes.unchecked_from == first + 5  # (what is routed here meanwhile is taken unchecked)
    s.caught_up()
    changes = s.journal.take()
    assert changes is not None and changes.hold == -1 and changes.unchecked_from is None


def test_while_catching_up_receipts_are_checked_in_queue_order_not_arrival_order():
    """A subscriber's session opened on its publisher's node: one QoS 2 message was routed to it through
    the store (the session was not here yet), the next straight here. Accepting the next one's receipt
    on arrival made the first, pulled a moment later, look like a repeat: it was lost to every
    subscriber opening then (chaos --store cluster, seed 43: #577, #677). Receipts queued behind the
    held-back point are checked when the session has caught up, in queue order."""

    def with_receipt(name: str, number: int) -> Delivery:
        d = dl(name, 2)
        d.msg.receipt = ("inc1", number)
        return d

    s = Session("c", zone(max_inflight=10))
    s.enable_journal(Sink())
    first = s.hold_back(5)
    newer = with_receipt("newer", 2)
    assert s.admit(("inc1", 2))
    s.deliver(newer, 0.0)
    older = with_receipt("older", 1)
    older.order = first
    assert s.admit(("inc1", 1), older.order, stored=True)
    s.insert(older)
    again = with_receipt("again", 1)  # the older one's resend, routed straight here as well
    assert s.admit(("inc1", 1))
    s.deliver(again, 0.0)
    assert queued(s) == ["older", "newer", "again"]
    assert s.caught_up() == [again]
    assert queued(s) == ["older", "newer"] and s.seen == {"inc1": 2}
    assert not s.admit(("inc1", 2))  # caught up: repeats are known at once again


def restored_with_a_taken_delivery() -> Session:
    """A session restored with a delivery of receipt ("inc1", 5) the store had not recorded as seen (its
    record of that publisher: 3)."""
    d = dl("taken", 2)
    d.msg.receipt, d.order = ("inc1", 5), 3
    s = Session("s", zone())
    s.restore(
        epoch=2, expiry_interval=60.0, next_pid=1, order=4, subscriptions=[], deliveries=[d],
        awaiting_rel=[], sink=Sink(), incarnation="inc9", received=0, seen={"inc1": 3},
    )  # fmt: skip
    return s


def test_a_restored_delivery_s_receipt_counts_as_taken_even_if_not_recorded_yet():
    """A message taken while its session caught up is recorded as seen only once the session has caught
    up; the session moved before that, so its new owner restored the delivery without the record, and
    the publisher's resend under the same receipt reached the subscriber a second time (chaos --store
    cluster, seed 43 at 318de0c: #114, #115)."""
    s = restored_with_a_taken_delivery()
    assert not s.admit(("inc1", 5)) and not s.admit(("inc1", 4))
    assert s.admit(("inc1", 6))


def test_a_restored_delivery_s_receipt_reaches_the_store_as_seen():
    """Issue 25 (chaos --store cluster, seeds 703 and 705: 7 QoS 2 messages twice each). The receipt a
    restored delivery counts as taken was raised in memory only: the store still queued the publisher's
    resend under it as new, and once the restored copy had been delivered and acknowledged (gone), the
    session's next owner, restoring only the resend, delivered the message again."""
    s = restored_with_a_taken_delivery()
    assert s.journal is not None
    changes = s.journal.take()
    assert changes is not None and changes.seen == {"inc1": 5}


def test_a_copy_queued_through_the_store_is_a_repeat_of_the_one_the_session_took_itself():
    """Issue 25 (chaos --store cluster, seed 707: a QoS 2 message twice). The store marked which copy of
    a receipt the session took straight from its publisher's node (`twins`): the other, queued through
    the store when the publisher sent it again elsewhere, is dropped on restore, also once the session's
    own copy is gone (delivered and acknowledged), unless the client was sent it (a packet id)."""
    own, other, unrelated = dl("own", 2), dl("other", 2), dl("unrelated", 2)
    own.msg.receipt = other.msg.receipt = ("inc1", 5)
    unrelated.msg.receipt = ("inc1", 6)
    own.order, other.order, unrelated.order = 3, 4, 5

    def restored(deliveries, twins):
        s = Session("s", zone())
        s.restore(
            epoch=2, expiry_interval=60.0, next_pid=1, order=6, subscriptions=[], deliveries=deliveries,
            awaiting_rel=[], sink=Sink(), incarnation="inc9", received=0, seen={"inc1": 6}, twins=twins,
        )  # fmt: skip
        return [d.msg.payload for d in [*s.inflight.values(), *s.mqueue]]

    twins = {("inc1", 5): own.msg.msg_id}
    assert restored([other, unrelated], twins) == [b"unrelated"]  # the own copy is gone: delivered
    assert restored([other, own, unrelated], twins) == [b"own", b"unrelated"]
    assert restored([other, unrelated], {}) == [b"other", b"unrelated"]  # (unmarked: nothing to go by)
    other.packet_id = 9  # the client was sent this copy: it stays, so that its resend is recognised
    assert restored([other, unrelated], twins) == [b"other", b"unrelated"]


def test_restore_puts_sent_deliveries_back_in_the_window_and_the_rest_in_the_queue_in_order():
    stored = []
    for order, (name, pid) in enumerate([("a", 5), ("b", 6), ("c", 0), ("d", 0)]):
        d = dl(name)
        d.order, d.packet_id = order, pid
        stored.append(d)
    s = Session("c", zone(max_inflight=10, max_mqueue_len=1))
    dropped = s.restore(
        epoch=3,
        expiry_interval=60.0,
        next_pid=7,
        order=4,
        subscriptions=[("t/#", None)],
        deliveries=reversed(stored),
        awaiting_rel=[(9, 1.0, 0)],
        sink=Sink(),
    )
    assert inflight(s) == ["a", "b"] and queued(s) == ["d"] and names(dropped) == ["c"]
    assert (s.epoch, s.journal.epoch, s.next_pid, s.order, s.awaiting_rel) == (3, 3, 7, 4, {9: 1.0})
    assert s.journal.take().deliveries == {stored[2].msg.msg_id: None}  # the dropped one is forgotten


def test_a_session_restored_with_two_copies_of_one_receipt_keeps_the_one_sent():
    """The store may hold a message twice for a session, under one receipt: the copy another node queued,
    pulled into the journal, while the session took the message straight from its publisher's node; the
    pull's copy is dropped (Channel.deliver_stored) but that removal can be lost with a failed commit.
    Restored, the session keeps the copy its client was sent and forgets the other (chaos --store cluster, seed 42)."""
    from fleetmq.broker.message import Delivery, Message

    def copy(order: int, pid: int, payload: bytes, receipt) -> Delivery:
        msg = Message("t", payload, 2)
        msg.receipt = receipt
        d = Delivery(msg, 2, False, None)
        d.order, d.packet_id = order, pid
        return d

    first, again, other = (
        copy(1, 5, b"a", ("inc1", 7)),
        copy(2, 6, b"a", ("inc1", 7)),
        copy(3, 0, b"b", ("inc1", 8)),
    )
    s = Session("s", zone())
    s.restore(
        epoch=2, expiry_interval=60.0, next_pid=7, order=3, subscriptions=[], deliveries=[again, other, first],
        awaiting_rel=[], sink=Sink(), seen={"inc1": 8},
    )  # fmt: skip
    assert [d.packet_id for d in s.inflight.values()] == [5] and [d.msg.payload for d in s.mqueue] == [b"b"]
    assert s.journal.take().deliveries == {again.msg.msg_id: None}  # the store forgets the repeat
