"""The operator's credentials against the real kube-apiserver: the kinds of kubeconfig users it meets on
managed clusters (an exec credential plugin, as EKS, GKE and AKS hand out), a client certificate, a token,
and the files of a pod's ServiceAccount. Each is checked by asking the apiserver who it is talking to."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fleetmq.operator import kube
from fleetmq.operator.kube import ApiError, Kube, connect

from tests.execcred import exec_runs, exec_user
from tests.support import stop_process

from .conftest import OPERATOR_NS, OPERATOR_SA, fleet, wait_for

OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"


def user_kubeconfig(cp: Any, path: Path, user: dict[str, Any]) -> Path:
    """A kubeconfig for the test apiserver with this user entry (context namespace: the operator's)."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {
            "server": cp.url, "certificate-authority-data": base64.b64encode(cp.ca_file.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "u", "namespace": OPERATOR_NS}}],
        "current-context": "envtest",
    }  # fmt: skip
    path.write_text(json.dumps(cfg))
    return path


def operator_token(cp: Any, tmp_path: Path) -> Path:
    token = tmp_path / "sa-token"
    token.write_text(cp.serviceaccount_token(f"{OPERATOR_NS}/{OPERATOR_SA}"))
    return token


async def whoami(kube: Kube) -> str:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    out = await kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review)
    return str(out["status"]["userInfo"]["username"])


def test_operator_with_an_exec_credential_plugin_refetches_expiring_tokens(
    k, control_plane, operator_kubeconfig, tmp_path
):
    """The real operator process, logged in through an exec plugin whose credential expires within
    seconds (for the client: it refreshes 5 minutes ahead), reconciles and keeps reconciling; the plugin
    runs again as the credential expires, not once per request."""
    entry, runs = exec_user(tmp_path / "plugin", operator_token(control_plane, tmp_path), valid_seconds=302)
    kubeconfig = user_kubeconfig(control_plane, tmp_path / "exec.kubeconfig", {"exec": entry})
    log = tmp_path / "operator.log"
    env = {**os.environ, "FLEETMQ_RESYNC_SECONDS": "1"}
    env.pop("KUBECONFIG", None)
    cmd = [sys.executable, "-m", "fleetmq.operator", "--kubeconfig", str(kubeconfig), "--namespace", k.ns]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        k.apply(fleet())
        wait_for(lambda: k.get("statefulset", "edge"), msg=f"reconciled; log:\n{log.read_text()}")
        first = exec_runs(runs)
        wait_for(lambda: exec_runs(runs) >= first + 3, timeout=20, msg="the plugin run again")
        # kopf's watch (same credentials) still delivers changes, and the operator can still write
        k.patch("brokerfleet", "edge", {"spec": {"replicas": 3}})
        wait_for(lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 3, msg="scaled by the operator")
    finally:
        stop_process(proc, 20)
    elapsed = time.monotonic() - started
    text = log.read_text()
    assert "Forbidden" not in text and "Traceback" not in text and "Unauthorized" not in text, text[-4000:]
    # a credential lasts 1-2 s here, while the operator makes several requests a second (resync: 1 s)
    assert exec_runs(runs) <= elapsed + 2, (exec_runs(runs), elapsed)


async def test_exec_token_and_certificate_kubeconfigs_are_who_they_say(
    control_plane, operator_kubeconfig, tmp_path
):
    token = operator_token(control_plane, tmp_path)
    entry, runs = exec_user(tmp_path / "plugin", token, valid_seconds=3600)
    kubeconfigs = {
        "exec": (
            user_kubeconfig(control_plane, tmp_path / "exec.kubeconfig", {"exec": entry}),
            OPERATOR_USER,
        ),
        "token": (operator_kubeconfig, OPERATOR_USER),
        "certificate": (control_plane.kubeconfig_for("alice", ["devs"]), "alice"),
        "admin certificate": (control_plane.kubeconfig, "admin"),
        # the admin certificate with `as:` and `as-groups:`: RBAC decides as for the ServiceAccount itself
        "impersonating": (
            control_plane.impersonating_kubeconfig(f"{OPERATOR_NS}/{OPERATOR_SA}"),
            OPERATOR_USER,
        ),
    }
    for what, (path, user) in kubeconfigs.items():
        kube = Kube(connect(path))
        try:
            assert await whoami(kube) == user, what
            if user == "alice":  # nothing is bound to alice
                with pytest.raises(ApiError, match='User "alice" cannot list resource "brokerfleets"'):
                    await kube.list("BrokerFleet", "default")
            else:
                await kube.list("BrokerFleet", "default")
            if user == OPERATOR_USER:  # operator/rbac.yaml: Secrets are never listed, which admin may
                with pytest.raises(ApiError, match="HTTP 403"):
                    await kube.request("GET", "/api/v1/secrets")
        finally:
            await kube.close()
    assert exec_runs(runs) == 1  # a credential that has not expired is reused


async def test_in_cluster_service_account_files(control_plane, operator_kubeconfig, tmp_path, monkeypatch):
    """What a pod has: KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount's ca.crt, token, namespace."""
    monkeypatch.setattr(kube, "DEFAULT_KUBECONFIG", tmp_path / "absent")  # not the developer's own
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(control_plane.ca_file.read_bytes())
    (sa / "token").write_text(operator_token(control_plane, tmp_path).read_text())
    (sa / "namespace").write_text(OPERATOR_NS)
    env = {"KUBERNETES_SERVICE_HOST": control_plane.host, "KUBERNETES_SERVICE_PORT": str(control_plane.port)}
    conn = connect(sa_dir=sa, environ=env)
    assert (conn.server, conn.namespace) == (control_plane.url, OPERATOR_NS)
    client = Kube(conn)
    try:
        assert await whoami(client) == OPERATOR_USER
        await client.list("BrokerFleet", "default")
        with pytest.raises(ApiError, match="HTTP 403"):  # operator/rbac.yaml: Secrets are never listed
            await client.list("Secret", "default")
    finally:
        await client.close()


def test_operator_stops_when_the_apiserver_refuses_its_credentials(control_plane, kube_namespace, tmp_path):
    """A refused token is not retried forever: kopf logs in again once, gets the same credentials, and the
    operator exits (a Deployment restarts it, and the restart reloads the kubeconfig)."""
    kubeconfig = user_kubeconfig(control_plane, tmp_path / "bad.kubeconfig", {"token": "not-a-valid-token"})
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    cmd = [sys.executable, "-m", "fleetmq.operator", "--kubeconfig", str(kubeconfig), "-n", kube_namespace]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert "the apiserver refused the credentials and there are no new ones" in out, out[-4000:]
    assert proc.returncode != 0 and "Ran out of valid credentials" in out, out[-4000:]
