"""The operator dashboard against a real Prometheus scraping a real `fleetmq-operator` process.

The operator runs as the chart runs it (its CLI with --metrics, as its ServiceAccount, bound by
operator/rbac.yaml) against the real kube-apiserver of tests/kubeapi.py, reconciling a fleet with one
accepted and one rejected zone every second (--resync 1). Each panel's PromQL must return numbers, and
the fleet, whose pods never report their config, is not Ready: FleetmqFleetNotReady's expression names it.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetmq.operator import monitoring

from tests.monitoring.promproc import PrometheusServer, substitute
from tests.operator.conftest import Kubectl, fleet, wait_for, zone
from tests.support import free_port

pytestmark = [pytest.mark.envtest, pytest.mark.prometheus, pytest.mark.timeout(300)]

QUERIES = [q for q in monitoring.dashboard_queries() if q[0] == "fleetmq-operator"]
LABELS = {"namespace": "fleetmq-system", "pod": "fleetmq-operator-0"}


def _sample(port: int, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


@pytest.fixture
def operator_process(
    control_plane, operator_kubeconfig: Path, kube_namespace: str, tmp_path: Path
) -> Iterator[int]:
    """`python -m fleetmq.operator` watching the test's namespace; yields its metrics port."""
    port = free_port()
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "fleetmq.operator",
                "--kubeconfig", str(operator_kubeconfig),
                "--namespace", kube_namespace,
                "--standalone",
                "--metrics", f"127.0.0.1:{port}",
                "--resync", "1",
            ],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: _sample(port, "fleetmq_operator_fleets") >= 0, msg="operator /metrics")
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "Forbidden" not in text, text[-6000:]


def test_every_operator_panel_has_data(
    control_plane,
    kube_namespace: str,
    crds_installed,
    operator_process: int,
    tmp_path: Path,
    prometheus_bin: str,
):
    k = Kubectl(control_plane, kube_namespace)
    k.apply(fleet())
    k.apply(zone("first"))
    wait_for(lambda: k.condition("mqttzone", "first", "Accepted").get("status") == "True", msg="accepted")
    k.apply(zone("second"))  # the same port: refused
    wait_for(
        lambda: k.condition("mqttzone", "second", "Accepted").get("reason") == "PortConflict", msg="refused"
    )
    wait_for(
        lambda: _sample(operator_process, "fleetmq_operator_zones", state="rejected") == 1, msg="counted"
    )

    prom = PrometheusServer(
        tmp_path / "prometheus", {"fleetmq-operator": [(f"127.0.0.1:{operator_process}", LABELS)]}
    )
    try:
        prom.wait_scraped(3)
        wait_for(
            lambda: prom.query("sum(increase(fleetmq_operator_reconciles_total[15s])) > 0")["result"],
            msg="reconciliations scraped",
        )
        failures = []
        for variables in (
            {"namespace": ".*", "pod": ".*"},
            {"namespace": LABELS["namespace"], "pod": "(fleetmq-operator-0)"},
        ):
            for _, panel, expr in QUERIES:
                expr = substitute(expr, variables)
                if expr.startswith("label_values("):
                    selector, label = expr.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
                    if not prom.label_values(label, selector):
                        failures.append(f"{panel}: no values ({expr})")
                    continue
                result = prom.query(expr)["result"]
                if not any(math.isfinite(float(r["value"][1])) for r in result):
                    failures.append(f"{panel}: {result} for {expr}")
        assert not failures, "\n".join(failures)
        zones = {
            r["metric"]["state"]: float(r["value"][1]) for r in prom.query("fleetmq_operator_zones")["result"]
        }
        assert zones == {"accepted": 1.0, "rejected": 1.0}
        # no pod reports to Redis here (at most kwok's fake pods run): the fleet is not Ready
        fleet_labels = {"fleet_namespace": kube_namespace, "fleet": "edge"}
        ready = prom.query("fleetmq_operator_fleet_ready")["result"]
        assert [(r["metric"]["fleet_namespace"], r["metric"]["fleet"], r["value"][1]) for r in ready] == [
            (kube_namespace, "edge", "0")
        ]
        assert k.condition("brokerfleet", "edge", "Ready")["status"] == "False"

        def replicas() -> dict[str, float]:
            result = prom.query("fleetmq_operator_fleet_replicas")["result"]
            return {r["metric"]["state"]: float(r["value"][1]) for r in result}

        pods_ready = (k.get("brokerfleet", "edge").get("status") or {}).get("readyReplicas", 0)
        wait_for(
            lambda: replicas() == {"desired": 2, "ready": pods_ready}, msg=f"2 desired, {pods_ready} ready"
        )
        rules = {r["alert"]: r for g in monitoring.alert_groups()["groups"] for r in g["rules"]}
        assert prom.query(rules["FleetmqOperatorReconcileErrors"]["expr"])["result"] == []  # nothing failed
        (firing,) = prom.query(rules["FleetmqFleetNotReady"]["expr"])["result"]  # it would after its `for:`
        assert firing["metric"] == {**fleet_labels, "namespace": kube_namespace}, firing
        # its Redis (redis://127.0.0.1:1) answers nobody: StoreReady is False (Unreachable), not for missing pods
        assert k.condition("brokerfleet", "edge", "StoreReady")["reason"] == "Unreachable"
        (firing,) = wait_for(lambda: prom.query(rules["FleetmqStoreNotReady"]["expr"])["result"], msg="store")
        assert firing["metric"] == {**fleet_labels, "namespace": kube_namespace}, firing
        assert prom.query(rules["FleetmqStoreRedisPodsMissing"]["expr"])["result"] == []  # no managed Redis
    finally:
        prom.stop()
