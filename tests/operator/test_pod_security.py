"""Every pod the operator creates (brokers, the managed Redis' servers, sentinels and cluster Job in each
mode, with TLS, users and password Secrets mounted) passes the "restricted" Pod Security Standard, as
enforced by the real kube-apiserver."""

from __future__ import annotations

import json

import pytest
from fleetmq.operator import render

from .conftest import fleet, zone

RESTRICTED = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
#: what a platform team adds (spec.pod, spec.redis.pod): none of it takes the pods out of "restricted"
TEMPLATE = {
    "labels": {"team": "iot"},
    "annotations": {"example.com/inject": "true"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "TZ", "value": "UTC"}],
    "envFrom": [{"configMapRef": {"name": "extra", "optional": True}}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "sidecars": [{"name": "shipper", "image": "busybox:1", "securityContext": RESTRICTED}],
    "initContainers": [{"name": "proxy", "image": "busybox:1", "restartPolicy": "Always", "securityContext": RESTRICTED}],
}  # fmt: skip


@pytest.mark.parametrize("templates", [False, True], ids=["defaults", "pod-templates"])
@pytest.mark.parametrize("mode", ["sentinel", "cluster", "standalone"])
def test_rendered_pods_are_admitted_under_restricted(control_plane, kube_namespace, mode, templates):
    control_plane.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    f = fleet(redis={"managed": True, "mode": mode})
    if templates:
        f = fleet(redis={"managed": True, "mode": mode, "pod": TEMPLATE}, pod=TEMPLATE)
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
    accepted, rejected = render.select_zones(render.Fleet.parse(f), [z])
    assert not rejected
    sets = [
        m
        for m in render.render(render.Fleet.parse(f), accepted).manifests
        if m["kind"] in ("StatefulSet", "Job")
    ]
    expected = {"edge", "edge-redis"} | ({"edge-redis-sentinel"} if mode == "sentinel" else set())
    assert {s["metadata"]["name"] for s in sets if s["kind"] == "StatefulSet"} == expected
    assert len(sets) == len(expected) + (mode == "cluster")  # the Job forming the cluster
    for sts in sets:
        name = sts["metadata"]["name"] + "-0"
        spec = dict(sts["spec"]["template"]["spec"])
        claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
        # what the StatefulSet controller adds for each claim template
        spec["volumes"] = [*spec.get("volumes", []),
                           *({"name": c, "persistentVolumeClaim": {"claimName": f"{c}-{name}"}} for c in claims)]  # fmt: skip
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        out = control_plane.kubectl(
            "-n", kube_namespace, "apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        assert out.returncode == 0 and "violate" not in out.stderr, (name, out.stderr)
        if templates:  # what the templates add is in the pod that was admitted
            assert spec["tolerations"] == TEMPLATE["tolerations"], name
            assert spec["initContainers"] == TEMPLATE["initContainers"], name
