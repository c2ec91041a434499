"""The operator's rebalance decisions (operator/rebalance.py)."""

from __future__ import annotations

from fleetmq.broker.rebalance import Order, Progress
from fleetmq.operator import rebalance
from fleetmq.operator.crds import RebalanceSpec
from fleetmq.operator.timestamps import epoch

T0 = 1_800_000_000.0
STAMP = "2027-01-15T08:00:00Z"


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


def test_a_scale_up_starts_a_rebalance_once_the_fleet_is_steady():
    spec = RebalanceSpec(afterScaleUp=True, evictionRate=20, minConnections=10)
    before = {"replicas": 2}
    three = {"e-0": info(150), "e-1": info(150), "e-2": info(0)}
    waiting = rebalance.step(spec, before, None, False, three, T0, STAMP, "id1")
    assert waiting.status == before and not waiting.orders and not waiting.donors

    s = rebalance.step(spec, before, None, True, three, T0, STAMP, "id1")
    assert s.status is not None and s.status["phase"] == "Running" and s.status["reason"] == "ScaleUp"
    assert s.orders == {
        "e-0": Order("id1", 50, 20, T0 + spec.timeoutSeconds),
        "e-1": Order("id1", 50, 20, T0 + spec.timeoutSeconds),
    }
    assert s.donors == {"e-0", "e-1"}
    assert s.status["pods"] == {"e-0": {"asked": 50, "moved": 0}, "e-1": {"asked": 50, "moved": 0}}
    assert s.event is not None and s.event[0] == "RebalanceStarted" and "100 connections" in s.event[1]
    assert s.recheck == 50 / 20 + 2.0


def test_without_afterScaleUp_only_the_annotation_starts_one_and_only_once_per_value():
    spec = RebalanceSpec(minConnections=10)
    three = {"e-0": info(300), "e-1": info(0), "e-2": info(0)}
    quiet = rebalance.step(spec, {"replicas": 2}, None, True, three, T0, STAMP, "id1")
    assert quiet.status == {"replicas": 3} and not quiet.orders
    s = rebalance.step(spec, {"replicas": 3}, "now", True, three, T0, STAMP, "id2")
    assert s.status is not None and s.status["reason"] == "Requested" and s.status["requested"] == "now"
    assert s.orders == {"e-0": Order("id2", 200, 50, T0 + 600)}
    done = {**s.status, "phase": "Completed"}
    again = rebalance.step(spec, done, "now", True, three, T0 + 60, STAMP, "id3")
    assert not again.orders and again.status is not None and again.status["id"] == "id2"


def test_a_balanced_fleet_records_that_nothing_moved():
    spec = RebalanceSpec(minConnections=10)
    even = {"e-0": info(100), "e-1": info(100), "e-2": info(95)}
    s = rebalance.step(spec, {"replicas": 3}, "x", True, even, T0, STAMP, "id1")
    assert s.status is not None and s.status["phase"] == "Balanced" and not s.orders and not s.donors
    assert s.event is not None and s.event[0] == "RebalanceSkipped"


def running(asked: dict[str, int]) -> dict[str, object]:
    return {
        "phase": "Running",
        "id": "r1",
        "reason": "ScaleUp",
        "replicas": 2,
        "startedAt": STAMP,
        "moved": 0,
        "pods": {p: {"asked": n, "moved": 0} for p, n in asked.items()},
    }


def test_a_running_rebalance_follows_the_pods_reports_and_completes_when_every_donor_is_done():
    spec = RebalanceSpec()
    prev = running({"e-0": 50, "e-1": 50})
    nodes = {
        "e-0": info(100, Progress("r1", 50, 50, True)),
        "e-1": info(120, Progress("r1", 50, 30, False)),
        "e-2": info(80),
    }
    s = rebalance.step(spec, prev, None, True, nodes, T0, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "Running" and s.status["moved"] == 80
    assert s.donors == {"e-0", "e-1"} and not s.orders and s.recheck
    nodes["e-1"] = info(100, Progress("r1", 50, 50, True))
    s = rebalance.step(spec, s.status, None, True, nodes, T0, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "Completed" and s.status["moved"] == 100
    assert s.orders == {"e-0": None, "e-1": None} and not s.donors  # (orders withdrawn, serving again)
    assert s.event == ("RebalanceCompleted", "100 of 100 connections moved")
    assert s.status["replicas"] == 3


def test_a_report_of_an_older_order_does_not_count():
    prev = running({"e-0": 50})
    nodes = {"e-0": info(150, Progress("older", 50, 50, True)), "e-1": info(0)}
    s = rebalance.step(RebalanceSpec(), prev, None, True, nodes, T0, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "Running" and s.status["moved"] == 0


def test_a_rebalance_ends_at_its_timeout_or_when_the_fleet_stops_being_steady():
    spec = RebalanceSpec(timeoutSeconds=60)
    started = epoch(STAMP)
    assert started is not None
    prev = running({"e-0": 50})
    nodes = {"e-0": info(120, Progress("r1", 50, 10, False)), "e-1": info(10)}
    s = rebalance.step(spec, prev, None, True, nodes, started + 61, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "TimedOut" and s.orders == {"e-0": None}
    s = rebalance.step(spec, prev, None, False, nodes, started + 5, STAMP, "new")
    assert s.status is not None and s.status["phase"] == "Interrupted" and s.orders == {"e-0": None}
    assert not s.donors and s.status["replicas"] == 2  # (not recorded while not steady)
