"""The e2e cluster: kind, the fleetmq image built with Docker and loaded into it, the chart installed.

Run through e2e/run.sh (`make e2e`), which checks the preconditions and sets FLEETMQ_KIND, FLEETMQ_HELM
and FLEETMQ_KUBECTL. E2E_KEEP=1 keeps the cluster afterwards; E2E_NODE_IMAGE picks the kind node image.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "fleetmq"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"fleetmq/broker:{VERSION}"  # the default of the chart and of BrokerFleet.spec.image
CLUSTER = "fleetmq-e2e"
RELEASE, RELEASE_NS, APP_NS = "fleetmq", "fleetmq-system", "mqtt"


def run(*argv: Any, timeout: float = 600, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    cp = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return cp


def tool(name: str) -> str:
    path = os.environ.get(f"FLEETMQ_{name.upper()}")
    if not path:
        pytest.fail(f"FLEETMQ_{name.upper()} is not set: run the e2e with `make e2e` (e2e/run.sh)")
    return path


def wait_for(pred, timeout: float = 180.0, interval: float = 1.0, msg: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except Exception as e:  # retried until the deadline, then reported
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {msg} (last: {last!r})")


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_bin: str
    helm_bin: str

    def kubectl(self, *args: Any, input: str | None = None, check: bool = True, timeout: float = 300):
        return run(
            self.kubectl_bin,
            f"--kubeconfig={self.kubeconfig}",
            *args,
            input=input,
            check=check,
            timeout=timeout,
        )

    def helm(self, *args: Any, check: bool = True, timeout: float = 600):
        return run(self.helm_bin, f"--kubeconfig={self.kubeconfig}", *args, check=check, timeout=timeout)

    def get(self, kind: str, name: str, ns: str = APP_NS) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pods(self, selector: str, ns: str = APP_NS) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json")
        return json.loads(out.stdout)["items"]

    def readyz(self, pod: str, port: int = 9100, ns: str = APP_NS) -> dict[str, Any]:
        """A broker's /readyz, through the apiserver's pod proxy."""
        out = self.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/readyz")
        return json.loads(out.stdout)

    def condition(self, kind: str, name: str, type_: str, ns: str = APP_NS) -> dict[str, Any]:
        obj = self.get(kind, name, ns) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    kind = tool("kind")
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    existing = run(kind, "get", "clusters").stdout.split()
    if CLUSTER in existing:
        run(kind, "delete", "cluster", "--name", CLUSTER)
    node_image = os.environ.get("E2E_NODE_IMAGE")
    run(
        kind,
        "create",
        "cluster",
        "--name",
        CLUSTER,
        f"--kubeconfig={kubeconfig}",
        "--wait=180s",
        *([f"--image={node_image}"] if node_image else []),
        timeout=900,
    )
    try:
        run("docker", "build", "--tag", IMAGE, ROOT, timeout=1800)
        run(kind, "load", "docker-image", IMAGE, "--name", CLUSTER, timeout=600)
        yield Cluster(kubeconfig, tool("kubectl"), tool("helm"))
    finally:
        if not os.environ.get("E2E_KEEP"):
            run(kind, "delete", "cluster", "--name", CLUSTER, check=False)


@dataclass
class PortForward:
    """`kubectl port-forward TARGET :PORT` on a free local port; restarted by whoever needs it again."""

    cluster: Cluster
    target: str
    port: int
    ns: str = APP_NS
    local: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> PortForward:
        c = self.cluster
        self.proc = subprocess.Popen(
            [
                c.kubectl_bin,
                f"--kubeconfig={c.kubeconfig}",
                "port-forward",
                "-n",
                self.ns,
                self.target,
                f":{self.port}",
                "--address=127.0.0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 1883"
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"port-forward {self.target}: {line}")
        self.local = int(m.group(1))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


@pytest.fixture
def forwards() -> Iterator[list[PortForward]]:
    started: list[PortForward] = []
    yield started
    for pf in started:
        pf.stop()


def manifests(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
