"""Fixtures for the operator against a real kube-apiserver (tests/kubeapi.py, `make envtest`).

The operator runs in-process (kopf.testing.KopfRunner) with a kubeconfig holding a token of the
ServiceAccount that operator/rbac.yaml defines, so every request it makes is authorized by that RBAC alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetmq.operator import rbac

from tests import kubeapi

ROOT = Path(__file__).resolve().parent.parent.parent
OPERATOR_NS = "fleetmq-system"
OPERATOR_SA = "fleetmq-operator-under-test"  # (see operator_kubeconfig)


def wait_for(
    pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25, msg: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = pred()
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {msg} (last: {last!r})")


class Kubectl:
    """kubectl as the admin, in one namespace, with JSON in and out."""

    def __init__(self, cp: Any, namespace: str) -> None:
        self.cp, self.ns = cp, namespace

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.cp.kubectl("-n", self.ns, *args, input=input, check=check)

    def apply(self, obj: dict[str, Any], check: bool = True) -> Any:
        return self("apply", "-f", "-", input=json.dumps(obj), check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self("get", kind, name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def patch(self, kind: str, name: str, patch: dict[str, Any], kind_of_patch: str = "merge") -> Any:
        return self("patch", kind, name, "--type", kind_of_patch, "-p", json.dumps(patch))

    def condition(self, kind: str, name: str, type_: str) -> dict[str, Any]:
        obj = self.get(kind, name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


@pytest.fixture(scope="session")
def crds_installed(control_plane) -> None:
    control_plane.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    kubeapi.wait_established(control_plane.kubectl, ["brokerfleets.fleetmq.io", "mqttzones.fleetmq.io"])


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane, crds_installed) -> Path:
    """A kubeconfig with a token of the operator's ServiceAccount, bound only by operator/rbac.yaml. Its
    cluster-wide objects get a name of their own: the chart tests `helm install` a release whose
    ClusterRole is rbac.NAME on the same API server, in whatever order the tests run."""
    if control_plane.kubectl("get", "namespace", OPERATOR_NS, check=False).returncode != 0:
        control_plane.create_namespace(OPERATOR_NS)
    control_plane.kubectl("apply", "-f", "-", input=rbac.render_yaml(OPERATOR_NS, OPERATOR_SA))
    return control_plane.serviceaccount_kubeconfig(f"{OPERATOR_NS}/{OPERATOR_SA}")


@pytest.fixture
def k(control_plane, kube_namespace, crds_installed) -> Kubectl:
    return Kubectl(control_plane, kube_namespace)


class Operator:
    """One in-process operator (kopf.testing.KopfRunner) watching one namespace."""

    def __init__(self, namespace: str, peering: tuple[str, int] | None = None) -> None:
        from fleetmq.operator.cli import kopf_args, parse_args
        from kopf.testing import KopfRunner

        flags = ["--namespace", namespace]
        if peering:
            flags += ["--peering", peering[0], "--priority", str(peering[1])]
        self.runner = KopfRunner(kopf_args(parse_args(flags)), timeout=60)
        self.runner.__enter__()
        self.running = True

    def stop(self) -> str:
        """Stop it; returns its log after checking it holds no error (and no RBAC refusal)."""
        if self.running:
            self.running = False
            self.runner.__exit__(None, None, None)
        output = self.runner.output
        if os.environ.get("FLEETMQ_SHOW_OPERATOR_LOG"):
            print(output)
        assert "Forbidden" not in output, f"RBAC is not enough:\n{output[-6000:]}"
        # Once kopf sets its stop flag it closes its own API session while its resource observer may still
        # be asking: those requests' retries ("Request attempt #N/9 failed ...") are kopf's shutdown, not
        # the operator's errors (seen once in a full `make test` run). Anything else logged then counts.
        stopping = False
        errors = []
        for ln in output.splitlines():
            stopping = stopping or "Stop-flag is set to True" in ln
            if "[ERROR" not in ln or "will retry" in ln:
                continue
            if stopping and "kopf._core.reactor.o" in ln and "Request attempt #" in ln:
                continue
            errors.append(ln)
        assert "Traceback" not in output and not errors, output[-6000:]
        return output


@pytest.fixture
def namespaced_operator_kubeconfig(control_plane, crds_installed, kube_namespace) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount with the RBAC of an operator watching only the test's namespace
    (rbac.manifests(watch=...)): a Role there, a ClusterRole that reads CRDs and namespaces."""
    if control_plane.kubectl("get", "namespace", OPERATOR_NS, check=False).returncode != 0:
        control_plane.create_namespace(OPERATOR_NS)
    name = f"fleetmq-ns-{kube_namespace[-6:]}"
    objs = rbac.manifests(OPERATOR_NS, name, [kube_namespace])
    control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    )
    yield control_plane.serviceaccount_kubeconfig(f"{OPERATOR_NS}/{name}")
    for obj in objs:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount"):
            ns = obj["metadata"].get("namespace")
            control_plane.kubectl(*(["-n", ns] if ns else []), "delete", obj["kind"], obj["metadata"]["name"],
                                  "--wait=false", check=False)  # fmt: skip


@pytest.fixture
def run_operator(operator_kubeconfig, kube_namespace, monkeypatch) -> Iterator[Callable[..., Operator]]:
    """Start the operator (as its ServiceAccount) watching the test's namespace; stopped at teardown."""
    monkeypatch.setenv("KUBECONFIG", str(operator_kubeconfig))
    monkeypatch.setenv("FLEETMQ_RESYNC_SECONDS", "1")
    monkeypatch.setenv("FLEETMQ_WATCH_SERVER_TIMEOUT", "60")  # watches restart within the test's time
    started: list[Operator] = []

    def start(peering: tuple[str, int] | None = None) -> Operator:
        started.append(Operator(kube_namespace, peering))
        return started[-1]

    yield start
    for op in started:
        op.stop()


def fleet(name: str = "edge", **spec: Any) -> dict[str, Any]:
    spec.setdefault("replicas", 2)
    spec.setdefault("redis", {"url": "redis://127.0.0.1:1/0"})
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "BrokerFleet",
        "metadata": {"name": name},
        "spec": spec,
    }


def bridge(name: str = "cloud", fleet_name: str = "edge", **spec: Any) -> dict[str, Any]:
    spec.setdefault("remote", {"host": "mqtt.example.com"})
    spec.setdefault("forwards", [{"filter": "up/#", "destination": "site1/{#}"}])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttBridge",
        "metadata": {"name": name},
        "spec": {"fleetRef": {"name": fleet_name}, **spec},
    }


def zone(name: str = "external", fleet_name: str = "edge", **spec: Any) -> dict[str, Any]:
    spec.setdefault("listeners", [{"name": "mqtt", "port": 1883}])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttZone",
        "metadata": {"name": name},
        "spec": {"fleetRef": {"name": fleet_name}, **spec},
    }


def user(name: str = "sensor", fleet_name: str = "edge", **spec: Any) -> dict[str, Any]:
    spec.setdefault("zones", ["external"])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttUser",
        "metadata": {"name": name},
        "spec": {"fleetRef": {"name": fleet_name}, **spec},
    }


@pytest.fixture(scope="session")
def cert_manager(control_plane, tmp_path_factory) -> Iterator[Path]:
    """cert-manager's real controllers (scripts/certmanager.sh: built from its Go module, with its CRDs)
    running against the control plane as the admin; stopped by pid at the end. Yields its log. No
    webhook: objects given to it must carry every field (nothing defaults them)."""
    import subprocess
    import sys

    script = ROOT / "scripts" / "certmanager.sh"
    if subprocess.run(["bash", str(script), "--check"], check=False).returncode != 0:
        pytest.fail("cert-manager is not built: run `make certmanager` (scripts/certmanager.sh)")
    bin_dir = Path(subprocess.run(["bash", str(script), "--path"], check=True, capture_output=True,
                                  text=True).stdout.strip())  # fmt: skip
    control_plane.kubectl("apply", "--server-side", "-f", str(bin_dir.parent / "crds"))
    kubeapi.wait_established(
        control_plane.kubectl, ["certificates.cert-manager.io", "issuers.cert-manager.io"]
    )
    log = tmp_path_factory.mktemp("cert-manager") / "controller.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "cert-manager-controller"), f"--kubeconfig={control_plane.kubeconfig}",
             "--cluster-resource-namespace=kube-system"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode not in (0, -15):
            print(log.read_text()[-4000:], file=sys.stderr)
