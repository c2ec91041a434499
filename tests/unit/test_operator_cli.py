"""The operator's command line, credentials loading and RBAC file."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl

import aiohttp
import pytest
from fleetmq.operator import cli, kube, rbac
from kubernetes.config import ConfigException

from tests import kubeapi
from tests.execcred import exec_runs, exec_user


def test_cli_maps_to_kopf_run_flags():
    args = cli.parse_args(["--namespace", "mq", "-n", "edge-*", "--peering", "fleetmq", "--priority", "5",
                           "--liveness", "http://0.0.0.0:8081/healthz"])  # fmt: skip
    assert cli.kopf_args(args) == [
        "run", "--module", "fleetmq.operator.handlers", "--namespace", "mq", "--namespace", "edge-*",
        "--peering", "fleetmq", "--priority", "5", "--liveness", "http://0.0.0.0:8081/healthz",
    ]  # fmt: skip
    default = cli.kopf_args(cli.parse_args([]))
    assert cli.parse_args(["--kubeconfig", "kc", "--context", "prod"]).context == "prod"
    assert "--all-namespaces" in default and "--standalone" in default


def kubeconfig(path, users: dict, current: str = "tok") -> str:
    """A kubeconfig of one cluster with a context per user (named after it, namespace "ns-<user>")."""
    ca = kubeapi._cert_pem(kubeapi._new_cert("test-ca", is_ca=True)[0])
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/",
                                               "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": name, "namespace": f"ns-{name}"}}
                     for name in users],
        "current-context": current,
    }  # fmt: skip
    path.write_text(json.dumps(cfg))
    return str(path)


def test_kubeconfig_token_and_client_certificate_users(tmp_path, monkeypatch):
    crt, key = kubeapi._new_cert("alice", ca=kubeapi._new_cert("test-ca", is_ca=True), client=True)
    cert_user = {"client-certificate-data": base64.b64encode(kubeapi._cert_pem(crt)).decode(),
                 "client-key-data": base64.b64encode(kubeapi._key_pem(key)).decode()}  # fmt: skip
    path = kubeconfig(tmp_path / "kubeconfig", {"tok": {"token": "s3cret"}, "cert": cert_user})
    conn = kube.connect(path)
    assert (conn.server, conn.namespace, conn.authorization()) == (
        "https://127.0.0.1:6443",
        "ns-tok",
        "Bearer s3cret",
    )
    conn.ssl_context()  # the CA loads
    conn = kube.connect(path, context="cert")
    assert (conn.namespace, conn.authorization()) == ("ns-cert", None)
    assert conn.ssl_context().verify_mode == ssl.CERT_REQUIRED  # with the client certificate loaded
    # $KUBECONFIG when no path is given
    monkeypatch.setenv("KUBECONFIG", path)
    assert kube.connect().authorization() == "Bearer s3cret"


def test_kubeconfig_as_fields_become_impersonation_headers(tmp_path, monkeypatch):
    """`as`, `as-uid`, `as-groups` and `as-user-extra`, as kubectl sends them; a user without them sends
    none. The user is found across the files of a $KUBECONFIG list, as kubectl merges them."""
    robot = {"token": "admin", "as": "system:serviceaccount:ns:robot", "as-uid": "42",
             "as-groups": ["system:serviceaccounts", "devs"], "as-user-extra": {"reason/why": ["audit", "x"]}}  # fmt: skip
    first = kubeconfig(tmp_path / "first", {"tok": {"token": "t"}})
    second = kubeconfig(tmp_path / "second", {"robot": robot}, current="robot")
    conn = kube.connect(f"{first}:{second}", context="robot")
    assert conn.namespace == "ns-robot" and conn.authorization() == "Bearer admin"
    assert conn.impersonation == [
        ("Impersonate-User", "system:serviceaccount:ns:robot"),
        ("Impersonate-Uid", "42"),
        ("Impersonate-Group", "system:serviceaccounts"),
        ("Impersonate-Group", "devs"),
        ("Impersonate-Extra-reason%2Fwhy", "audit"),
        ("Impersonate-Extra-reason%2Fwhy", "x"),
    ]
    assert kube.connect(first).impersonation == []
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert kube.connect(context="robot").impersonation[0] == (
        "Impersonate-User",
        "system:serviceaccount:ns:robot",
    )


def test_exec_plugin_runs_again_only_once_its_credential_expires(tmp_path):
    token = tmp_path / "token"
    token.write_text("from-plugin\n")
    lasting, lasting_runs = exec_user(tmp_path / "lasting", token, valid_seconds=3600)
    expiring, expiring_runs = exec_user(tmp_path / "expiring", token, valid_seconds=1)
    path = kubeconfig(tmp_path / "kubeconfig", {"lasting": {"exec": lasting}, "expiring": {"exec": expiring}},
                      current="lasting")  # fmt: skip
    conn = kube.connect(path)
    assert [conn.authorization() for _ in range(3)] == ["Bearer from-plugin"] * 3
    assert exec_runs(lasting_runs) == 1
    conn = kube.connect(path, context="expiring")
    token.write_text("rotated\n")
    assert conn.authorization() == "Bearer rotated"  # expired (within the refresh margin): fetched again
    assert exec_runs(expiring_runs) == 2


async def test_a_session_closed_while_credentials_are_fetched_fails_as_a_closed_connector(
    tmp_path, monkeypatch
):
    """kopf closes a session on a 401 while other requests may be waiting for credentials: those fail the
    way kopf retries (ClientConnectionError), not with aiohttp's internal assertion."""
    conn = kube.connect(kubeconfig(tmp_path / "kubeconfig", {"tok": {"token": "t"}}))
    fetching, release = asyncio.Event(), asyncio.Event()

    async def slow_headers() -> dict[str, str]:
        fetching.set()
        await release.wait()
        return {"Authorization": "Bearer t"}

    monkeypatch.setattr(conn, "headers", slow_headers)
    session = conn.session()
    request = asyncio.create_task(session.get(conn.server + "/api"))
    await fetching.wait()
    await session.close()
    release.set()
    with pytest.raises(aiohttp.ClientConnectionError, match="Connector is closed"):
        await request


async def test_in_cluster_from_the_service_account_files(tmp_path, monkeypatch):
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(kubeapi._cert_pem(kubeapi._new_cert("test-ca", is_ca=True)[0]))
    (sa / "token").write_text("projected")
    (sa / "namespace").write_text("fleetmq-system")
    monkeypatch.setattr(kube, "DEFAULT_KUBECONFIG", tmp_path / "absent")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    conn = kube.connect(sa_dir=sa, environ=env)
    assert (conn.server, conn.namespace) == ("https://10.96.0.1:443", "fleetmq-system")
    assert await conn.headers() == {"Authorization": "bearer projected"}
    conn.ssl_context()
    with pytest.raises(ConfigException, match=r"no kubeconfig .* and not in a pod"):
        kube.connect(sa_dir=sa, environ={})


def test_paths_of_the_kinds_the_operator_touches():
    assert kube.path_of("StatefulSet", "mq", "edge") == "/apis/apps/v1/namespaces/mq/statefulsets/edge"
    assert kube.path_of("BrokerFleet", "mq", "edge", "status") == (
        "/apis/fleetmq.io/v1alpha1/namespaces/mq/brokerfleets/edge/status"
    )


def test_rbac_file_is_up_to_date_and_least_privilege():
    assert rbac.RBAC_FILE.read_text() == rbac.render_yaml(), "run `python -m fleetmq.operator.rbac --write`"
    rules = [rule for _, rule in rbac.RULES]
    secrets = [r for r in rules if "secrets" in r["resources"]]
    # Secrets are read, the managed Redis' password created once, the fleet's bridge Secret applied (patch):
    # never listed, watched, updated or deleted
    assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]}]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    # watching given namespaces: the namespaced rules only in a Role of each, cluster-wide only reads
    objs = rbac.manifests("ops", "op", ["team-a", "team-b"])
    by_kind = {(o["kind"], o["metadata"].get("namespace")): o for o in objs}
    assert set(by_kind) == {("ServiceAccount", "ops"), ("ClusterRole", None), ("ClusterRoleBinding", None),
                            ("Role", "team-a"), ("RoleBinding", "team-a"), ("Role", "team-b"),
                            ("RoleBinding", "team-b")}  # fmt: skip
    cluster = by_kind[("ClusterRole", None)]["rules"]
    assert {r for rule in cluster for r in rule["resources"]} == {"customresourcedefinitions", "namespaces"}
    # cluster-wide it reads, and patches only fleetmq's own CRDs, by name (--manage-crds)
    writes = [rule for rule in cluster if not set(rule["verbs"]) <= {"get", "list", "watch"}]
    assert writes == [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                       "resourceNames": ["brokerfleets.fleetmq.io", "mqttbridges.fleetmq.io", "mqttusers.fleetmq.io",
                                             "mqttzones.fleetmq.io"],
                       "verbs": ["patch"]}]  # fmt: skip
    assert {"secrets", "statefulsets", "kopfpeerings"} <= {
        r for rule in by_kind[("Role", "team-a")]["rules"] for r in rule["resources"]
    }
    # pods are read (the fleet's status says why a container cannot run: ImagePullBackOff, ...) and
    # labelled during a rollout (rollout.py); never created, deleted or evicted
    pods = [r for r in rules if "pods" in r["resources"]]
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]
