"""Every pod the operator creates (brokers, managed Redis, with TLS and users Secrets mounted) passes the
"restricted" Pod Security Standard, as enforced by the real kube-apiserver."""

from __future__ import annotations

import json

from fleetmq.operator import render

from .conftest import fleet, zone


def test_rendered_pods_are_admitted_under_restricted(control_plane, kube_namespace):
    control_plane.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    f = fleet(redis={"managed": True})
    f["metadata"] |= {"namespace": kube_namespace, "uid": "u-1", "generation": 1}
    z = zone(
        listeners=[{"name": "mqtts", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "tls"}}],
        authentication={"allowAnonymous": False, "usersSecretRef": {"name": "users"}},
    )
    z["metadata"] |= {
        "namespace": kube_namespace,
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    accepted, rejected = render.select_zones(f, [z])
    assert not rejected
    sets = [m for m in render.render(f, accepted).manifests if m["kind"] == "StatefulSet"]
    assert {s["metadata"]["name"] for s in sets} == {"edge", "edge-redis"}
    for sts in sets:
        template = sts["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": sts["metadata"]["name"] + "-0"},
               "spec": template["spec"]}  # fmt: skip
        out = control_plane.kubectl(
            "-n", kube_namespace, "apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        assert out.returncode == 0 and "violate" not in out.stderr, (sts["metadata"]["name"], out.stderr)
