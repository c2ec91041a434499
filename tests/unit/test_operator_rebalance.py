"""The operator's rebalance decisions (operator/rebalance.py)."""

from __future__ import annotations

import datetime

from fleetmq.broker.rebalance import Order, Progress
from fleetmq.operator import rebalance
from fleetmq.operator.crds import RebalanceSpec
from fleetmq.operator.rebalance import HOLD
from fleetmq.operator.rollout import STEER_SETTLE
from fleetmq.operator.timestamps import epoch

STAMP = "2027-01-15T08:00:00Z"
T0 = epoch(STAMP) or 0.0


def info(connections: int, progress: Progress | None = None) -> dict[str, str]:
    out = {"connections": str(connections)}
    if progress is not None:
        out["rebalance"] = progress.encode()
    return out


def test_plan_takes_from_pods_above_both_thresholds_down_to_the_average():
    assert rebalance.plan({"p-0": 150, "p-1": 150, "p-2": 0}, 1.1, 10) == {"p-0": 50, "p-1": 50}
    assert rebalance.plan({"p-0": 1000, "p-1": 0, "p-2": 0, "p-3": 0}, 1.1, 100) == {"p-0": 750}
    # (above the average by 10%, but not by minConnections)
    assert rebalance.plan({"p-0": 130, "p-1": 110, "p-2": 100}, 1.1, 100) == {}
    # (above by minConnections, but within the factor)
    assert rebalance.plan({"p-0": 1150, "p-1": 1000, "p-2": 1000}, 1.2, 50) == {}
    assert rebalance.plan({}, 1.1, 0) == {}


def test_receivers_take_the_donors_excess_emptiest_first_in_proportion_to_their_deficit():
    assert rebalance.receivers({"p-0": 175, "p-1": 175, "p-2": 0, "p-3": 0}, {"p-0": 87, "p-1": 87}) == [
        ("p-2", 87),
        ("p-3", 87),
    ]
    # a pod within the thresholds but below the average receives its part too; one above it none
    got = rebalance.receivers({"a": 300, "b": 90, "c": 10, "d": 0}, {"a": 200})
    assert got == [("d", 100), ("c", 90), ("b", 10)] and sum(n for _, n in got) == 200
    assert rebalance.receivers({"a": 105, "b": 101}, {"a": 2}) == [("b", 2)]


def test_stages_split_each_receivers_share_so_the_donors_finish_together():
    asked = {"a": 90, "b": 30}
    parts = rebalance.stages(asked, [("c", 60), ("d", 60)])
    assert parts == [{"a": 45, "b": 15}, {"a": 45, "b": 15}]
    # rounding never loses or adds a connection: the last stage takes what is left
    parts = rebalance.stages({"a": 7, "b": 6}, [("c", 5), ("d", 4), ("e", 4)])
    assert [sum(p.values()) for p in parts] == [5, 4, 4]
    assert {d: sum(p[d] for p in parts) for d in ("a", "b")} == {"a": 7, "b": 6}


def test_a_scale_up_starts_a_rebalance_once_the_fleet_is_steady():
    spec = RebalanceSpec(afterScaleUp=True, evictionRate=20, minConnections=10)
    before = {"replicas": 2}
    three = {"e-0": info(150), "e-1": info(150), "e-2": info(0)}
    waiting = rebalance.step(spec, before, None, False, three, T0, STAMP, "id1")
    assert waiting.status == before and not waiting.orders and not waiting.away

    s = rebalance.step(spec, before, None, True, three, T0, STAMP, "id1")
    assert s.status is not None and s.status["phase"] == "Running" and s.status["reason"] == "ScaleUp"
    # first the Services leave every pod but the receiving one out; no order yet
    assert not s.orders and s.away == {"e-0", "e-1"} and s.recheck == STEER_SETTLE
    assert s.status["pods"] == {"e-0": {"asked": 50, "moved": 0}, "e-1": {"asked": 50, "moved": 0}}
    assert s.status["receivers"] == [{"pod": "e-2", "asked": 100}]
    assert s.status["stage"]["receiver"] == "e-2" and s.status["stage"]["orderedAt"] is None
    assert s.event is not None and s.event[0] == "RebalanceStarted" and "100 connections" in s.event[1]

    early = rebalance.step(spec, s.status, None, True, three, T0 + 1, STAMP, "x", settled_for=1.0)
    assert not early.orders and early.away == {"e-0", "e-1"} and early.recheck == STEER_SETTLE - 1.0
    s = rebalance.step(spec, s.status, None, True, three, T0 + 3, STAMP, "x", settled_for=STEER_SETTLE)
    assert s.orders == {
        "e-0": Order("id1.0", 50, 20, epoch(STAMP) + spec.timeoutSeconds),
        "e-1": Order("id1.0", 50, 20, epoch(STAMP) + spec.timeoutSeconds),
    }
    assert s.status is not None and s.status["stage"]["orderedAt"] == STAMP and s.recheck == 50 / 20 + 1.0


def test_without_afterScaleUp_only_the_annotation_starts_one_and_only_once_per_value():
    spec = RebalanceSpec(minConnections=10)
    three = {"e-0": info(300), "e-1": info(0), "e-2": info(0)}
    quiet = rebalance.step(spec, {"replicas": 2}, None, True, three, T0, STAMP, "id1")
    assert quiet.status == {"replicas": 3} and not quiet.orders
    s = rebalance.step(spec, {"replicas": 3}, "now", True, three, T0, STAMP, "id2")
    assert s.status is not None and s.status["reason"] == "Requested" and s.status["requested"] == "now"
    assert s.status["pods"] == {"e-0": {"asked": 200, "moved": 0}}
    done = {**s.status, "phase": "Completed"}
    again = rebalance.step(spec, done, "now", True, three, T0 + 60, STAMP, "id3")
    assert not again.orders and again.status is not None and again.status["id"] == "id2"


def test_a_balanced_fleet_records_that_nothing_moved():
    spec = RebalanceSpec(minConnections=10)
    even = {"e-0": info(100), "e-1": info(100), "e-2": info(95)}
    s = rebalance.step(spec, {"replicas": 3}, "x", True, even, T0, STAMP, "id1")
    assert s.status is not None and s.status["phase"] == "Balanced" and not s.orders and not s.away
    assert s.event is not None and s.event[0] == "RebalanceSkipped"


def started(connections: dict[str, int], spec: RebalanceSpec) -> dict[str, object]:
    """status.rebalance of a rebalance just ordered (its first stage's orders written)."""
    s = rebalance.step(spec, {"replicas": 1}, "go", True, {p: info(n) for p, n in connections.items()}, T0,
                       STAMP, "r1")  # fmt: skip
    assert s.status is not None
    s = rebalance.step(spec, s.status, None, True, {}, T0, STAMP, "x", settled_for=9.0)
    assert s.status is not None and s.orders
    return s.status


def test_each_receiver_in_turn_serves_alone_until_its_clients_arrived_then_the_next():
    spec = RebalanceSpec(minConnections=10)
    st = started({"a": 175, "b": 175, "c": 0, "d": 0}, spec)
    assert st["receivers"] == [{"pod": "c", "asked": 87}, {"pod": "d", "asked": 87}]

    def pass_(at: float, reports: dict[str, Progress], settled: float = 9.0) -> rebalance.Step:
        nodes = {p: info(0, reports.get(p)) for p in "abcd"}
        return rebalance.step(spec, st, None, True, nodes, at, stamp(at), "x", settled_for=settled)

    s = pass_(T0 + 1, {"a": Progress("r1.0", 44, 20, False), "b": Progress("r1.0", 43, 43, True)})
    assert s.status is not None and s.status["phase"] == "Running" and s.status["moved"] == 63
    assert s.away == {"a", "b", "d"} and not s.orders
    st = s.status
    s = pass_(T0 + 2, {"a": Progress("r1.0", 44, 44, True), "b": Progress("r1.0", 43, 43, True)})
    assert s.status is not None and s.status["stage"]["drainedAt"] == stamp(T0 + 2) and s.recheck == HOLD
    st = s.status
    s = pass_(T0 + 4, {"a": Progress("r1.0", 44, 44, True), "b": Progress("r1.0", 43, 43, True)})
    assert s.away == {"a", "b", "d"} and s.recheck == 3.0  # (c alone, while the last ones reconnect)
    s = pass_(T0 + 7, {"a": Progress("r1.0", 44, 44, True), "b": Progress("r1.0", 43, 43, True)})
    assert s.status is not None and s.status["stage"]["receiver"] == "d" and s.away == {"a", "b", "c"}
    assert s.status["stage"]["movedBefore"] == {"a": 44, "b": 43} and not s.orders
    st = s.status
    s = pass_(T0 + 8, {}, settled=1.0)
    assert not s.orders
    s = pass_(T0 + 10, {}, settled=3.0)
    assert s.orders == {"a": Order("r1.1", 43, 50, T0 + 600), "b": Order("r1.1", 44, 50, T0 + 600)}
    st = s.status
    both = {"a": Progress("r1.1", 43, 43, True), "b": Progress("r1.1", 44, 44, True)}
    s = pass_(T0 + 11, both)
    assert s.status is not None and s.status["moved"] == 174
    st = s.status
    s = pass_(T0 + 17, both)
    assert s.status is not None and s.status["phase"] == "Completed" and s.status["stage"] is None
    assert s.orders == {"a": None, "b": None} and not s.away  # (orders withdrawn, serving again)
    assert s.event == ("RebalanceCompleted", "174 of 174 connections moved")
    assert s.status["pods"] == {"a": {"asked": 87, "moved": 87}, "b": {"asked": 87, "moved": 87}}


def stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_report_of_an_older_order_does_not_count():
    spec = RebalanceSpec(minConnections=10)
    st = started({"e-0": 150, "e-1": 0}, spec)
    nodes = {"e-0": info(150, Progress("older", 75, 75, True)), "e-1": info(0)}
    s = rebalance.step(spec, st, None, True, nodes, T0, STAMP, "new", settled_for=9.0)
    assert s.status is not None and s.status["phase"] == "Running" and s.status["moved"] == 0


def test_a_rebalance_ends_at_its_timeout_or_when_the_fleet_stops_being_steady():
    spec = RebalanceSpec(timeoutSeconds=60, minConnections=10)
    st = started({"e-0": 150, "e-1": 0}, spec)
    t = epoch(STAMP)
    assert t is not None
    nodes = {"e-0": info(120, Progress("r1.0", 75, 10, False)), "e-1": info(10)}
    s = rebalance.step(spec, st, None, True, nodes, t + 61, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "TimedOut" and s.orders == {"e-0": None}
    s = rebalance.step(spec, st, None, False, nodes, t + 5, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "Interrupted" and s.orders == {"e-0": None}
    assert not s.away and s.status["replicas"] == 2 and s.status["stage"] is None  # (as when it began)


def test_an_older_operators_running_rebalance_without_stages_is_ended_not_followed():
    old = {"phase": "Running", "id": "r0", "replicas": 2, "startedAt": STAMP, "moved": 0,
           "pods": {"e-0": {"asked": 50, "moved": 0}}}  # fmt: skip
    s = rebalance.step(RebalanceSpec(), old, None, True, {"e-0": info(100), "e-1": info(0)}, T0, STAMP, "x")
    assert s.status is not None and s.status["phase"] == "Interrupted" and s.orders == {"e-0": None}
