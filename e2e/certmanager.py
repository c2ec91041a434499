"""cert-manager in the e2e cluster, installed as its release manifest installs it: its CRDs, a namespace,
a ServiceAccount bound to the controller's ClusterRoles, and the controller as a Deployment. The controller
is the one scripts/certmanager.sh builds from cert-manager's Go module (its certificate, CA and SelfSigned
controllers; no webhook, no cainjector, no ACME), in a one-layer image made here, so no registry is needed.

    python -m e2e.certmanager DIR     build what is missing, write DIR/cert-manager.tar, print its path
                                      (e2e/run.sh adds it to the images every e2e cluster loads)
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests import kubeapi, realnode

if TYPE_CHECKING:
    from .conftest import Cluster

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "certmanager.sh"
NAMESPACE = "cert-manager"
NAME = "cert-manager"
BINARY = "cert-manager-controller"


def bin_dir(build: bool = True) -> Path:
    """The controller's folder in the cache (built first when missing and `build`)."""
    argv = ["bash", str(SCRIPT)] + ([] if build else ["--path"])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=1800).stdout
    return Path(out.strip().splitlines()[-1])


def version() -> str:
    return bin_dir(build=False).parent.name


def image() -> str:
    return f"fleetmq.local/cert-manager-controller:{version()}"


def crds() -> Path:
    """The folder of the CRDs of the version built (`kubectl apply --server-side -f` it)."""
    return bin_dir(build=False).parent / "crds"


def archive(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    binary = bin_dir() / BINARY
    return realnode.image_archive(
        dest / "cert-manager.tar", image(), {f"/{BINARY}": binary}, [f"/{BINARY}"], "1000:1000"
    )


def _rules(*rules: tuple[str, list[str], list[str]]) -> list[dict[str, Any]]:
    return [{"apiGroups": [g], "resources": r, "verbs": v} for g, r, v in rules]


READ = ["get", "list", "watch"]
SECRETS = ("", ["secrets"], [*READ, "create", "update", "delete", "patch"])
EVENTS = ("", ["events"], ["create", "patch"])
# The controller's ClusterRoles of cert-manager's chart (deploy/charts/cert-manager/templates/rbac.yaml), for
# the controllers this build runs: issuers, clusterissuers, certificates (with creating CertificateRequests,
# which the chart grants in its ingress-shim role), and approving requests.
CLUSTER_ROLES: dict[str, list[dict[str, Any]]] = {
    "issuers": _rules(
        ("cert-manager.io", ["issuers", "issuers/status"], ["update", "patch"]),
        ("cert-manager.io", ["issuers"], READ),
        SECRETS,
        EVENTS,
    ),
    "clusterissuers": _rules(
        ("cert-manager.io", ["clusterissuers", "clusterissuers/status"], ["update", "patch"]),
        ("cert-manager.io", ["clusterissuers"], READ),
        SECRETS,
        EVENTS,
    ),
    "certificates": _rules(
        (
            "cert-manager.io",
            ["certificates", "certificates/status", "certificaterequests", "certificaterequests/status"],
            ["update", "patch"],
        ),
        ("cert-manager.io", ["certificates", "certificaterequests", "clusterissuers", "issuers"], READ),
        ("cert-manager.io", ["certificates/finalizers", "certificaterequests/finalizers"], ["update"]),
        ("cert-manager.io", ["certificaterequests"], ["create", "delete"]),
        SECRETS,
        EVENTS,
    ),
    "approve:cert-manager-io": [
        {
            "apiGroups": ["cert-manager.io"],
            "resources": ["signers"],
            "verbs": ["approve"],
            "resourceNames": ["issuers.cert-manager.io/*", "clusterissuers.cert-manager.io/*"],
        }
    ],
}


def objects() -> list[dict[str, Any]]:
    """Everything but the CRDs. ClusterIssuers' Secrets live in its own namespace, as upstream's default."""
    rbac = "rbac.authorization.k8s.io/v1"
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "controller"}
    sa = {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
    ]
    for suffix, rules in CLUSTER_ROLES.items():
        name = f"{NAME}-controller-{suffix}"
        out.append({"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
        out.append({"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [sa]})  # fmt: skip
    container = {
        "name": "cert-manager-controller",
        "image": image(),
        "imagePullPolicy": "Never",
        "args": ["--v=2", f"--cluster-resource-namespace={NAMESPACE}"],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }  # fmt: skip
    pod = {
        "serviceAccountName": NAME,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    out.append({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    })  # fmt: skip
    return out


def install(c: Cluster) -> None:
    """CRDs, then the rest, then wait until the controller runs (its image was loaded with the others)."""
    c.kubectl("apply", "--server-side", "-f", str(crds()))
    kubeapi.wait_established(c.kubectl, ["certificates.cert-manager.io", "clusterissuers.cert-manager.io",
                                         "certificaterequests.cert-manager.io"])  # fmt: skip
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects()}))
    c.kubectl("rollout", "status", f"deployment/{NAME}", "-n", NAMESPACE, "--timeout=180s")


def ca_cluster_issuer(c: Cluster, name: str) -> bytes:
    """A ClusterIssuer `name` signing with a CA of its own, bootstrapped as cert-manager's docs do: a
    SelfSigned ClusterIssuer issues the CA's Certificate (its Secret in cert-manager's namespace), which the
    CA ClusterIssuer then signs with. Every field given: no webhook defaults them. Returns the CA's PEM."""
    from .conftest import wait_for

    key = {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never", "encoding": "PKCS1"}
    ca_cert = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
               "metadata": {"name": name, "namespace": NAMESPACE},
               "spec": {"isCA": True, "commonName": f"{name} CA", "secretName": name, "duration": "8760h",
                        "renewBefore": "720h", "privateKey": key,
                        "issuerRef": {"name": f"{name}-bootstrap", "kind": "ClusterIssuer",
                                      "group": "cert-manager.io"}}}  # fmt: skip
    items = [
        {"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": f"{name}-bootstrap"},
         "spec": {"selfSigned": {}}},
        ca_cert,
        {"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": name},
         "spec": {"ca": {"secretName": name}}},
    ]  # fmt: skip
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def ready() -> bool:
        issuer = c.get("clusterissuer", name, NAMESPACE) or {}  # (cluster-scoped: -n is ignored)
        conditions = (issuer.get("status") or {}).get("conditions") or []
        return any(x["type"] == "Ready" and x["status"] == "True" for x in conditions)

    wait_for(ready, timeout=120, msg=f"ClusterIssuer {name} Ready (its CA issued)")
    return base64.b64decode(c.get("secret", name, NAMESPACE)["data"]["tls.crt"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(archive(Path(sys.argv[1])))
