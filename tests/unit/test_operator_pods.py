"""Pods and Services the way the cluster needs them: spec.pod, spec.redis.pod / sentinelPod and a listener's
service, rendered over what the operator sets, never replacing the operator's own names."""

from __future__ import annotations

import re

import pytest
from fleetmq.operator import crdgen, crds, render

from .operator_support import broker_sts, by_kind, fleet, rendered, zone

POD = {
    "labels": {"sidecar.istio.io/inject": "true", "team": "iot"},
    "annotations": {"vault.hashicorp.com/agent-inject": "true"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "mqtt", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 30},
    ],
    "priorityClassName": "mqtt-critical",
    "serviceAccountName": "edge-brokers",
    "automountServiceAccountToken": True,
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "TZ", "value": "UTC"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "envFrom": [{"configMapRef": {"name": "extra"}, "prefix": "X_"}],
    "volumes": [{"name": "logs", "emptyDir": {"sizeLimit": "1Gi"}}],
    "volumeMounts": [{"name": "logs", "mountPath": "/var/log/fleetmq"}],
    "sidecars": [{"name": "shipper", "image": "fluent/fluent-bit:3",
                  "volumeMounts": [{"name": "logs", "mountPath": "/logs", "readOnly": True}]}],
    "initContainers": [{"name": "wait", "image": "busybox:1", "command": ["true"]}],
}  # fmt: skip


def test_defaults_render_no_template_fields():
    pod = broker_sts(rendered(fleet(), zone("external")))["spec"]["template"]
    for key in (
        "tolerations",
        "priorityClassName",
        "serviceAccountName",
        "imagePullSecrets",
        "initContainers",
    ):
        assert key not in pod["spec"], key
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert [c["name"] for c in pod["spec"]["containers"]] == ["broker"]
    assert set(pod["metadata"]["annotations"]) == {render.A_RESTART_HASH}


def test_pod_template_reaches_the_broker_pods_next_to_what_the_operator_sets():
    plain = broker_sts(rendered(fleet(), zone("external")))["spec"]["template"]
    tpl = broker_sts(rendered(fleet(pod=POD), zone("external")))["spec"]["template"]
    meta, spec = tpl["metadata"], tpl["spec"]
    assert meta["labels"] == {**POD["labels"], **plain["metadata"]["labels"]}
    assert meta["annotations"] == {**POD["annotations"], **plain["metadata"]["annotations"]}
    assert spec["tolerations"] == POD["tolerations"]
    assert spec["priorityClassName"] == "mqtt-critical" and spec["serviceAccountName"] == "edge-brokers"
    assert spec["automountServiceAccountToken"] is True
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["volumes"] == [*plain["spec"]["volumes"], *POD["volumes"]]
    assert spec["initContainers"] == POD["initContainers"]
    broker, shipper = spec["containers"]
    assert shipper == POD["sidecars"][0]  # as given: its securityContext is the user's
    before = plain["spec"]["containers"][0]
    assert broker["env"] == [*before["env"], *POD["env"]]  # POD_NAME first: $(POD_NAME) args need it
    assert broker["envFrom"] == POD["envFrom"]
    assert broker["volumeMounts"] == [*before["volumeMounts"], *POD["volumeMounts"]]
    assert broker["securityContext"] == before["securityContext"] == render.RESTRICTED_CONTAINER
    assert spec["securityContext"] == plain["spec"]["securityContext"]
    # what the template does not touch stays as it was
    assert spec["affinity"] == plain["spec"]["affinity"]
    assert spec["topologySpreadConstraints"] == plain["spec"]["topologySpreadConstraints"]


def test_affinity_and_topology_spread_replace_the_preset():
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mqtt"]}]}]}}  # fmt: skip
    f = fleet(
        scheduling={"antiAffinity": "required", "nodeSelector": {"disk": "ssd"}},
        pod={
            "affinity": {"nodeAffinity": node_affinity},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"},
                {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                 "labelSelector": {"matchLabels": {"team": "iot"}}, "nodeTaintsPolicy": "Honor"},
            ],
        },
    )  # fmt: skip
    spec = broker_sts(rendered(f, zone("external")))["spec"]["template"]["spec"]
    assert spec["affinity"] == {"nodeAffinity": node_affinity}  # no podAntiAffinity left from the preset
    assert spec["nodeSelector"] == {"disk": "ssd"}  # scheduling.nodeSelector still applies
    own = {"matchLabels": render.selector_labels("edge")}
    assert spec["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": own},
        {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"team": "iot"}}, "nodeTaintsPolicy": "Honor"},
    ]  # fmt: skip
    # set empty: none at all
    spec = broker_sts(
        rendered(fleet(pod={"affinity": {}, "topologySpreadConstraints": []}), zone("external"))
    )
    assert "affinity" not in spec["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in spec["spec"]["template"]["spec"]


def _redis_sets(r: render.Rendered) -> dict[str, dict]:
    return {m["metadata"]["labels"][render.L_COMPONENT]: m for m in render.store_workloads(r.manifests)}


def test_redis_pod_reaches_servers_sentinels_and_the_cluster_job_but_sidecars_never_the_job():
    redis_pod = {"tolerations": [{"key": "redis", "operator": "Exists"}], "labels": {"team": "iot"},
                 "sidecars": [{"name": "exporter", "image": "oliver006/redis_exporter:v1"}],
                 "env": [{"name": "TZ", "value": "UTC"}]}  # fmt: skip
    r = rendered(fleet(redis={"managed": True, "pod": redis_pod}), zone("external"))
    sets = _redis_sets(r)
    for component in ("redis", "redis-sentinel"):
        tpl = sets[component]["spec"]["template"]
        assert tpl["spec"]["tolerations"] == redis_pod["tolerations"], component
        assert tpl["metadata"]["labels"]["team"] == "iot"
        assert [c["name"] for c in tpl["spec"]["containers"]][1:] == ["exporter"]
        assert tpl["spec"]["containers"][0]["env"][-1] == {"name": "TZ", "value": "UTC"}
    # sentinelPod replaces redis.pod for the sentinels only
    sentinel_pod = {"priorityClassName": "quorum"}
    r = rendered(
        fleet(redis={"managed": True, "pod": redis_pod, "sentinelPod": sentinel_pod}), zone("external")
    )
    sets = _redis_sets(r)
    sentinel = sets["redis-sentinel"]["spec"]["template"]["spec"]
    assert sentinel["priorityClassName"] == "quorum" and "tolerations" not in sentinel
    assert [c["name"] for c in sentinel["containers"]] == ["sentinel"]
    assert sets["redis"]["spec"]["template"]["spec"]["tolerations"] == redis_pod["tolerations"]
    # the Job forming a cluster: tolerations and the rest, no sidecar (it would never end), its resources
    r = rendered(
        fleet(
            redis={"managed": True, "mode": "cluster", "pod": redis_pod, "setupResources": {"cpu": "100m"}}
        ),
        zone("external"),
    )
    job = _redis_sets(r)["redis-setup"]["spec"]["template"]["spec"]
    assert job["tolerations"] == redis_pod["tolerations"]
    (create,) = job["containers"]
    assert create["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                   "limits": {"cpu": "100m", "memory": "64Mi"}}  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"volumes": [{"name": "tls-0", "emptyDir": {}}]}, "spec.pod.volumes: tls-0 is a volume"),
        ({"volumes": [{"name": "config", "emptyDir": {}}]}, "spec.pod.volumes: config is a volume"),
        ({"env": [{"name": "POD_NAME", "value": "x"}]}, "spec.pod.env: POD_NAME is a variable"),
        ({"sidecars": [{"name": "broker", "image": "x"}]}, "spec.pod.sidecars: broker is a container"),
        ({"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc/fleetmq"}]},
         "spec.pod.volumeMounts: /etc/fleetmq is a mount path"),
        ({"labels": {"app.kubernetes.io/instance": "other"}}, "spec.pod: app.kubernetes.io/instance are the operator's"),
        ({"annotations": {render.A_RESTART_HASH: "x"}}, "spec.pod: fleetmq.io/restart-hash are the operator's"),
    ],
)  # fmt: skip
def test_the_operators_own_names_are_refused_naming_the_field(pod, message):
    """The CRD refuses these first (CEL); rendering refuses them too, names made at render time included."""
    z = zone(
        "external", listeners=[{"name": "s", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"}}]
    )
    with pytest.raises(render.RenderError, match=re.escape(message)):
        rendered(fleet(pod=pod), z)


def test_redis_names_are_refused_naming_redis_pod_or_sentinel_pod():
    with pytest.raises(render.RenderError, match=re.escape("spec.redis.sentinelPod.sidecars: sentinel is a")):
        rendered(fleet(redis={"managed": True, "sentinelPod": {"sidecars": [{"name": "sentinel", "image": "x"}]}}),
                 zone("external"))  # fmt: skip
    with pytest.raises(render.RenderError, match=re.escape("spec.redis.pod.volumes: data is a volume")):
        rendered(fleet(redis={"managed": True, "mode": "standalone", "storage": "",
                              "pod": {"volumes": [{"name": "data", "emptyDir": {}}]}}), zone("external"))  # fmt: skip


def _names(pod: dict) -> dict[str, set[str]]:
    containers = pod["containers"]
    return {
        "containers": {c["name"] for c in containers},
        "volumes": {v["name"] for v in pod.get("volumes", [])},
        "env": {e["name"] for c in containers for e in c.get("env", [])},
        "mounts": {m["mountPath"] for c in containers for m in c.get("volumeMounts", [])},
    }


@pytest.mark.parametrize("mode", ["sentinel", "cluster", "standalone"])
def test_the_crds_reserved_names_cover_every_name_the_operators_pods_use(mode):
    """The CEL rules refuse what rendering would: checked against every pod the operator renders."""
    f = fleet(redis={"managed": True, "mode": mode, "storage": "" if mode == "standalone" else "1Gi"})
    z = zone("external", listeners=[{"name": "s", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"}}],
             authentication={"allowAnonymous": False, "usersSecretRef": {"name": "u"}})  # fmt: skip
    r = rendered(f, z)
    ext = fleet(redis={"sentinel": {"nodes": ["s:26379"], "master": "m", "secretRef": {"name": "sp"}},
                       "secretRef": {"name": "p"}})  # fmt: skip
    pods = [(broker_sts(r)["spec"]["template"]["spec"], crds.BROKER_NAMES),
            (broker_sts(rendered(ext, z))["spec"]["template"]["spec"], crds.BROKER_NAMES)]  # fmt: skip
    pods += [(m["spec"]["template"]["spec"], crds.REDIS_NAMES) for m in render.store_workloads(r.manifests)]
    for pod, reserved in pods:
        for kind, names in _names(pod).items():
            regex = getattr(reserved, kind).regex
            for name in names:
                assert re.match(regex, name), f"{kind} {name} is not reserved by {regex}"


def test_listener_services_take_the_fleets_defaults_and_their_own_settings():
    f = fleet(service={"type": "ClusterIP", "annotations": {"a": "fleet", "b": "fleet"}})
    z = zone("external", listeners=[
        {"name": "mqtt", "port": 1883},
        {"name": "mqtts", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"},
         "service": {"type": "LoadBalancer", "nodePort": 30883, "annotations": {"b": "listener"},
                     "loadBalancerIP": "203.0.113.7", "loadBalancerSourceRanges": ["10.0.0.0/8"],
                     "externalTrafficPolicy": "Local"}},
        {"name": "ws", "port": 8083, "protocol": "ws", "service": {"type": "NodePort"}},
    ])  # fmt: skip
    services = {s["metadata"]["name"]: s for s in by_kind(rendered(f, z), "Service")}
    plain, lb, ws = (
        services["edge-external-mqtt"],
        services["edge-external-mqtts"],
        services["edge-external-ws"],
    )
    assert plain["spec"] == {"type": "ClusterIP", "selector": {**render.selector_labels("edge"), render.L_SERVING: "true"},
                             "ports": [{"name": "mqtt", "port": 1883, "targetPort": 1883, "protocol": "TCP"}]}  # fmt: skip
    assert plain["metadata"]["annotations"] == {"a": "fleet", "b": "fleet"}
    assert lb["metadata"]["annotations"] == {"a": "fleet", "b": "listener"}
    assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["ports"][0]["nodePort"] == 30883
    assert lb["spec"]["loadBalancerIP"] == "203.0.113.7"
    assert lb["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert lb["spec"]["externalTrafficPolicy"] == "Local"
    # a node port the cluster picks is the cluster's: not in what the operator applies
    assert ws["spec"]["type"] == "NodePort" and "nodePort" not in ws["spec"]["ports"][0]


def test_the_crd_keeps_deep_kubernetes_types_but_checks_their_required_keys():
    pod = crdgen.crds()["fleetmq.io_brokerfleets.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod = pod["properties"]["spec"]["properties"]["pod"]["properties"]
    sidecar = pod["sidecars"]["items"]
    assert sidecar["x-kubernetes-preserve-unknown-fields"] is True and sidecar["required"] == [
        "name",
        "image",
    ]
    assert pod["volumes"]["items"]["required"] == ["name"]
    assert pod["affinity"]["properties"]["nodeAffinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert pod["sidecars"]["x-kubernetes-list-map-keys"] == ["name"]
    assert pod["tolerations"]["items"]["properties"]["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule",
                                                                           "NoExecute"]  # fmt: skip
