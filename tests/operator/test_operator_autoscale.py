"""spec.autoscaling against a real control plane (kube-controller-manager, kwok's Ready pods) and a real
redis-server holding the pods' reports, as brokers write them (keys.nodeinfo): the operator sets
spec.replicas from the load, scales down one pod at a time after its window, and steps aside for a
HorizontalPodAutoscaler, which the BrokerFleet's scale subresource lets scale it."""

from __future__ import annotations

import json
import time

import pytest
import redis
from fleetmq.broker.store import keys

from .conftest import fleet, wait_for, zone

pytestmark = pytest.mark.redis


def report(r: redis.Redis, pods: dict[str, int]) -> None:
    """Each pod's report as a broker writes it, `pods` giving its connections."""
    for pod, connections in pods.items():
        r.hset(keys.nodeinfo(pod), mapping={"connections": connections, "sessions": connections})


def test_the_fleet_scales_with_its_connections_and_steps_aside_for_an_hpa(
    k, run_operator, redis_server, control_plane
):
    if not control_plane.controllers:
        pytest.skip("needs kube-controller-manager and kwok's Ready pods (make envtest)")
    r = redis.Redis.from_url(redis_server.url)
    run_operator()
    k.apply(fleet(replicas=2, redis={"url": redis_server.url}, autoscaling={
        "minReplicas": 2, "maxReplicas": 4, "targets": {"connections": 100},
        "scaleDown": {"stabilizationWindowSeconds": 10, "maxStep": 1, "periodSeconds": 5}}))  # fmt: skip
    k.apply(zone())
    report(r, {"edge-0": 175, "edge-1": 175})  # 350 clients, 100 a pod
    wait_for(lambda: k.get("brokerfleet", "edge")["spec"]["replicas"] == 4, timeout=60, msg="4 replicas")
    st = wait_for(
        lambda: (s := k.get("brokerfleet", "edge")["status"]).get("autoscaling") and s, msg="status"
    )
    assert st["autoscaling"]["desiredReplicas"] == 4 and st["autoscaling"]["lastScaleTime"], st
    cond = k.condition("brokerfleet", "edge", "Autoscaling")
    assert cond["status"] == "True" and cond["reason"] in ("ScaledUp", "Stable"), (
        cond
    )  # (a pass later: Stable)
    events = json.loads(k("get", "events", "--field-selector", "reason=ScaledUp", "-o", "json").stdout)[
        "items"
    ]
    assert any("spec.replicas 2 -> 4: connections 175/100" in e["message"] for e in events), events

    # back to 120 clients: 2 pods, one at a time, once the 10 s window has passed
    wait_for(lambda: len(k("get", "pods", "-o", "name").stdout.split()) == 4, timeout=60, msg="4 pods")
    report(r, {"edge-0": 30, "edge-1": 30, "edge-2": 30, "edge-3": 30})
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 120:
        n = k.get("brokerfleet", "edge")["spec"]["replicas"]
        if not seen or seen[-1] != n:
            seen.append(n)
            if n == 3:
                first_down = time.monotonic() - t0
        if n == 2:
            break
        time.sleep(0.2)
    assert seen == [4, 3, 2], seen
    assert first_down >= 8, f"scaled down {first_down:.1f}s after the load fell (window 10 s)"

    # an HPA takes the scale over: the operator's autoscaler steps aside and says so
    k.apply({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "edge"},
        "spec": {"scaleTargetRef": {"apiVersion": "fleetmq.io/v1alpha1", "kind": "BrokerFleet", "name": "edge"},
                 "minReplicas": 2, "maxReplicas": 5,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                                                               "target": {"type": "Utilization", "averageUtilization": 50}}}]},
    })  # fmt: skip
    report(r, {"edge-0": 400, "edge-1": 400})
    cond = wait_for(
        lambda: (
            (c := k.condition("brokerfleet", "edge", "Autoscaling")).get("reason") == "HPAOwnsScale" and c
        ),
        timeout=60,
        msg="Autoscaling: HPAOwnsScale",
    )
    assert cond["status"] == "False" and "HorizontalPodAutoscaler edge" in cond["message"]
    able = wait_for(
        lambda: next(
            (
                c
                for c in (k.get("hpa", "edge").get("status") or {}).get("conditions") or []
                if c["type"] == "AbleToScale"
            ),
            None,
        ),
        timeout=90,
        msg="the HPA's AbleToScale condition",
    )
    assert able["status"] == "True", able  # (the scale subresource: replicas and the pods' selector)
    assert k.get("brokerfleet", "edge")["spec"]["replicas"] == 2, "the operator's autoscaler fought the HPA"
