"""The operator's command line, credentials loading and RBAC file."""

from __future__ import annotations

import base64
import json

from fleetmq.operator import cli, kube, rbac
from fleetmq.operator.handlers import connection_info


def test_cli_maps_to_kopf_run_flags():
    args = cli.parse_args(["--namespace", "mq", "-n", "edge-*", "--peering", "fleetmq", "--priority", "5",
                           "--liveness", "http://0.0.0.0:8081/healthz"])  # fmt: skip
    assert cli.kopf_args(args) == [
        "run", "--module", "fleetmq.operator.handlers", "--namespace", "mq", "--namespace", "edge-*",
        "--peering", "fleetmq", "--priority", "5", "--liveness", "http://0.0.0.0:8081/healthz",
    ]  # fmt: skip
    default = cli.kopf_args(cli.parse_args([]))
    assert "--all-namespaces" in default and "--standalone" in default


def test_kubeconfig_with_token_certificates_and_impersonation(tmp_path):
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/",
                                               "certificate-authority-data": base64.b64encode(b"CA").decode()}}],
        "users": [{"name": "u", "user": {"token": "tok", "as": "system:serviceaccount:ns:op",
                                         "as-groups": ["system:serviceaccounts"]}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "x",
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    creds = kube.load_kubeconfig(path)
    assert (creds.server, creds.ca_data, creds.namespace) == ("https://127.0.0.1:6443", b"CA", "ns")
    assert creds.header_items() == [
        ("Authorization", "Bearer tok"),
        ("Impersonate-User", "system:serviceaccount:ns:op"),
        ("Impersonate-Group", "system:serviceaccounts"),
    ]
    info = connection_info(creds)
    assert info.as_http_headers()["Impersonate-User"] == "system:serviceaccount:ns:op"


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
