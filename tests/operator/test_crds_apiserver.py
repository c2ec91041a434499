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
        "user-cn-length", "user-fleet-required",
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
