"""`make e2e` where the machine cannot run it: it says exactly what is missing and fails (exit 2), before
building or starting anything; never a pass without running."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import realnode

ROOT = Path(__file__).resolve().parents[2]


def test_kind_without_a_docker_engine_or_root_is_not_run_and_says_why(tmp_path):
    # a `docker` that answers like a CLI without an engine behind it, and a user who is not root (as root,
    # scripts/kind.sh would start Debian's dockerd)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///nowhere' >&2\nexit 1\n"
    )
    (fake / "id").write_text("#!/bin/sh\necho 1000\n")
    for tool in ("docker", "id"):
        (fake / tool).chmod(0o755)
    env = {
        **os.environ,
        "E2E_CLUSTER": "kind",
        "PATH": f"{fake}:{os.environ['PATH']}",
        "CACHE": str(tmp_path),
    }
    out = subprocess.run(
        ["bash", ROOT / "e2e" / "run.sh"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "e2e: NOT RUN on kind, missing:" in out.stderr
    assert (
        "a running Docker engine, or root to start Debian's dockerd: `docker info` says: Cannot connect to the "
        "Docker daemon" in out.stderr
    )
    assert not list(tmp_path.glob("tools*")), "it built something before saying no"


def test_unknown_cluster_kind_is_refused():
    env = {**os.environ, "E2E_CLUSTER": "minikube"}
    out = subprocess.run(
        ["bash", ROOT / "e2e" / "run.sh"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "E2E_CLUSTER=minikube is none of real, kind, existing" in out.stderr


def test_real_node_preflight_names_each_missing_part(monkeypatch):
    monkeypatch.setattr(
        shutil, "which", lambda name: None if name in ("containerd", "nft") else f"/usr/bin/{name}"
    )
    monkeypatch.setattr(realnode, "CNI_BIN_DIR", "/nonexistent/cni")
    missing = realnode.preflight()
    assert "containerd: Debian package containerd (scripts/system-deps.sh node)" in missing
    assert "nft: Debian package nftables (scripts/system-deps.sh node)" in missing
    assert any(m.startswith("CNI plugin /nonexistent/cni/bridge") for m in missing)
    if os.geteuid() != 0:
        pytest.skip("the rest is about root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert any(m.startswith("root:") for m in realnode.preflight())
