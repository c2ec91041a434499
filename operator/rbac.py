"""The operator's least-privilege RBAC: a ServiceAccount, a ClusterRole and its binding.

RULES is the single list; `python -m fleetmq.operator.rbac [--namespace NS]` prints the manifests,
operator/rbac.yaml holds them for namespace fleetmq-system, and the Helm chart's ClusterRole includes
charts/fleetmq/files/operator-rbac-rules.yaml (both written by `--write`; tests fail when either is stale).
Each rule says why it is there; a test runs the operator as this ServiceAccount to prove it is enough.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

NAME = "fleetmq-operator"
DEFAULT_NAMESPACE = "fleetmq-system"
RBAC_FILE = Path(__file__).resolve().parent / "rbac.yaml"
CHART_RULES_FILE = RBAC_FILE.parent.parent / "charts" / "fleetmq" / "files" / "operator-rbac-rules.yaml"

_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]

#: (why, rule)
RULES: list[tuple[str, dict[str, Any]]] = [
    (
        "watch the custom resources; kopf patches them (finalizer, last-handled annotations)",
        {
            "apiGroups": ["fleetmq.io"],
            "resources": ["brokerfleets", "mqttbridges", "mqttzones"],
            "verbs": ["get", "list", "watch", "patch", "update"],
        },
    ),
    (
        "status is patched explicitly",
        {
            "apiGroups": ["fleetmq.io"],
            "resources": ["brokerfleets/status", "mqttbridges/status", "mqttzones/status"],
            "verbs": ["get", "patch", "update"],
        },
    ),
    (
        "children carry blockOwnerDeletion owner references to their fleet",
        {"apiGroups": ["fleetmq.io"], "resources": ["brokerfleets/finalizers"], "verbs": ["update"]},
    ),
    (
        "children: server-side applied, watched for drift, pruned",
        {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": _WRITE},
    ),
    (
        "children: brokers and the managed Redis",
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": _WRITE},
    ),
    (
        "children: the Job that forms a managed Redis Cluster",
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _WRITE},
    ),
    (
        "children: disruption budgets of the brokers, Redis servers and sentinels",
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _WRITE},
    ),
    (
        "children: scraping config where Prometheus Operator is installed",
        {"apiGroups": ["monitoring.coreos.com"], "resources": ["servicemonitors"], "verbs": _WRITE},
    ),
    (
        "read the fleet's pods: containers that cannot run (image pull errors, crash loops) go to its status",
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    ),
    (
        "read the passwords of redis.secretRef (to reach the fleet's Redis for the pods' reports) and the "
        "MqttBridges' Secrets; create the managed Redis' password once; apply (patch) the fleet's bridge "
        "Secret, the copy of its bridges' Secrets the pods mount",
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]},
    ),
    (
        "Kubernetes Events for what the operator does",
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ),
    (
        "kopf: namespace globs in --namespace",
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ),
    (
        "kopf: finds out which resources the cluster serves",
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
    ),
    (
        "kopf peering: one active operator among replicas (--peering)",
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings", "kopfpeerings"],
            "verbs": ["get", "list", "watch", "patch", "create"],
        },
    ),
]


def manifests(namespace: str = DEFAULT_NAMESPACE, name: str = NAME) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "fleetmq"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": [rule for _, rule in RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def render_yaml(namespace: str = DEFAULT_NAMESPACE, name: str = NAME) -> str:
    head = "# Generated by `python -m fleetmq.operator.rbac --write` from operator/rbac.py: do not edit.\n"
    head += "".join(f"# - {why}\n" for why, _ in RULES)
    return head + "---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests(namespace, name))


def render_rules_yaml() -> str:
    """RULES as a YAML list, each rule under a comment saying why (the chart's ClusterRole rules)."""
    out = "# Generated by `python -m fleetmq.operator.rbac --write` from operator/rbac.py: do not edit.\n"
    for why, rule in RULES:
        out += f"# {why}\n" + yaml.safe_dump([rule], sort_keys=False, default_flow_style=None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetmq.operator.rbac", description=__doc__)
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="namespace of the ServiceAccount")
    p.add_argument("--name", default=NAME)
    p.add_argument(
        "--write", action="store_true", help="write rbac.yaml and the chart's rules file instead of printing"
    )
    args = p.parse_args(argv)
    text = render_yaml(args.namespace, args.name)
    if args.write:
        RBAC_FILE.write_text(text)
        CHART_RULES_FILE.write_text(render_rules_yaml())
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
