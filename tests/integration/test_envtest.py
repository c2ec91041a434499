"""Smoke tests of the test control plane (tests/kubeapi.py): a real kube-apiserver on etcd with RBAC,
CRD schema validation done by the apiserver, and (when the controllers were built) pods that reach Running
on kwok's fake nodes. The operator tests build on these guarantees."""

from __future__ import annotations

import json
import time

import pytest

from tests import kubeapi

pytestmark = pytest.mark.envtest


def _retry(fn, timeout: float = 15.0, interval: float = 0.2):
    """Call fn until it returns a truthy value (RBAC and discovery caches catch up within moments)."""
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(interval)


def test_apiserver_answers_with_its_version(control_plane):
    status, body = control_plane.get("/version")
    assert status == 200, body
    assert json.loads(body)["gitVersion"] == kubeapi.k8s_version()
    assert control_plane.get("/readyz")[0] == 200
    ns = control_plane.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system"} <= set(ns)
    # the admin kubeconfig works on its own (embedded CA and client certificate)
    cfg = json.loads(control_plane.kubeconfig.read_text())
    assert cfg["clusters"][0]["cluster"]["server"] == control_plane.url
    assert control_plane.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_rbac_is_on_a_user_without_bindings_is_forbidden(control_plane, kube_namespace):
    kc = control_plane.kubeconfig_for("nobody", ["nobodies"])
    r = control_plane.kubectl("get", "pods", "-n", kube_namespace, kubeconfig=kc, check=False)
    assert r.returncode != 0
    expected = (
        f'User "nobody" cannot list resource "pods" in API group "" in the namespace "{kube_namespace}"'
    )
    assert expected in r.stderr, r.stderr
    # authenticated (not anonymous): the certificate's CN and O are the user and its groups
    who = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kc)
    info = json.loads(who.stdout)["status"]["userInfo"]
    assert info["username"] == "nobody"
    assert "nobodies" in info["groups"]


def _role_and_binding(ns: str, subjects: list[dict]) -> str:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "configmap-reader", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "configmap-reader", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
        "subjects": subjects,
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]})


def test_impersonated_service_account_is_forbidden_until_bound(control_plane, kube_namespace):
    ns = kube_namespace
    kc = control_plane.impersonating_kubeconfig(service_account=f"{ns}/robot")
    other_ns_kc = control_plane.impersonating_kubeconfig(service_account="default/robot")

    def list_configmaps(kubeconfig=kc):
        return control_plane.kubectl("get", "configmaps", "-n", ns, kubeconfig=kubeconfig, check=False)

    r = list_configmaps()
    assert r.returncode != 0
    assert f'User "system:serviceaccount:{ns}:robot" cannot list resource "configmaps"' in r.stderr, r.stderr
    who = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kc).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:robot"
    assert set(who["status"]["userInfo"]["groups"]) >= {
        "system:serviceaccounts",
        f"system:serviceaccounts:{ns}",
        "system:authenticated",
    }

    control_plane.apply(_role_and_binding(ns, [{"kind": "ServiceAccount", "name": "robot", "namespace": ns}]))
    assert _retry(lambda: list_configmaps().returncode == 0), list_configmaps().stderr
    # the binding is for that ServiceAccount in that namespace only
    r = control_plane.kubectl("get", "configmaps", "-n", "default", kubeconfig=kc, check=False)
    assert "forbidden" in r.stderr.lower(), r.stderr
    r = list_configmaps(other_ns_kc)
    assert "forbidden" in r.stderr.lower(), r.stderr


def test_service_account_token_kubeconfig_is_that_service_account(control_plane, kube_namespace):
    ns = kube_namespace
    kc = control_plane.serviceaccount_kubeconfig(f"{ns}/operator", create=True)
    r = control_plane.kubectl("get", "configmaps", kubeconfig=kc, check=False)  # context namespace: ns
    assert f'User "system:serviceaccount:{ns}:operator" cannot list resource "configmaps"' in r.stderr, (
        r.stderr
    )
    # bound through the namespace's ServiceAccount group, which the token carries
    control_plane.apply(
        _role_and_binding(
            ns,
            [
                {
                    "kind": "Group",
                    "name": f"system:serviceaccounts:{ns}",
                    "apiGroup": "rbac.authorization.k8s.io",
                }
            ],
        ),
    )
    ok = _retry(
        lambda: control_plane.kubectl("get", "configmaps", kubeconfig=kc, check=False).returncode == 0
    )
    assert ok, control_plane.kubectl("get", "configmaps", kubeconfig=kc, check=False).stderr


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.envtest.fleetmq.io"},
    "spec": {
        "group": "envtest.fleetmq.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minSize <= self.size",
                                        "message": "minSize must not exceed size",
                                    }
                                ],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "minSize": {"type": "integer", "default": 1},
                                    "color": {"type": "string", "enum": ["red", "green"]},
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _widget(ns: str, name: str, spec: dict) -> str:
    return json.dumps(
        {
            "apiVersion": "envtest.fleetmq.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
    )


def test_crd_schema_is_enforced_by_the_apiserver(control_plane, kube_namespace):
    cp, ns = control_plane, kube_namespace
    cp.apply(WIDGET_CRD)
    cp.kubectl("wait", "--for=condition=Established", "crd/widgets.envtest.fleetmq.io", "--timeout=30s")

    # a fresh CRD may take a moment to show in discovery
    good = _widget(ns, "good", {"size": 3, "color": "red"})
    applied = _retry(lambda: cp.apply(good, check=False).returncode == 0)
    assert applied, cp.apply(good, check=False).stderr
    got = json.loads(cp.kubectl("get", "wdg", "good", "-n", ns, "-o", "json").stdout)
    assert got["spec"] == {"size": 3, "color": "red", "minSize": 1}  # the schema default applied

    bad = cp.apply(_widget(ns, "bad", {"size": 0, "color": "purple"}), check=False)
    assert bad.returncode != 0
    assert 'The Widget "bad" is invalid' in bad.stderr, bad.stderr
    assert "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1" in bad.stderr
    assert 'spec.color: Unsupported value: "purple": supported values: "red", "green"' in bad.stderr

    cel = cp.apply(_widget(ns, "cel", {"size": 2, "minSize": 5}), check=False)
    assert cel.returncode != 0
    assert "minSize must not exceed size" in cel.stderr, cel.stderr
    assert cp.kubectl("get", "wdg", "bad", "-n", ns, check=False).returncode != 0


def test_statefulset_gets_running_pods_on_fake_nodes(control_plane, kube_namespace):
    cp, ns = control_plane, kube_namespace
    if not cp.controllers:
        pytest.skip("kube-controller-manager, kube-scheduler or kwok not built (make envtest)")
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "serviceName": "web",
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]},
            },
        },
    }
    cp.apply(sts)
    cp.kubectl(
        "wait", "--for=jsonpath={.status.readyReplicas}=2", "statefulset/web", "-n", ns, "--timeout=90s"
    )
    pods = json.loads(cp.kubectl("get", "pods", "-n", ns, "-l", "app=web", "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["web-0", "web-1"]
    for p in pods:
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["nodeName"].startswith("kwok-node-")
        assert p["status"].get("podIP")
