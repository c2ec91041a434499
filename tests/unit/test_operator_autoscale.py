"""The operator's autoscaler (operator/autoscale.py): recommendations, windows, steps and rates."""

from __future__ import annotations

from fleetmq.operator import autoscale
from fleetmq.operator.autoscale import Load, Rates
from fleetmq.operator.crds import AutoscalingSpec


def spec(**kw) -> AutoscalingSpec:
    base = {"minReplicas": 2, "maxReplicas": 4, "targets": {"connections": 100}}
    return AutoscalingSpec.model_validate({**base, **kw})


def test_the_pods_the_load_asks_for_within_the_limits_and_the_tolerance():
    s = spec()
    assert autoscale.recommend(s, 2, Load(2, 175)) == 4  # 350 clients, 100 a pod
    assert autoscale.recommend(s, 4, Load(4, 30)) == 2  # 120 clients: 2 (not 1: minReplicas)
    assert autoscale.recommend(s, 3, Load(3, 105)) == 3  # within 10%: no change
    assert autoscale.recommend(s, 4, Load(4, 400)) == 4  # maxReplicas
    both = spec(targets={"connections": 100, "messagesPerSecond": 50})
    assert autoscale.recommend(both, 2, Load(2, 50, 150)) == 4  # the most demanding target wins
    assert autoscale.recommend(both, 2, Load(2, 50)) is None  # a rate not known yet: no decision
    cpu = spec(targets={"cpu": "500m"})
    assert autoscale.recommend(cpu, 2, Load(2, 0, 0, 900)) == 4


def test_up_at_once_down_after_its_window_and_one_pod_at_a_time():
    s = spec(maxReplicas=6)
    history: list[tuple[float, int]] = []
    d = autoscale.decide(s, 2, history, 6, now=0)
    assert (d.replicas, d.reason) == (6, "ScaledUp")
    s = spec(scaleUp={"stabilizationWindowSeconds": 0, "maxStep": 1, "periodSeconds": 30})
    assert autoscale.decide(s, 2, [], 4, now=0).replicas == 3  # one step at most
    assert autoscale.decide(s, 3, [], 4, now=10, changes=[(0, 1)]).replicas == 3  # (within its period)
    history = []
    for t in range(0, 300, 15):  # the load drops: 2 pods would do, for less than the 300 s window
        d = autoscale.decide(spec(), 4, history, 2 if t else 4, now=t)
        assert d.replicas == 4, (t, d)
    assert d.reason == "Stabilizing"
    changes: list[tuple[float, int]] = []
    d = autoscale.decide(spec(), 4, history, 2, now=301, changes=changes)
    assert (d.replicas, d.reason) == (3, "ScaledDown")  # one at a time
    changes.append((301, -1))
    d = autoscale.decide(spec(), 3, history, 2, now=316, changes=changes)
    assert (d.replicas, d.reason) == (3, "Stabilizing")  # one pod a minute (scaleDown.periodSeconds)
    d = autoscale.decide(spec(), 3, history, 2, now=362, changes=changes)
    assert d.replicas == 2
    # a spike inside the window holds a scale-down back
    history = [(0.0, 2), (100.0, 4)]
    assert autoscale.decide(spec(), 4, history, 2, now=350).replicas == 4


def test_limits_apply_to_a_fleet_scaled_by_hand_or_limits_changed():
    assert autoscale.decide(spec(), 7, [], 4, now=0) == autoscale.Decision(4, 4, "Limited")
    assert autoscale.decide(spec(), 1, [], 2, now=0).replicas == 2


def test_rates_come_from_two_reports_some_seconds_apart_and_a_restarted_pod_starts_over():
    rates = Rates()
    r0 = {"edge-0": {"connections": "100", "delivered": "1000", "cpu_seconds": "10.0"}}
    rates.update(r0, now=100)
    assert rates.load(r0, {"edge-0"}) == Load(1, 100)  # no rate yet
    rates.update({"edge-0": {"connections": "100", "delivered": "1500", "cpu_seconds": "11"}}, now=102)
    assert "edge-0" not in rates.rates  # (2 s: too close)
    r1 = {"edge-0": {"connections": "120", "delivered": "2000", "cpu_seconds": "12.0"}}
    rates.update(r1, now=110)
    assert rates.load(r1, {"edge-0"}) == Load(1, 120, 100.0, 200.0)
    restarted = {"edge-0": {"connections": "0", "delivered": "5", "cpu_seconds": "0.5"}}
    rates.update(restarted, now=120)
    assert rates.rates["edge-0"] == (100.0, 200.0)  # (kept: no rate across a restart)
    rates.update({}, now=130)
    assert rates.rates == {} and rates.last == {}
    old = {"edge-0": {"connections": "7"}}  # a broker from before the totals
    rates.update(old, now=140)
    assert rates.load(old, {"edge-0"}) == Load(1, 7)


def test_bad_autoscaling_specs_are_refused_naming_the_reason():
    import pydantic

    for bad, why in (
        ({"minReplicas": 5, "maxReplicas": 4, "targets": {"connections": 1}}, "minReplicas cannot exceed"),
        ({"minReplicas": 1, "maxReplicas": 4, "targets": {}}, "at least one of"),
        ({"minReplicas": 1, "maxReplicas": 4, "targets": {"cpu": "lots"}}, "not a CPU quantity"),
    ):
        try:
            AutoscalingSpec.model_validate(bad)
        except pydantic.ValidationError as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"accepted {bad}")
