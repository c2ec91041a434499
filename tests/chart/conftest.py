"""Fixtures for the Helm chart tests: the helm binary (`make tools`, scripts/tools.sh) and rendering.

Without helm the tests are skipped, except in CI (CI=true), where that is a failure, as for the control
plane fixture.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "charts" / "fleetmq"

# values and flags the tests render the chart with: the example fleet on; the Prometheus Operator's CRDs
# known to the cluster (so the monitoring objects render); every operator setting away from its default
EXAMPLES = {"examples": {"enabled": True}}
MONITORING = (
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
)

CUSTOM = {
    "image": {"repository": "registry.example.com/mq/fleetmq", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "operator": {
        "replicas": 2,
        "watchNamespaces": ["team-a", "team-b"],
        "peering": {"name": "mq-operators"},
        "resyncSeconds": 10,
        "logLevel": "debug",
        "ports": {"metrics": 9090, "liveness": 9091},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "podSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": 20000,
            "fsGroup": 20000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mq", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "mq"},
        "priorityClassName": "system-cluster-critical",
    },
    "serviceAccount": {"name": "mq-operator", "annotations": {"example.com/role": "operator"}},
}


def helm_binary() -> Path:
    """$FLEETMQ_HELM, else where scripts/tools.sh installs the pinned helm."""
    if path := os.environ.get("FLEETMQ_HELM"):
        return Path(path)
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "tools.sh"), "--path", "helm"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@dataclass
class Helm:
    binary: Path
    home: Path  # HELM_{CACHE,CONFIG,DATA}_HOME: nothing written to the user's ~/.cache or ~/.config

    def __call__(
        self, *args: Any, check: bool = True, kubeconfig: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
        env |= {f"HELM_{d}_HOME": str(self.home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}
        argv = [str(self.binary), *map(str, args)]
        if kubeconfig:
            argv.append(f"--kubeconfig={kubeconfig}")
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if check and cp.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
        return cp

    def values_file(self, values: dict[str, Any] | None) -> list[str]:
        if not values:
            return []
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=self.home, delete=False) as f:
            yaml.safe_dump(values, f)
        return ["--values", f.name]

    def template_text(
        self,
        values: dict[str, Any] | None = None,
        *extra: str,
        chart: Path = CHART,
        release: str = "fleetmq",
        namespace: str = "fleetmq-system",
    ) -> str:
        return self(
            "template", release, chart, "--namespace", namespace, *self.values_file(values), *extra
        ).stdout

    def template(self, values: dict[str, Any] | None = None, *extra: str, **kw: Any) -> list[dict[str, Any]]:
        """The chart's manifests (hooks included) for these values."""
        return [d for d in yaml.safe_load_all(self.template_text(values, *extra, **kw)) if d]


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    binary = helm_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        msg = f"helm not found at {binary}: run `make tools`"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(msg)
        pytest.skip(msg)
    return Helm(binary, tmp_path_factory.mktemp("helm"))


def find(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one manifest of `kind` (and `name`)."""
    hits = [m for m in manifests if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    assert len(hits) == 1, (
        f"{len(hits)} {kind} {name or ''} in {[(m['kind'], m['metadata']['name']) for m in manifests]}"
    )
    return hits[0]


def kinds(manifests: list[dict[str, Any]]) -> list[str]:
    return sorted(m["kind"] for m in manifests)
