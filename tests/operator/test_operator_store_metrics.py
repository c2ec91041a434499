"""fleetmq_operator_fleet_store_ready / _store_pods follow the BrokerFleet's StoreReady condition and
status.store, which is what the session-store alerts read when no broker can count errors (an idle fleet
whose Redis is away, a managed Redis missing pods)."""

from __future__ import annotations

from .conftest import fleet, wait_for


def test_store_gauges_follow_the_fleet_status(k, run_operator, kube_namespace):
    from fleetmq.operator import metrics

    def value(name: str, fleet_name: str, **labels: str) -> float | None:
        labels |= {"fleet_namespace": kube_namespace, "fleet": fleet_name}
        return metrics.REGISTRY.get_sample_value(name, labels)

    run_operator()
    k.apply(fleet("ext"))  # redis://127.0.0.1:1/0: nothing answers there
    wait_for(lambda: k.condition("brokerfleet", "ext", "StoreReady").get("reason") == "Unreachable",
             msg="store unreachable")  # fmt: skip
    wait_for(lambda: value("fleetmq_operator_fleet_store_ready", "ext") == 0, msg="store_ready 0")
    assert value("fleetmq_operator_fleet_store_pods", "ext", state="wanted") is None  # not a managed Redis

    k.apply(fleet("edge", redis={"managed": True}))  # sentinel: 2 servers and 3 sentinels by default

    def store_pods() -> tuple[float | None, float | None, dict]:
        store = (k.get("brokerfleet", "edge") or {}).get("status", {}).get("store") or {}
        return (
            value("fleetmq_operator_fleet_store_pods", "edge", state="wanted"),
            value("fleetmq_operator_fleet_store_pods", "edge", state="ready"),
            store,
        )

    wanted, _ready, store = wait_for(
        lambda: (
            (s := store_pods())[2].get("wantedPods") is not None
            and s[0] == s[2]["wantedPods"]
            and s[1] == s[2]["readyPods"]
            and s
        ),
        msg="store pods as in status.store",
    )
    assert wanted == store["wantedPods"] >= 1
    condition = k.condition("brokerfleet", "edge", "StoreReady")
    assert value("fleetmq_operator_fleet_store_ready", "edge") == (1 if condition["status"] == "True" else 0)

    k("delete", "brokerfleet", "edge", "ext", "--wait=false")
    wait_for(lambda: value("fleetmq_operator_fleet_store_ready", "ext") is None, msg="ext's gauges removed")
    wait_for(lambda: value("fleetmq_operator_fleet_store_pods", "edge", state="wanted") is None, msg="edge's")
