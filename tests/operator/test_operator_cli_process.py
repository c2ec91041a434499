"""`fleetmq-operator` as a process: its flags, its metrics and liveness endpoints, and it reconciles."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

from tests.support import free_port, stop_process

from .conftest import fleet, wait_for


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status, r.read().decode()


def test_console_script_serves_metrics_and_liveness_and_reconciles(k, operator_kubeconfig, tmp_path):
    metrics_port, live_port = free_port(), free_port()
    log = tmp_path / "operator.log"
    env = {**os.environ, "FLEETMQ_RESYNC_SECONDS": "1"}
    env.pop("KUBECONFIG", None)
    cmd = [sys.executable, "-m", "fleetmq.operator", "--kubeconfig", str(operator_kubeconfig), "--namespace", k.ns,
           "--metrics", f"127.0.0.1:{metrics_port}", "--liveness", f"http://127.0.0.1:{live_port}/healthz"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        k.apply(fleet())
        wait_for(lambda: k.get("statefulset", "edge"), msg=f"reconciled; log:\n{log.read_text()}")
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{live_port}/healthz")[0] == 200, msg="liveness")
        body = wait_for(lambda: (b := http_get(f"http://127.0.0.1:{metrics_port}/metrics")[1])
                        and 'fleetmq_operator_reconciles_total{result="ok"}' in b and b, msg="metrics")  # fmt: skip
        assert "fleetmq_operator_reconcile_duration_seconds_bucket" in body
        assert 'fleetmq_operator_child_changes_total{kind="StatefulSet"}' in body
    finally:
        stop_process(proc, 20)
    text = log.read_text()
    assert "Forbidden" not in text and "Traceback" not in text, text[-4000:]
