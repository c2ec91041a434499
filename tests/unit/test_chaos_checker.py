"""The chaos checker (chaos/checker.py) on histories built by hand: each violation class is found when it
is there and only then, so a clean campaign means something."""

from __future__ import annotations

import pytest

from chaos.checker import check, healthy_spans, intersect, intervals_union, longest_within
from chaos.history import Conn, Delivery, Fault, History, Msg, SubInfo, parse_payload, payload_of

PUB, TOPIC = "pub0", "chaos/t/pub0/0"


def history(*, suback: float = 1.0, end: float = 100.0, version: int = 5, qos: int = 2) -> History:
    """One subscriber `sub`, subscribed at `suback` and connected from then to `end`, no faults."""
    h = History()
    h.subs["sub"] = SubInfo(version, qos, "chaos/#", suback=suback, subacks=1)
    h.conns.append(Conn("sub", 1, "n0", suback - 0.1, suback - 0.05, 0, False))
    h.end = end
    return h


def publish(
    h: History, seq: int, *, qos: int = 1, sent: float | None = None, acked: float | None = -1.0
) -> Msg:
    t = sent if sent is not None else 2.0 + seq
    m = Msg(PUB, TOPIC, seq, qos, t, "n0", t + 0.01 if acked == -1.0 else acked, "n0")
    h.msgs[(PUB, TOPIC, seq)] = m
    return m


def deliver(
    h: History, seq: int, t: float | None = None, *, qos: int = 1, pid: int = 0, dup: bool = False
) -> None:
    m = h.msgs[(PUB, TOPIC, seq)]
    h.deliveries.append(
        Delivery(
            t if t is not None else m.sent + 0.02, "sub", PUB, TOPIC, seq, qos, dup, pid or seq + 1, "n1", 1
        )
    )


def counts(h: History, **kw: float) -> dict[str, int]:
    return {k: n for k, n in check(h, **kw).counts().items() if n}


def test_clean_history_passes():
    h = history()
    for seq in range(5):
        publish(h, seq, qos=2)
        deliver(h, seq, qos=2)
    rep = check(h)
    assert rep.ok, rep.violations
    assert rep.stats["acked"] == 5
    assert rep.stats["expected_deliveries"] == rep.stats["delivered_first"] == 5


def test_acked_and_never_delivered_is_lost():
    h = history()
    for seq in range(3):
        publish(h, seq)
    deliver(h, 0)
    deliver(h, 2)
    rep = check(h)
    assert [v.kind for vs in rep.violations.values() for v in vs] == ["lost"]
    assert "#1" in rep.violations["lost"][0].text


def test_only_acked_messages_sent_after_the_suback_are_owed():
    h = history(suback=5.0)
    publish(h, 0, sent=3.0)  # before the SUBACK
    publish(h, 1, sent=6.0, acked=None)  # never acknowledged: the publisher cannot count on it
    assert check(h).ok
    assert check(h).stats["expected_deliveries"] == 0


def test_qos2_delivered_twice_is_a_duplicate_and_qos1_twice_is_not():
    h = history()
    publish(h, 0, qos=2)
    publish(h, 1, qos=1)
    deliver(h, 0, qos=2, pid=7)
    deliver(h, 0, 4.0, qos=2, pid=9, dup=True)
    deliver(h, 1, qos=1)
    deliver(h, 1, 5.0, qos=1, dup=True)
    rep = check(h)
    assert counts(h) == {"duplicate": 1}
    assert rep.stats["qos1_repeats"] == 1


def test_first_deliveries_out_of_publish_order():
    h = history()
    for seq in range(4):
        publish(h, seq)
    deliver(h, 0, 3.0)
    deliver(h, 2, 3.1)
    deliver(h, 1, 3.2)  # first delivery of #1 after #2's
    deliver(h, 3, 3.3)
    assert counts(h) == {"order": 1}


def test_repeats_may_come_after_later_messages():
    """1,2,3,2,3,4: a resend after a reconnect repeats what was unacked; first deliveries stay in order."""
    h = history()
    for seq in range(1, 5):
        publish(h, seq)
    for i, seq in enumerate((1, 2, 3, 2, 3, 4)):
        deliver(h, seq, 10.0 + i, dup=i in (3, 4))
    assert check(h).ok


def test_a_publisher_over_http_is_held_to_order_per_acknowledging_node():
    """The management API's publisher: #1 taken by n1 may arrive before #0 taken by n0 (two paths), but
    not before #0 when n1 took both."""
    h = history()
    for seq in range(3):
        m = publish(h, seq)
        m.per_node, m.node_acked = True, ("n0" if seq == 0 else "n1")
    deliver(h, 1, 3.0)
    deliver(h, 0, 3.1)  # after a later one another node took: allowed
    deliver(h, 2, 3.2)
    assert check(h).ok
    h.msgs[(PUB, TOPIC, 0)].node_acked = "n1"  # the same node took both: out of order
    assert counts(h) == {"order": 1}


def test_other_topics_and_refused_messages_do_not_count_for_order():
    h = history()
    publish(h, 0)
    publish(h, 1)
    other = Msg(PUB, "chaos/t/pub0/1", 0, 1, 1.5, "n0", 1.6, "n0")
    h.msgs[(PUB, other.topic, 0)] = other
    deliver(h, 1, 3.0)
    deliver(h, 0, 3.1)
    h.deliveries.append(Delivery(2.9, "sub", PUB, other.topic, 0, 1, False, 5, "n0", 1))
    assert counts(h) == {"order": 1}
    h.msgs[(PUB, TOPIC, 0)].refused = 1  # refused once (v5 reason code), sent again as it must be
    assert check(h).ok


def test_delivered_late_while_connected_and_healthy_is_stuck():
    h = history()
    publish(h, 0, sent=10.0)
    deliver(h, 0, 25.0)
    assert counts(h, stuck_after=10.0) == {"stuck": 1}


def test_late_delivery_is_not_stuck_when_faults_or_disconnects_explain_it():
    h = history()
    publish(h, 0, sent=10.0)
    deliver(h, 0, 25.0)
    h.faults.append(Fault(1, "redis-kill", "redis-0", 12.0, 20.0))  # healthy only 10-12 and 20-25
    assert check(h, stuck_after=10.0).ok

    h = history(end=100.0)
    h.conns[0].t_closed = 14.0  # the subscriber was away from 14 to 18
    h.conns.append(Conn("sub", 2, "n2", 17.9, 18.0, 0, True))
    publish(h, 0, sent=10.0)
    deliver(h, 0, 27.0)
    assert check(h, stuck_after=10.0).ok


def test_crash_session_loss_corruption_and_unrecovered():
    h = history()
    h.node_exits.append(("n1", 30.0, -9, True))  # the nemesis's kill -9: expected
    assert check(h).ok
    h.node_exits.append(("n2", 31.0, 1, False))
    h.session_lost.append(("sub", 40.0, "n0"))
    h.corrupt.append(("sub", 41.0, "unexpected PUBREL (id 3) from n0"))
    publish(h, 0)
    h.deliveries.append(Delivery(3.0, "sub", "nobody", TOPIC, 0, 1, False, 1, "n0", 1))
    deliver(h, 0)
    rep = check(h, unrecovered=["pub0: 3 in flight"])
    assert counts(h, unrecovered=["pub0: 3 in flight"]) == {
        "crash": 1,
        "session-lost": 1,
        "corrupt": 2,
        "unrecovered": 1,
    }
    assert "n2 exited with status 1" in rep.violations["crash"][0].text


def test_intervals():
    assert intervals_union([(5, 6), (1, 3), (2, 4)]) == [(1, 4), (5, 6)]
    assert intersect([(0, 4), (6, 10)], [(3, 7)]) == [(3, 4), (6, 7)]
    spans = [(0.0, 2.0), (5.0, 9.0)]
    assert longest_within(spans, [0.0, 5.0], 1.0, 8.0) == 3.0
    h = History()
    h.faults = [Fault(1, "x", "y", 2.0, 3.0), Fault(2, "x", "y", 2.5, None)]
    assert healthy_spans(h, 10.0) == [(0.0, 2.0)]


@pytest.mark.parametrize("seq", [0, 7, 123456])
def test_payload_round_trip(seq):
    assert parse_payload(payload_of("pub1-v5q2", "chaos/a/b", seq, pad=16)) == ("pub1-v5q2", "chaos/a/b", seq)
    assert parse_payload(b"garbage") is None
