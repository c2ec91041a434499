"""The operator's least-privilege RBAC: a ServiceAccount and the roles its scope needs.

RULES is the single list. An operator watching every namespace gets them all in one ClusterRole; one
watching given namespaces (`--watch NS`, the chart's operator.watchNamespaces) gets a Role with the
namespaced rules in each of them and a ClusterRole with only the cluster-scoped reads (CRDs, namespaces):
no Secret, Pod or StatefulSet outside its namespaces. `python -m fleetmq.operator.rbac [--namespace NS]
[--watch NS ...]` prints the manifests; operator/rbac.yaml holds the cluster-wide ones for namespace
fleetmq-system, and the Helm chart includes charts/fleetmq/files/operator-rbac-*.yaml
(all written by `--write`; tests fail when any is stale). Each rule says why it is there; tests run the
operator as these ServiceAccounts, in both scopes, to prove they are enough.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from . import crdgen

NAME = "fleetmq-operator"
DEFAULT_NAMESPACE = "fleetmq-system"
RBAC_FILE = Path(__file__).resolve().parent / "rbac.yaml"
_CHART_FILES = RBAC_FILE.parent.parent / "charts" / "fleetmq" / "files"
#: the chart's roles: every rule (watching all namespaces); else the cluster reads and the namespaced rules
CHART_RULES_FILES = {
    "all": _CHART_FILES / "operator-rbac-rules.yaml",
    "cluster": _CHART_FILES / "operator-rbac-cluster-rules.yaml",
    "namespaced": _CHART_FILES / "operator-rbac-namespaced-rules.yaml",
}

_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]

#: (why, rule)
RULES: list[tuple[str, dict[str, Any]]] = [
    (
        "watch the custom resources; kopf patches them (finalizer, last-handled annotations)",
        {
            "apiGroups": ["fleetmq.io"],
            "resources": ["brokerfleets", "mqttbridges", "mqttusers", "mqttzones"],
            "verbs": ["get", "list", "watch", "patch", "update"],
        },
    ),
    (
        "status is patched explicitly",
        {
            "apiGroups": ["fleetmq.io"],
            "resources": [
                "brokerfleets/status",
                "mqttbridges/status",
                "mqttusers/status",
                "mqttzones/status",
            ],
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
        "children: the managed Redis' NetworkPolicy (only its fleet's pods and the operator reach it)",
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _WRITE},
    ),
    (
        "children: scraping config where Prometheus Operator is installed",
        {"apiGroups": ["monitoring.coreos.com"], "resources": ["servicemonitors"], "verbs": _WRITE},
    ),
    (
        "children: the listeners' and MqttUsers' certificates where a cert-manager issuer is named",
        {"apiGroups": ["cert-manager.io"], "resources": ["certificates"], "verbs": _WRITE},
    ),
    (
        "read the fleet's pods: containers that cannot run (image pull errors, crash loops) go to its status; "
        "label them serving or not during a rollout (patch), so reconnecting clients land on updated pods; "
        "annotate them with the config hash (patch), so their kubelets bring a changed config at once",
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
    ),
    (
        "spec.autoscaling: step aside while a HorizontalPodAutoscaler targets the fleet (one owner of its scale)",
        {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["list"]},
    ),
    (
        "read the passwords of redis.secretRef (to reach the fleet's Redis for the pods' reports) and the "
        "MqttBridges' and MqttUsers' Secrets; create the managed Redis' password and MqttUsers' generated "
        "passwords once; apply (patch) the fleet's bridge Secret, the copy of its bridges' Secrets the pods "
        "mount, and its users Secret (the MqttUsers' password hashes); create the fleet's CA once and apply "
        "the certificates it signs (owned by their MqttZone or MqttUser, deleted with it)",
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]},
    ),
    (
        "Kubernetes Events for what the operator does; read (list) the StatefulSets' FailedCreate events: a pod "
        "template the API server refuses (a bad sidecar, volume or affinity) goes to the fleet's status",
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "list"]},
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
        "--manage-crds: bring the operator's own CRDs (by name) up to date at start (helm upgrade does not)",
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": sorted(crd["metadata"]["name"] for crd in crdgen.owned()),
            "verbs": ["patch"],
        },
    ),
    (
        "kopf peering: one active operator among replicas (--peering), in each watched namespace",
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["kopfpeerings"],
            "verbs": ["get", "list", "watch", "patch", "create"],
        },
    ),
    (
        "kopf peering of an operator watching every namespace",
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings"],
            "verbs": ["get", "list", "watch", "patch", "create"],
        },
    ),
]

#: resources that are not in a namespace: their rules stay in a ClusterRole whatever the scope
_CLUSTER_RESOURCES = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}
#: needed only by an operator watching every namespace
_ALL_NAMESPACES_ONLY = {"clusterkopfpeerings"}


def _cluster_scoped(rule: dict[str, Any]) -> bool:
    return set(rule["resources"]) <= _CLUSTER_RESOURCES


def cluster_rules(all_namespaces: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """The rules on cluster-scoped resources (with the reason of each)."""
    return [
        (why, rule)
        for why, rule in RULES
        if _cluster_scoped(rule) and (all_namespaces or not set(rule["resources"]) & _ALL_NAMESPACES_ONLY)
    ]


def namespaced_rules() -> list[tuple[str, dict[str, Any]]]:
    """The rules on resources in the namespaces the operator watches."""
    return [(why, rule) for why, rule in RULES if not _cluster_scoped(rule)]


def manifests(
    namespace: str = DEFAULT_NAMESPACE, name: str = NAME, watch: list[str] | None = None
) -> list[dict[str, Any]]:
    """The ServiceAccount `name` in `namespace` and its roles: one ClusterRole with every rule, or, with
    `watch`, the cluster-scoped reads in a ClusterRole and a Role with the rest in each watched namespace."""
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "fleetmq"}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    rbac_v1 = "rbac.authorization.k8s.io/v1"

    def role(
        kind: str, rules: list[tuple[str, dict[str, Any]]], ns: str | None = None
    ) -> list[dict[str, Any]]:
        meta: dict[str, Any] = {"name": name, "labels": labels} | ({"namespace": ns} if ns else {})
        return [
            {"apiVersion": rbac_v1, "kind": kind, "metadata": meta, "rules": [rule for _, rule in rules]},
            {
                "apiVersion": rbac_v1,
                "kind": f"{kind}Binding",
                "metadata": dict(meta),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                "subjects": [subject],
            },
        ]

    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        }
    ]
    if not watch:
        return out + role("ClusterRole", RULES)
    out += role("ClusterRole", cluster_rules(all_namespaces=False))
    for ns in watch:
        out += role("Role", namespaced_rules(), ns)
    return out


def render_yaml(namespace: str = DEFAULT_NAMESPACE, name: str = NAME, watch: list[str] | None = None) -> str:
    head = "# Generated by `python -m fleetmq.operator.rbac --write` from operator/rbac.py: do not edit.\n"
    head += "".join(f"# - {why}\n" for why, _ in RULES)
    return head + "---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests(namespace, name, watch))


def render_rules_yaml(rules: list[tuple[str, dict[str, Any]]]) -> str:
    """Rules as a YAML list, each under a comment saying why (the chart's roles include these files)."""
    out = "# Generated by `python -m fleetmq.operator.rbac --write` from operator/rbac.py: do not edit.\n"
    for why, rule in rules:
        out += f"# {why}\n" + yaml.safe_dump([rule], sort_keys=False, default_flow_style=None)
    return out


def chart_files() -> dict[Path, str]:
    """The chart's rule files (CHART_RULES_FILES) and what they hold."""
    return {
        CHART_RULES_FILES["all"]: render_rules_yaml(RULES),
        CHART_RULES_FILES["cluster"]: render_rules_yaml(cluster_rules(all_namespaces=False)),
        CHART_RULES_FILES["namespaced"]: render_rules_yaml(namespaced_rules()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetmq.operator.rbac", description=__doc__)
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="namespace of the ServiceAccount")
    p.add_argument("--name", default=NAME)
    p.add_argument(
        "--watch", action="append", metavar="NS", help="namespaces the operator watches (default: all)"
    )
    p.add_argument(
        "--write", action="store_true", help="write rbac.yaml and the chart's rules files instead of printing"
    )
    args = p.parse_args(argv)
    text = render_yaml(args.namespace, args.name, args.watch)
    if args.write:
        RBAC_FILE.write_text(render_yaml(args.namespace, args.name))
        for path, content in chart_files().items():
            path.write_text(content)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
