"""The generated CRDs in a real kube-apiserver: defaults, kubectl explain, and bad specs refused."""

from __future__ import annotations

import json

import pytest

from .conftest import bridge, fleet, user, wait_for, zone

ONE_REDIS = "redis: set exactly one of managed: true, url, sentinel or cluster"


def test_explain_shows_the_broker_models_descriptions(k):
    # the apiserver publishes a new CRD's OpenAPI a moment after it is established
    out = wait_for(lambda: (o := k("explain", "mqttzone.spec.session.maxInflight", check=False).stdout)
                   and "Inflight Window length" in o and o, msg="kubectl explain")  # fmt: skip
    assert "FIELD: maxInflight <integer>" in out
    out = k("explain", "brokerfleet.spec.redis").stdout
    assert "managed" in out and "secretRef" in out


def test_bridge_defaults_and_columns(k):
    k.apply(bridge())
    b = k.get("mqttbridge", "cloud")
    assert b["spec"]["forwards"][0]["maxQos"] == 2 and b["spec"]["queue"]["overflow"] == "dropOldest"
    assert b["spec"]["reconnect"]["maxDelay"] == "120s" and b["spec"]["remote"]["transport"] == "tcp"
    header = k("get", "mqttbridges").stdout.splitlines()[0].split()
    assert header == ["NAME", "FLEET", "REMOTE", "CONNECTED", "LEADER", "QUEUE", "AGE"]


def test_defaults_are_filled_by_the_apiserver(k):
    k.apply(fleet())
    k.apply(zone(session={"maxInflight": 7}))
    z = k.get("mqttzone", "external")
    assert z["spec"]["session"]["maxInflight"] == 7
    assert z["spec"]["session"]["retryInterval"] == "30s"  # default of the broker's model
    assert z["spec"]["keepalive"]["backoff"] == 0.75
    assert z["spec"]["listeners"][0]["protocol"] == "tcp"
    assert z["spec"]["authentication"]["allowAnonymous"] is True
    f = k.get("brokerfleet", "edge")
    assert f["spec"]["metrics"]["port"] == 9100 and f["spec"]["terminationGracePeriodSeconds"] == 30
    header = k("get", "brokerfleets").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "REPLICAS", "ZONES", "CONNECTIONS", "AGE"]
    assert k("get", "mz").stdout.splitlines()[0].split()[:4] == ["NAME", "FLEET", "ACCEPTED", "APPLIED"]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (zone(session={"maxInflight": 70000}), "should be less than or equal to 65535"),
        (zone(session={"retryInterval": "soon"}), "spec.session.retryInterval"),
        (zone(listeners=[{"name": "m", "port": 1883, "protocol": "quic"}]), 'Unsupported value: "quic"'),
        (zone(listeners=[{"name": "m", "port": 8883, "protocol": "tls"}]), "a tls or wss listener needs tlsSecretRef"),
        (zone(listeners=[{"name": "m", "port": 1883}, {"name": "m", "port": 1884}]), "Duplicate value"),
        (zone(listeners=[{"name": "a", "port": 1883}, {"name": "b", "port": 1883}]), "listener ports must be unique"),
        (zone(listeners=[{"name": "Bad_Name", "port": 1883}]), "spec.listeners[0].name"),
        (zone(listeners=[{"name": "m", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"},
                          "peerCertAsUsername": "cn"}]), "spec.listeners[0].peerCertAsUsername: Invalid value"),
        (zone(listeners=[{"name": "m", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"},
                          "verifyPeer": True, "peerCertAsUsername": "dn"}]), 'Unsupported value: "dn"'),
        (zone(acl=[{"permission": "maybe", "filter": "#"}]), 'Unsupported value: "maybe"'),
        (fleet(redis={"managed": True, "url": "redis://x:6379/0"}), ONE_REDIS),
        (fleet(redis={"managed": False}), ONE_REDIS),
        (fleet(redis={"url": "redis://x:6379/0", "cluster": {"nodes": ["c:6379"]}}), ONE_REDIS),
        (fleet(replicas=-1), "should be greater than or equal to 0"),
        (fleet(evictionRate=-5), "spec.evictionRate: Invalid value: -5: spec.evictionRate in body should be greater than or equal to 0"),
        (fleet(redis={"managed": True, "mode": "quorum"}), 'Unsupported value: "quorum"'),
        (fleet(redis={"managed": True, "sentinels": 4}), "redis.sentinels must be odd"),
        (fleet(redis={"managed": True, "replicas": 0}), "redis.replicas must be at least 1 with mode sentinel"),
        (fleet(redis={"managed": True, "mode": "standalone", "replicas": 1}), "redis.replicas must be 0 with mode standalone"),
        (fleet(redis={"managed": True, "mode": "cluster", "shards": 2}), "spec.redis.shards: Invalid value: 2"),
        (fleet(redis={"managed": True, "waitReplicas": 3}), "redis.waitReplicas cannot exceed redis.replicas"),
        (fleet(redis={"managed": True, "secretRef": {"name": "pw"}}), "redis.secretRef is the password of an existing Redis"),
        (fleet(redis={"managed": True, "appendfsync": "no"}), 'Unsupported value: "no"'),
        (fleet(redis={"managed": True, "storage": "lots"}), "spec.redis.storage"),
        (fleet(redis={"sentinel": {"nodes": ["no-port"], "master": "m"}}), "spec.redis.sentinel.nodes[0]"),
        (fleet(redis={"managed": True, "resources": {"cpu": "a lot"}}), "spec.redis.resources.cpu"),
        (bridge(forwards=[{"filter": "up/#", "destination": "site/{x}"}]), "spec.forwards[0].destination"),
        (bridge(subscriptions=[{"filter": "d/#", "destination": "a/+/b"}]), "spec.subscriptions[0].destination"),
        (bridge(forwards=[]), "a bridge needs at least one forward or subscription"),
        (bridge(remote={"host": "h", "transport": "quic"}), 'Unsupported value: "quic"'),
        (bridge(remote={"host": "h", "mqttVersion": 3}), "spec.remote.mqttVersion"),
        (bridge(queue={"overflow": "dropSome"}), 'Unsupported value: "dropSome"'),
        (bridge(reconnect={"jitter": 2}), "spec.reconnect.jitter"),
        (bridge(forwards=[{"filter": "up/#", "maxQos": 3}]), "spec.forwards[0].maxQos"),
        (user(zones=[]), "spec.zones: Invalid value"),
        (user(zones=["Bad_Zone"]), "spec.zones[0]"),
        (user(zones=["a", "a"]), "spec.zones[1]: Duplicate value"),
        (user(username="a/b"), "spec.username: Invalid value"),
        (user(username="a:b"), "spec.username: Invalid value"),
        (user(acl=[{"permission": "maybe", "filter": "#"}]), "spec.acl[0].permission: Unsupported value"),
        (user(acl=[{"permission": "allow", "filter": ""}]), "spec.acl[0].filter"),
        (user(passwordSecretRef={"name": ""}), "spec.passwordSecretRef.name"),
        (user(generatePassword=False), "a user needs a password (passwordSecretRef or generatePassword) or a "
                                       "certificateCommonName"),
        (user(certificateCommonName="x" * 65), "spec.certificateCommonName: Too long"),
        (user(fleetRef=None), "spec.fleetRef: Required value"),
        (zone(authentication={"chain": [{"mechanism": "jwt", "algorithms": ["HS256"]}]}),
         "HS* algorithms need secretRef"),
        (zone(authentication={"chain": [{"mechanism": "jwt", "algorithms": ["RS256"]}]}),
         "RS*/ES* algorithms (the default) need publicKeyRef, jwksRef or jwksUrl"),
        (zone(authentication={"chain": [{"mechanism": "ldap"}]}), "spec.authentication.chain[0]"),
        (zone(authentication={"chain": [{"mechanism": "http", "url": "ftp://x"}]}),
         "spec.authentication.chain[0].url"),
        (zone(authentication={"chain": [{"mechanism": "http", "url": "http://a", "aclUrl": "ftp://x"}]}),
         "spec.authentication.chain[0].aclUrl"),
        (zone(listeners=[{"name": "m", "port": 1883, "allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"},
                                                                    "podSelector": {}}]}]),
         "set ipBlock, or podSelector and/or namespaceSelector"),
    ],
    ids=[
        "inflight-range", "duration-pattern", "protocol-enum", "tls-needs-secret", "listener-names-unique",
        "ports-unique", "listener-name-pattern", "cert-username-needs-verify-peer", "cert-username-enum",
        "acl-enum", "redis-both",
        "redis-neither", "redis-url-and-cluster", "replicas-range", "eviction-rate-range", "redis-mode-enum", "sentinels-odd",
        "sentinel-needs-replicas", "standalone-no-replicas", "shards-range", "wait-replicas-exist",
        "managed-no-secret-ref", "appendfsync-enum", "storage-quantity", "sentinel-node-address",
        "redis-resources-quantity", "bridge-placeholder", "bridge-wildcard-in-template", "bridge-no-traffic",
        "bridge-transport-enum", "bridge-mqtt-version", "bridge-overflow-enum", "bridge-jitter-range",
        "bridge-max-qos", "user-zones-required", "user-zone-name", "user-zones-unique", "user-username-slash",
        "user-username-colon", "user-acl-enum", "user-acl-filter", "user-secret-name", "user-no-credential",
        "user-cn-length", "user-fleet-required", "jwt-hs-needs-secret", "jwt-rs-needs-keys", "chain-mechanism",
        "http-url-scheme", "http-acl-url-scheme", "allow-from-peer",
    ],
)  # fmt: skip
def test_bad_specs_are_refused_with_a_useful_message(k, obj, message):
    out = k.apply(obj, check=False)
    assert out.returncode != 0, f"accepted: {obj}"
    assert message in out.stderr, out.stderr


def test_user_defaults_columns_and_explain(k):
    k.apply(user())
    u = k.get("mqttuser", "sensor")
    assert u["spec"]["generatePassword"] is True and u["spec"]["acl"] == []
    header = k("get", "mqttusers").stdout.splitlines()[0].split()
    assert header == ["NAME", "FLEET", "USERNAME", "ACCEPTED", "APPLIED", "AGE"]
    out = wait_for(lambda: (o := k("explain", "mqttuser.spec.certificateCommonName", check=False).stdout)
                   and "peerCertAsUsername" in o and o, msg="kubectl explain")  # fmt: skip
    assert "Common name of the client certificate" in out
    assert "matched before the zone's acl" in k("explain", "mqttuser.spec.acl").stdout
    assert "verified certificate" in k("explain", "mqttzone.spec.listeners.peerCertAsUsername").stdout
    # a zone refusing anonymous clients may now have only MqttUsers (no usersSecretRef)
    k.apply(zone(authentication={"allowAnonymous": False}))


def test_unknown_fields_are_refused_by_strict_validation(k):
    out = k("apply", "--validate=strict", "-f", "-", input=json.dumps(zone(sesion={})), check=False)
    assert out.returncode != 0 and 'unknown field "spec.sesion"' in out.stderr


def test_the_redis_topology_of_an_existing_fleet_cannot_change(k):
    """Sessions are not moved between Redis topologies: the API server refuses the change, naming the field."""
    k.apply(fleet(redis={"managed": True, "mode": "cluster"}))
    f = k.get("brokerfleet", "edge")
    redis = f["spec"]["redis"]
    assert (redis["mode"], redis["shards"], redis["storage"], redis["appendfsync"]) == (
        "cluster",
        3,
        "1Gi",
        "everysec",
    )
    assert redis["resources"] == {"cpu": "250m", "memory": "256Mi"}
    assert redis["sentinelResources"] == {"cpu": "50m", "memory": "64Mi"}
    assert "replicas" not in redis and "waitReplicas" not in redis  # they follow the mode (the operator's)
    refused = [
        ({"managed": True, "mode": "sentinel"}, "redis.mode cannot change on an existing fleet: moving sessions "
         "between Redis topologies is not supported; create a new fleet"),
        ({"managed": True, "mode": "standalone"}, "redis.mode cannot change on an existing fleet"),
        ({"managed": False, "url": "redis://db:6379/0"}, "redis.managed cannot change on an existing fleet"),
        ({"managed": True, "mode": "cluster", "shards": 4}, "redis.shards and redis.replicas cannot change"),
        ({"managed": True, "mode": "cluster", "replicas": 2}, "redis.shards and redis.replicas cannot change"),
        ({"managed": True, "mode": "cluster", "storage": "2Gi"}, "redis.storage and redis.storageClassName cannot"),
        ({"managed": True, "mode": "cluster", "storageClassName": "fast"}, "redis.storage and redis.storageClassName"),
    ]  # fmt: skip
    for redis_spec, message in refused:
        out = k.apply(fleet(redis=redis_spec), check=False)
        assert out.returncode != 0 and message in out.stderr, (redis_spec, out.stderr)
        assert "spec.redis" in out.stderr
    # what can change: resources, the image, the fsync policy, waitReplicas within the replicas
    k.apply(fleet(redis={"managed": True, "mode": "cluster", "replicas": 1, "appendfsync": "always",
                         "resources": {"cpu": "1", "memory": "1Gi"}, "waitReplicas": 1}))  # fmt: skip
    assert k.get("brokerfleet", "edge")["spec"]["redis"]["appendfsync"] == "always"


def test_sentinel_fleet_may_change_its_replicas_and_sentinels_and_an_existing_redis_its_address(k):
    k.apply(fleet(name="a", redis={"managed": True}))
    k.apply(fleet(name="a", redis={"managed": True, "replicas": 3, "sentinels": 5}))
    assert k.get("brokerfleet", "a")["spec"]["redis"]["sentinels"] == 5
    k.apply(fleet(name="b", redis={"url": "redis://db:6379/0"}))
    k.apply(fleet(name="b", redis={"sentinel": {"nodes": ["s1:26379", "s2:26379"], "master": "m"}}))
    k.apply(fleet(name="b", redis={"cluster": {"nodes": ["c1:6379"]}, "secretRef": {"name": "pw"}}))
    # a development fleet without persistent volumes
    k.apply(fleet(name="c", redis={"managed": True, "mode": "standalone", "storage": ""}))
    assert k.get("brokerfleet", "c")["spec"]["redis"]["storage"] == ""
    k.apply(
        fleet(name="c", redis={"managed": True, "mode": "standalone", "storage": "", "image": "redis:7.2"})
    )


# ------------------------------------------------------------- pods and Services the way the cluster needs them
FULL_POD = {
    "labels": {"sidecar.istio.io/inject": "true"},
    "annotations": {"vault.hashicorp.com/agent-inject": "true"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mqtt", "effect": "NoSchedule"},
                    {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mqtt"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "DoNotSchedule", "minDomains": 2}],
    "priorityClassName": "mqtt-critical",
    "serviceAccountName": "edge-brokers",
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "TZ", "value": "UTC"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "envFrom": [{"secretRef": {"name": "extra"}, "prefix": "X_"}],
    "volumes": [{"name": "logs", "emptyDir": {}}],
    "volumeMounts": [{"name": "logs", "mountPath": "/var/log/fleetmq"}],
    "sidecars": [{"name": "shipper", "image": "fluent/fluent-bit:3", "args": ["-c", "/x"]}],
    "initContainers": [{"name": "wait", "image": "busybox:1", "restartPolicy": "Always"}],
}  # fmt: skip
LB = {"type": "LoadBalancer", "nodePort": 31883, "annotations": {"external-dns.alpha.kubernetes.io/hostname": "mq"},
      "loadBalancerIP": "203.0.113.7", "loadBalancerSourceRanges": ["10.0.0.0/8", "2001:db8::/32"],
      "externalTrafficPolicy": "Local"}  # fmt: skip


def test_pod_and_service_fields_are_kept_as_given_and_explained(k):
    k.apply(fleet(pod=FULL_POD, redis={"managed": True, "pod": {"tolerations": [{"key": "redis", "operator": "Exists"}]},
                                       "sentinelPod": {"priorityClassName": "quorum"}}))  # fmt: skip
    k.apply(zone(listeners=[{"name": "mqtt", "port": 1883, "service": LB}]))
    spec = k.get("brokerfleet", "edge")["spec"]
    assert spec["pod"] == FULL_POD  # nothing pruned (the deep Kubernetes types are kept), no default added
    assert spec["redis"]["setupResources"] == {"cpu": "50m", "memory": "64Mi"}
    assert k.get("mqttzone", "external")["spec"]["listeners"][0]["service"] == LB
    out = wait_for(lambda: (o := k("explain", "brokerfleet.spec.pod.affinity", check=False).stdout)
                   and "replaces the preset" in o and o, msg="kubectl explain")  # fmt: skip
    assert "podAntiAffinity" in out
    out = k("explain", "mqttzone.spec.listeners.service.nodePort").stdout
    assert "NodePort or LoadBalancer" in out
    out = k("explain", "brokerfleet.spec.redis.sentinelPod").stdout
    assert "instead of redis.pod" in out


def _pod(**pod):
    return fleet(pod=pod)


def _listener(**service):
    return zone(listeners=[{"name": "mqtt", "port": 1883, "service": service}])


@pytest.mark.parametrize(
    ("obj", "path", "message"),
    [
        (_pod(tolerations=[{"key": "a", "effect": "NoRun"}]), "spec.pod.tolerations[0].effect", 'Unsupported value: "NoRun"'),
        (_pod(tolerations=[{"key": "a", "operator": "Exists", "value": "b"}]), "spec.pod.tolerations[0]", "a toleration with operator Exists has no value"),
        (_pod(tolerations=[{"value": "b"}]), "spec.pod.tolerations[0]", "a toleration without key needs operator Exists"),
        (_pod(tolerations=[{"key": "a", "tolerationSeconds": 5}]), "spec.pod.tolerations[0]", "tolerationSeconds needs effect NoExecute"),
        (_pod(tolerations=[{"key": "a b"}]), "spec.pod.tolerations[0].key", "should match"),
        (_pod(topologySpreadConstraints=[{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]), "spec.pod.topologySpreadConstraints[0].maxSkew", "greater than or equal to 1"),
        (_pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "Maybe"}]), "spec.pod.topologySpreadConstraints[0].whenUnsatisfiable", 'Unsupported value: "Maybe"'),
        (_pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z"}]), "spec.pod.topologySpreadConstraints[0].whenUnsatisfiable", "Required value"),
        (_pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}]), "spec.pod.topologySpreadConstraints[0]", "minDomains needs whenUnsatisfiable DoNotSchedule"),
        (_pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "ScheduleAnyway"}] * 2), "spec.pod.topologySpreadConstraints", "one per topologyKey and whenUnsatisfiable"),
        (_pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]), "spec.pod.topologySpreadConstraints[0].labelSelector.matchExpressions[0]", "In and NotIn need values"),
        (_pod(labels={"app.kubernetes.io/instance": "other"}), "spec.pod.labels", "labels are the operator's (its selectors)"),
        (_pod(labels={"fleetmq.io/fleet": "other"}), "spec.pod.labels", "labels are the operator's"),
        (_pod(labels={"team": "not a value"}), "spec.pod.labels.team", "should match"),
        (_pod(labels={"bad key!": "x"}), "spec.pod.labels", "keys are [DNS subdomain/]name"),
        (_pod(annotations={"fleetmq.io/restart-hash": "x"}), "spec.pod.annotations", "fleetmq.io/ annotations are the operator's"),
        (_pod(serviceAccountName="Edge_Brokers"), "spec.pod.serviceAccountName", "should match"),
        (_pod(priorityClassName="-high"), "spec.pod.priorityClassName", "should match"),
        (_pod(imagePullSecrets=[{}]), "spec.pod.imagePullSecrets[0].name", "Required value"),
        (_pod(env=[{"name": "1X", "value": "v"}]), "spec.pod.env[0].name", "should match"),
        (_pod(env=[{"name": "X", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]), "spec.pod.env[0]", "an env entry has value or valueFrom, not both"),
        (_pod(env=[{"name": "POD_NAME", "value": "v"}]), "spec.pod.env", "POD_NAME are the operator's variables"),
        (_pod(env=[{"name": "X", "value": "1"}, {"name": "X", "value": "2"}]), "spec.pod.env[1]", "Duplicate value"),
        (_pod(envFrom=[{"prefix": "X_"}]), "spec.pod.envFrom[0]", "set exactly one of configMapRef or secretRef"),
        (_pod(envFrom=[{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]), "spec.pod.envFrom[0]", "set exactly one of configMapRef or secretRef"),
        (_pod(volumes=[{"emptyDir": {}}]), "spec.pod.volumes[0].name", "Required value"),
        (_pod(volumes=[{"name": "Logs", "emptyDir": {}}]), "spec.pod.volumes[0].name", "should match"),
        (_pod(volumes=[{"name": "tls-3", "emptyDir": {}}]), "spec.pod.volumes", "tls-N and users-N are the operator's volumes"),
        (_pod(volumes=[{"name": "v", "emptyDir": {}}], volumeMounts=[{"name": "w", "mountPath": "/w"}]), "spec.pod", "each names a volume of pod.volumes"),
        (_pod(volumes=[{"name": "v", "emptyDir": {}}], volumeMounts=[{"name": "v", "mountPath": "/etc/fleetmq/x"}]), "spec.pod.volumeMounts", "/etc/fleetmq and below are the operator's mounts"),
        (_pod(volumes=[{"name": "v", "emptyDir": {}}], volumeMounts=[{"name": "v", "mountPath": "relative"}]), "spec.pod.volumeMounts[0].mountPath", "should match"),
        (_pod(sidecars=[{"name": "shipper"}]), "spec.pod.sidecars[0].image", "Required value"),
        (_pod(sidecars=[{"name": "broker", "image": "x"}]), "spec.pod.sidecars", "broker are the operator's containers"),
        (_pod(initContainers=[{"image": "x"}]), "spec.pod.initContainers[0].name", "Required value"),
        (fleet(redis={"managed": True, "pod": {"sidecars": [{"name": "redis", "image": "x"}]}}), "spec.redis.pod.sidecars", "redis, sentinel and create are the operator's containers"),
        (fleet(redis={"managed": True, "sentinelPod": {"env": [{"name": "REDIS_X", "value": "1"}]}}), "spec.redis.sentinelPod.env", "REDIS_* and SENTINEL_* are the operator's variables"),
        (fleet(redis={"managed": True, "pod": {"volumes": [{"name": "data", "emptyDir": {}}]}}), "spec.redis.pod.volumes", "scripts, auth, conf and data are the operator's volumes"),
        (fleet(redis={"managed": True, "setupResources": {"cpu": "lots"}}), "spec.redis.setupResources.cpu", "should match"),
        (fleet(disruption={"maxUnavailable": 1, "minAvailable": 2}), "spec.disruption", "set maxUnavailable or minAvailable, not both"),
        (fleet(disruption={"minAvailable": "half"}), "spec.disruption.minAvailable", "should match"),
        (fleet(disruption={"maxUnavailable": -1}), "spec.disruption.maxUnavailable", "greater than or equal to 0"),
        (fleet(rollout={"progressDeadline": 5}), "spec.rollout.progressDeadline", "greater than or equal to 10"),
        (_listener(type="ExternalName"), "spec.listeners[0].service.type", 'Unsupported value: "ExternalName"'),
        (_listener(nodePort=31883), "spec.listeners[0].service", "service.nodePort needs service.type NodePort or LoadBalancer"),
        (_listener(type="ClusterIP", nodePort=31883), "spec.listeners[0].service", "service.nodePort needs service.type NodePort or LoadBalancer"),
        (_listener(type="NodePort", nodePort=70000), "spec.listeners[0].service.nodePort", "less than or equal to 65535"),
        (_listener(type="NodePort", loadBalancerSourceRanges=["10.0.0.0/8"]), "spec.listeners[0].service", "need service.type LoadBalancer"),
        (_listener(type="LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/33"]), "spec.listeners[0].service.loadBalancerSourceRanges", "loadBalancerSourceRanges are CIDRs"),
        (_listener(type="LoadBalancer", loadBalancerIP="mq.example.com"), "spec.listeners[0].service.loadBalancerIP", "loadBalancerIP must be an IP address"),
        (_listener(type="LoadBalancer", externalTrafficPolicy="Nearest"), "spec.listeners[0].service.externalTrafficPolicy", 'Unsupported value: "Nearest"'),
        (_listener(externalTrafficPolicy="Local"), "spec.listeners[0].service", "externalTrafficPolicy needs service.type NodePort or LoadBalancer"),
        (zone(listeners=[{"name": "a", "port": 1883, "service": {"type": "NodePort", "nodePort": 31000}},
                         {"name": "b", "port": 1884, "service": {"type": "NodePort", "nodePort": 31000}}]), "spec.listeners", "listener node ports must be unique"),
    ],
)  # fmt: skip
def test_bad_pod_and_service_values_are_refused_naming_the_field(k, obj, path, message):
    out = k.apply(obj, check=False)
    assert out.returncode != 0, f"accepted: {obj}"
    assert f"{path}:" in out.stderr and message in out.stderr, out.stderr
