"""Rendering a BrokerFleet and its MqttZones: the broker config, the children, what restarts pods."""

from __future__ import annotations

import json

import yaml
from fleetmq.broker.config import BrokerConfig
from fleetmq.operator import render
from fleetmq.operator.render import Rejection
from fleetmq.operator.status import Observed, fleet_status, zone_status

from .operator_support import broker_sts, by_kind, fleet, rendered, zone


def test_config_is_the_broker_contract_and_hash_matches_what_brokers_compute():
    f = fleet(redis={"url": "redis://10.0.0.5:6379/0"})
    z = zone("external", session={"maxInflight": 7, "retryInterval": "10s"},
             acl=[{"permission": "deny", "action": "subscribe", "filter": "secret/#"}])  # fmt: skip
    r = rendered(f, z)
    cm = by_kind(r, "ConfigMap")[0]
    text = cm["data"][render.CONFIG_KEY]
    cfg = BrokerConfig.model_validate(yaml.safe_load(text) | {"node_id": "edge-1"})
    assert cfg.zones["external"].max_inflight == 7
    assert cfg.zones["external"].retry_interval == 10.0
    assert cfg.zones["external"].acl[0].filter == "secret/#"
    assert [(lst.name, lst.bind, lst.zone) for lst in cfg.listeners] == [
        ("external/mqtt", "0.0.0.0:1883", "external")
    ]
    assert cfg.store.url == "redis://10.0.0.5:6379/0"
    assert cfg.event_log.fleet == "edge"  # the pipeline finds the fleet's stream by its name
    assert cfg.config_hash() == r.config_hash == cm["metadata"]["annotations"][render.A_CONFIG_HASH]
    assert json.loads(cm["metadata"]["annotations"][render.A_ZONE_GENERATIONS]) == {"external": 1}


def test_every_child_is_owned_by_the_fleet_and_labelled():
    r = rendered(fleet(redis={"managed": True}), zone("external"), service_monitor=True)
    kinds = sorted(m["kind"] for m in r.manifests)
    # brokers: config, bridge and users Secrets, StatefulSet, headless Service, zone Service, budget,
    # monitor; the managed Redis (sentinel mode): its script, servers and sentinels with a Service and a
    # budget each, and a NetworkPolicy
    assert kinds == sorted(
        ["ConfigMap", "Secret", "Secret", "StatefulSet", "Service", "Service", "PodDisruptionBudget", "ServiceMonitor",
         "ConfigMap", "StatefulSet", "Service", "PodDisruptionBudget", "StatefulSet", "Service",
         "PodDisruptionBudget", "NetworkPolicy"]
    )  # fmt: skip
    for m in r.manifests:
        (owner,) = m["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "fleetmq.io/v1alpha1",
            "kind": "BrokerFleet",
            "name": "edge",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert m["metadata"]["labels"][render.L_MANAGED] == render.MANAGER
        assert m["metadata"]["namespace"] == "mq"
    assert (
        r.config["store"]["sentinel"]["nodes"][0] == "edge-redis-sentinel-0.edge-redis-sentinel.mq.svc:26379"
    )


def test_statefulset_pods_probe_drain_and_spread():
    f = fleet(terminationGracePeriodSeconds=45, resources={"requests": {"cpu": "1", "memory": "1Gi"}},
              scheduling={"antiAffinity": "required"})  # fmt: skip
    sts = broker_sts(rendered(f, zone("external")))
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "edge-headless"
    assert c["args"][c["args"].index("--node-id") + 1] == "$(POD_NAME)"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert pod["terminationGracePeriodSeconds"] == 45
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert {"name": "config", "configMap": {"name": "edge-config"}} in pod["volumes"]
    assert not any("subPath" in m for m in c["volumeMounts"])  # subPath mounts never see updates


def test_zone_acl_and_listener_changes_leave_the_pod_template_alone():
    f = fleet()
    before = rendered(f, zone("external"))
    after = rendered(
        f,
        zone("external", gen=2, session={"maxInflight": 1},
             acl=[{"permission": "deny", "filter": "#"}],
             listeners=[{"name": "mqtt", "port": 1884}, {"name": "ws", "port": 8083, "protocol": "ws"}]),
        zone("internal", created="2024-01-02T00:00:00Z", listeners=[{"name": "mqtt", "port": 11883}]),
    )  # fmt: skip
    assert after.config_hash != before.config_hash
    assert broker_sts(after)["spec"]["template"] == broker_sts(before)["spec"]["template"]
    assert sorted(s["metadata"]["name"] for s in by_kind(after, "Service")) == [
        "edge-external-mqtt", "edge-external-ws", "edge-headless", "edge-internal-mqtt", "edge-redis",
        "edge-redis-sentinel",
    ]  # fmt: skip
    ws = next(s for s in by_kind(after, "Service") if s["metadata"]["name"] == "edge-external-ws")
    assert ws["spec"]["ports"] == [{"name": "ws", "port": 8083, "targetPort": 8083, "protocol": "TCP"}]


def test_start_only_settings_and_image_change_the_pod_template():
    base = broker_sts(rendered(fleet(), zone("external")))["spec"]["template"]
    for change in ({"eventLog": {"enabled": True}}, {"metrics": {"port": 9200}}, {"image": "fleetmq/broker:0.2"},
                   {"redis": {"url": "redis://other:6379/0"}}, {"api": {"enabled": True}}):  # fmt: skip
        tmpl = broker_sts(rendered(fleet(**change), zone("external")))["spec"]["template"]
        assert tmpl != base, change
    # no trace of the operator's own version in what the pods run
    assert "version" not in json.dumps(base["metadata"]).lower()


def test_an_existing_redis_password_is_a_file_mounted_from_its_secret():
    f = fleet(redis={"url": "redis://db.example:6379/2", "secretRef": {"name": "redis-auth", "key": "pw"}})
    r = rendered(f, zone("external"), redis_password="s3cret")
    pod = broker_sts(r)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert r.config["store"] == {"kind": "redis", "url": "redis://db.example:6379/2",
                                 "password_file": "/etc/fleetmq/redis/password", "wait_replicas": 0}  # fmt: skip
    assert {"name": "redis-auth", "secret": {"secretName": "redis-auth", "items": [
        {"key": "pw", "path": "password"}]}} in pod["volumes"]  # fmt: skip
    assert {"name": "redis-auth", "mountPath": "/etc/fleetmq/redis", "readOnly": True} in c["volumeMounts"]
    assert "s3cret" not in json.dumps(r.manifests)
    assert [e["name"] for e in c["env"]] == ["POD_NAME"] and "--redis-url" not in c["args"]
    # a changed password takes new broker pods (they read it at start)
    other = rendered(f, zone("external"), redis_password="other")
    assert broker_sts(other)["spec"]["template"] != broker_sts(r)["spec"]["template"]


def test_tls_listener_and_users_secret_are_mounted():
    z = zone("secure", listeners=[{"name": "mqtts", "port": 8883, "protocol": "tls",
                                   "tlsSecretRef": {"name": "edge-tls"}, "verifyPeer": True}],
             authentication={"allowAnonymous": False, "usersSecretRef": {"name": "edge-users"}})  # fmt: skip
    r = rendered(fleet(), z)
    (lst,) = r.config["listeners"]
    assert lst["certfile"] == "/etc/fleetmq/tls/edge-tls/tls.crt"
    assert lst["cafile"] == "/etc/fleetmq/tls/edge-tls/ca.crt" and lst["verify_peer"] is True
    assert r.config["zones"]["secure"]["users_file"] == "/etc/fleetmq/users/secure/users"
    pod = broker_sts(r)["spec"]["template"]["spec"]
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    # and the managed Redis' password, and the bridges' Secret (always mounted)
    assert secrets == {"edge-tls", "edge-users", "edge-redis-auth", "edge-bridge-secrets", "edge-mqttusers"}


def test_port_conflict_rejects_the_younger_zone_only():
    f = fleet()
    old = zone("a", listeners=[{"name": "mqtt", "port": 1883}])
    young = zone("b", created="2024-02-01T00:00:00Z", listeners=[{"name": "mqtt", "port": 1883}])
    accepted, rejected = render.select_zones(render.Fleet.parse(f), [young, old])
    assert [z.name for z in accepted] == ["a"]
    assert rejected["b"].reason == "PortConflict" and "zone a" in rejected["b"].message
    metrics_clash = zone("c", listeners=[{"name": "mqtt", "port": 9100}])
    _, rejected = render.select_zones(render.Fleet.parse(f), [metrics_clash])
    assert "metrics" in rejected["c"].message


def test_broken_or_paused_zone_keeps_its_last_applied_version():
    f = fleet()
    good = rendered(f, zone("external", session={"maxInflight": 5}))
    last = render.applied_zones(by_kind(good, "ConfigMap")[0])
    assert last["external"].spec.session.max_inflight == 5
    bad = zone("external", gen=2, session={"maxInflight": -1})
    accepted, rejected = render.select_zones(render.Fleet.parse(f), [bad], last)
    assert (
        rejected["external"].reason == "InvalidSpec" and "session.maxInflight" in rejected["external"].message
    )
    assert [(z.name, z.generation, z.spec.session.max_inflight) for z in accepted] == [("external", 1, 5)]
    paused = zone("external", gen=3, session={"maxInflight": 99})
    paused["metadata"]["annotations"] = {render.PAUSED: "true"}
    accepted, rejected = render.select_zones(render.Fleet.parse(f), [paused], last)
    assert rejected["external"].reason == "Paused"
    assert accepted[0].spec.session.max_inflight == 5


def test_long_names_are_cut_to_valid_object_names():
    name = render.dns_name("a" * 60, "zone", "listener")
    assert len(name) == 63 and name != render.dns_name("a" * 60, "zone", "listener2")


def test_status_maps_pod_hashes_to_zone_generations():
    f = fleet()
    r1 = rendered(f, zone("external", gen=1))
    (z2,), _ = render.select_zones(
        render.Fleet.parse(f), [zone("external", gen=2, session={"maxInflight": 3})]
    )
    r2 = render.render(render.Fleet.parse(f), [z2], history=r1.history)
    assert r2.history == {r1.config_hash: {"external": 1}, r2.config_hash: {"external": 2}}
    sts = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2,
           "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "a"}}  # fmt: skip
    info = {
        "edge-0": {"config_hash": r2.config_hash, "connections": "3", "sessions": "2"},
        "edge-1": {"config_hash": r1.config_hash, "connections": "1", "sessions": "1"},
    }
    st = fleet_status(render.Fleet.parse(f), r2, "", Observed(statefulset=sts, nodeinfo=info))
    conds = {c["type"]: c for c in st["conditions"]}
    assert st["zones"]["external"] == {"generation": 2, "appliedGeneration": 1, "podsApplied": 1}
    assert (st["connections"], st["sessions"], st["readyReplicas"]) == (4, 3, 2)
    assert conds["ConfigApplied"]["status"] == "False" and "1/2" in conds["ConfigApplied"]["message"]
    assert conds["Ready"]["status"] == "False" and conds["Progressing"]["status"] == "True"
    info["edge-1"]["config_hash"] = r2.config_hash
    st2 = fleet_status(
        render.Fleet.parse(f | {"status": st}), r2, "", Observed(statefulset=sts, nodeinfo=info)
    )
    conds2 = {c["type"]: c for c in st2["conditions"]}
    # every pod on the config, but the managed Redis' pods not ready: the store is not, so neither the fleet
    assert (conds2["Ready"]["status"], conds2["Ready"]["reason"]) == ("False", "StoreNotReady")
    assert conds2["Ready"]["message"] == conds2["StoreReady"]["message"]
    redis = {f"StatefulSet/edge-{n}": {"status": {"readyReplicas": 3}} for n in ("redis", "redis-sentinel")}
    st2 = fleet_status(
        render.Fleet.parse(f | {"status": st}),
        r2,
        "",
        Observed(statefulset=sts, nodeinfo=info, store_children=redis),
    )
    conds2 = {c["type"]: c for c in st2["conditions"]}
    assert conds2["Ready"]["status"] == "True" and conds2["Degraded"]["status"] == "False"
    assert conds2["Degraded"]["lastTransitionTime"] == conds["Degraded"]["lastTransitionTime"]
    zs = zone_status(zone("external", gen=2), fleet_found=True, rejection=None, fleet_status_=st2,
                     pod_gens={"edge-0": 2, "edge-1": 2})  # fmt: skip
    zconds = {c["type"]: c["status"] for c in zs["conditions"]}
    assert zconds == {"Accepted": "True", "Applied": "True"} and zs["appliedGeneration"] == 2


def test_zone_status_reports_missing_fleet_and_rejections():
    zs = zone_status(zone("x"), fleet_found=False, rejection=None, fleet_status_=None, pod_gens=None)
    accepted = next(c for c in zs["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "FleetNotFound")
    zs = zone_status(zone("x", gen=4), fleet_found=True, rejection=Rejection("PortConflict", "port 1883 ..."),
                     fleet_status_=None, pod_gens={"edge-0": 3})  # fmt: skip
    conds = {c["type"]: c for c in zs["conditions"]}
    assert conds["Accepted"]["reason"] == "PortConflict" and conds["Applied"]["status"] == "False"
    assert zs["appliedGeneration"] == 3 and conds["Accepted"]["observedGeneration"] == 4


def test_pods_that_cannot_run_are_said_in_degraded_and_ready():
    f = fleet()
    r = rendered(f, zone("external"))
    sts = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 1,
           "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "a"}}  # fmt: skip
    pull = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "fleetmq/broker:nope"'}
    pods = [
        {"metadata": {"name": "edge-1"}, "status": {"containerStatuses": [{"state": {"waiting": pull}}]}},
        {"metadata": {"name": "edge-0"}, "status": {"containerStatuses": [{"state": {"running": {}}}]}},
        {"metadata": {"name": "edge-redis-0"}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes: cpu"}]}},
    ]  # fmt: skip
    st = fleet_status(render.Fleet.parse(f), r, "", Observed(statefulset=sts, pods=pods))
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "ImagePullBackOff"
    assert conds["Degraded"]["message"] == (
        'pod edge-1: ImagePullBackOff: Back-off pulling image "fleetmq/broker:nope"; '
        "pod edge-redis-0: Unschedulable: 0/1 nodes: cpu"
    )
    assert conds["Ready"]["status"] == "False" and "edge-1: ImagePullBackOff" in conds["Ready"]["message"]
    # a pod merely starting (ContainerCreating) is no problem
    pods = [{"metadata": {"name": "edge-1"}, "status": {"containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]}}]  # fmt: skip
    st = fleet_status(render.Fleet.parse(f), r, "", Observed(statefulset=sts, pods=pods))
    assert next(c for c in st["conditions"] if c["type"] == "Degraded")["status"] == "False"


def mqtt_bridge(name: str, gen: int = 1, **spec) -> dict:
    spec.setdefault("remote", {"host": "mqtt.example.com"})
    spec.setdefault("forwards", [{"filter": "up/#", "destination": "site1/{#}"}])
    return {
        "apiVersion": "fleetmq.io/v1alpha1",
        "kind": "MqttBridge",
        "metadata": {
            "name": name,
            "namespace": "mq",
            "generation": gen,
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": {"fleetRef": {"name": "edge"}, **spec},
    }


def test_bridges_get_their_secrets_files_through_the_fleets_bridge_secret():
    """The bridges' Secrets are copied into one Secret of the fleet, mounted by every pod whether it has
    bridges or not: adding a bridge (or rotating its credentials) leaves the pods' template alone."""
    b = mqtt_bridge(
        "cloud",
        remote={"host": "mqtt.example.com", "transport": "tls", "username": "edge",
                "passwordSecretRef": {"name": "cloud-pw", "key": "pw"}, "tls": {"secretRef": {"name": "cloud-ca"}}},
        forwards=[{"filter": "up/#", "destination": "site1/{#}", "maxQos": 1}],
        queue={"maxLength": 500, "overflow": "dropNew"},
    )  # fmt: skip
    bridges, rejected = render.select_bridges([b])
    assert not rejected
    # the TLS Secret has a CA and a certificate without its key: the CA is used, the certificate is not
    files = render.bridge_secret_files("cloud", "czNjcmV0", {"ca.crt": "Q0E=", "tls.crt": "Q1JU"})
    assert files == {"cloud.password": "czNjcmV0", "cloud.ca.crt": "Q0E="}
    zones = render.select_zones(render.Fleet.parse(fleet()), [zone("external")])[0]
    r = render.render(render.Fleet.parse(fleet()), zones, bridges=bridges, bridge_files=files)
    cfg = BrokerConfig.model_validate(r.config | {"node_id": "edge-1"})
    [bc] = cfg.bridges
    assert (bc.name, bc.remote.address, bc.remote.username) == ("cloud", ("mqtt.example.com", 8883), "edge")
    assert bc.remote.password_file == "/etc/fleetmq/bridge-secrets/cloud.password"
    assert bc.remote.tls is not None
    assert (bc.remote.tls.cafile, bc.remote.tls.certfile) == (
        "/etc/fleetmq/bridge-secrets/cloud.ca.crt",
        None,
    )
    assert (bc.forwards[0].max_qos, bc.queue.max_length, bc.queue.overflow) == (1, 500, "dropNew")
    assert cfg.config_hash() == r.config_hash
    [secret, _users] = by_kind(r, "Secret")
    assert secret["metadata"]["name"] == "edge-bridge-secrets" and secret["data"] == files
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "BrokerFleet"
    without = render.render(render.Fleet.parse(fleet()), zones)
    assert broker_sts(r)["spec"]["template"] == broker_sts(without)["spec"]["template"]
    pod = broker_sts(r)["spec"]["template"]["spec"]
    assert {"name": "bridge-secrets", "secret": {"secretName": "edge-bridge-secrets"}} in pod["volumes"]
    assert {"name": "bridge-secrets", "mountPath": "/etc/fleetmq/bridge-secrets", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"]
    )


def test_a_broken_bridge_is_rejected_naming_the_field_and_keeps_its_last_version():
    good, _ = render.select_bridges([mqtt_bridge("cloud")])
    last = {b.name: b for b in good}
    bad = mqtt_bridge("cloud", gen=2, forwards=[{"filter": "up/#", "destination": "{3-1}"}])
    accepted, rejected = render.select_bridges([bad], last)
    assert rejected["cloud"].reason == "InvalidSpec"
    assert (
        "forwards.0.destination" in rejected["cloud"].message
        and "ends before it starts" in rejected["cloud"].message
    )
    assert [(b.name, b.generation) for b in accepted] == [("cloud", 1)]
    never, rejected = render.select_bridges([bad])
    assert never == [] and "cloud" in rejected


def test_of_two_bridges_with_one_session_at_a_remote_the_older_keeps_it():
    """Same host, port and client id: the bridges would take the session from each other at the remote.
    The one created later is refused naming the field; a bridge with the default client id (fleet-name)
    does not collide with one whose explicit id differs."""
    remote = {"host": "mqtt.example.com", "clientId": "edge-uplink"}
    older = mqtt_bridge("a", remote=remote)
    newer = mqtt_bridge("b", remote=remote)
    newer["metadata"]["creationTimestamp"] = "2024-01-02T00:00:00Z"
    other = mqtt_bridge("c", remote={"host": "mqtt.example.com", "clientId": "edge-a"})  # a's default id...
    accepted, rejected = render.select_bridges([newer, older, other])
    assert [b.name for b in accepted] == ["a", "c"]  # (...but a has an explicit one)
    assert rejected["b"].reason == "SessionConflict"
    assert rejected["b"].message == (
        "spec.remote.clientId: bridge a already connects to mqtt.example.com:1883 as 'edge-uplink'"
    )
    clash = mqtt_bridge("d", remote={"host": "mqtt.example.com", "clientId": "edge-e"})
    default = mqtt_bridge("e", remote={"host": "mqtt.example.com"})  # its client id: edge-e
    default["metadata"]["creationTimestamp"] = "2024-01-02T00:00:00Z"
    accepted, rejected = render.select_bridges([clash, default])
    assert [b.name for b in accepted] == ["d"] and "as 'edge-e'" in rejected["e"].message
    # a bridge that ran keeps its last version when an edit makes it collide
    accepted, rejected = render.select_bridges(
        [older, newer], {"b": render.select_bridges([mqtt_bridge("b")])[0][0]}
    )
    assert [b.name for b in accepted] == ["a", "b"] and accepted[1].spec.remote.client_id is None


def test_bridge_status_from_the_pods_reports():
    from fleetmq.operator.status import bridge_status

    b = mqtt_bridge("cloud", gen=3)
    bridges, _ = render.select_bridges([b])
    r = render.render(render.Fleet.parse(fleet()), [], bridges=bridges)
    assert render.applied_bridges(by_kind(r, "ConfigMap")[0]) == {"cloud": bridges[0]}
    reports = {
        "edge-0": {"bridges": json.dumps({"cloud": {"leader": False, "connected": False, "queue": 0,
                                                    "forwarded": 5, "dropped": {"loop": 2}}})},
        "edge-1": {"bridges": json.dumps({"cloud": {"leader": True, "connected": True, "queue": 7,
                                                    "forwarded": 10, "dropped": {}, "last_error": None}})},
    }  # fmt: skip
    st = bridge_status(b, None, r, Observed(nodeinfo=reports), timestamp="t")
    conds = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert (st["leader"], st["connected"], st["queueMessages"], st["forwarded"]) == ("edge-1", True, 7, 15)
    assert conds == {"Accepted": ("True", "Accepted"), "Connected": ("True", "Connected"),
                     "Degraded": ("False", "Healthy")}  # fmt: skip
    assert st["dropped"] == {"loop": 2}  # (loop drops are by design: not Degraded)
    # messages lost since the last status: Degraded, saying how many; none more since: healthy again
    lossy = json.loads(reports["edge-1"]["bridges"])
    lossy["cloud"]["dropped"] = {"queue_full": 30}
    reports["edge-1"]["bridges"] = json.dumps(lossy)
    b["status"] = {**st, "dropped": {"loop": 2, "queue_full": 10}}
    st = bridge_status(b, None, r, Observed(nodeinfo=reports), timestamp="t")
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["message"]) == ("True", "lost 20 queue_full lately")
    assert st["dropped"] == {"loop": 2, "queue_full": 30}
    b["status"] = st
    st = bridge_status(b, None, r, Observed(nodeinfo=reports), timestamp="t")
    assert next(c for c in st["conditions"] if c["type"] == "Degraded")["status"] == "False"
    down = {"edge-1": {"bridges": json.dumps({"cloud": {"leader": True, "connected": False, "queue": 40,
                                                        "forwarded": 0, "dropped": {}, "last_error": "refused"}})}}  # fmt: skip
    st = bridge_status(b, render.Rejection("SecretMissing", "spec.remote.passwordSecretRef: ..."), r,
                       Observed(nodeinfo=down), timestamp="t")  # fmt: skip
    conds = {c["type"]: (c["status"], c["reason"], c["message"]) for c in st["conditions"]}
    assert conds["Accepted"][:2] == ("False", "SecretMissing") and conds["Connected"] == (
        "False",
        "Disconnected",
        "refused",
    )
    assert st["queueMessages"] == 40


def test_a_stopping_broker_evicts_at_the_fleets_rate_within_its_grace_period():
    r = rendered(fleet(), zone("external"))
    assert r.config["shutdown"] == {"eviction_rate": 500, "timeout": 25}  # (30 s grace, 5 s in hand)
    r2 = rendered(fleet(evictionRate=50, terminationGracePeriodSeconds=120), zone("external"))
    assert r2.config["shutdown"] == {"eviction_rate": 50, "timeout": 115}
    assert broker_sts(r2)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    # live: the eviction rate is read when a broker stops, so changing it rolls no pod
    r3 = rendered(fleet(evictionRate=10), zone("external"))
    assert broker_sts(r3)["spec"]["template"] == broker_sts(r)["spec"]["template"]
    assert BrokerConfig.model_validate(r3.config | {"node_id": "edge-0"}).shutdown.eviction_rate == 10


def test_the_client_services_select_serving_pods_and_the_operator_drives_the_statefulsets_shape():
    """Rollouts (rollout.py): the pods start serving; which serve is the operator's to change. The
    StatefulSet's start ordinal, replicas and partition are what it renders them from (a steady fleet's:
    ordinal 0 up, a partition at replicas so that a new template changes no pod by itself)."""
    from fleetmq.operator import rollout

    r = rendered(fleet(), zone("external"))
    [svc] = [s for s in by_kind(r, "Service") if s["metadata"]["name"] == "edge-external-mqtt"]
    assert svc["spec"]["selector"][rollout.L_SERVING] == "true"
    spec = broker_sts(r)["spec"]
    assert spec["template"]["metadata"]["labels"][rollout.L_SERVING] == "true"
    assert (spec["ordinals"], spec["replicas"], spec["updateStrategy"]) == (
        {"start": 0},
        2,
        {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
    )  # (fleet() has 2 replicas)
    step = render.render(render.Fleet.parse(fleet()), [], shape=rollout.Shape(2, 4, 3))
    spec = broker_sts(step)["spec"]
    assert (spec["ordinals"], spec["replicas"], spec["updateStrategy"]["rollingUpdate"]) == (
        {"start": 2},
        4,
        {"partition": 3},
    )


def test_the_broker_image_is_the_fleets_own_else_the_operators(monkeypatch):
    """An upgraded operator upgrades the brokers of fleets that name no image, including those made by
    0.1.0, whose CRD wrote its default image into every fleet: their configs are the new operator's."""
    from importlib.metadata import version

    from fleetmq.operator.crds import BrokerFleetSpec

    monkeypatch.delenv(render.BROKER_IMAGE_ENV, raising=False)
    assert render.broker_image(BrokerFleetSpec()) == f"fleetmq/broker:{version('fleetmq')}"
    assert (
        render.broker_image(BrokerFleetSpec(image="fleetmq/broker:0.1.0"))
        == f"fleetmq/broker:{version('fleetmq')}"
    )
    monkeypatch.setenv(render.BROKER_IMAGE_ENV, "registry.example/mq/fleetmq:7")
    assert render.broker_image(BrokerFleetSpec()) == "registry.example/mq/fleetmq:7"
    assert render.broker_image(BrokerFleetSpec(image="mine:1")) == "mine:1"
    sts = broker_sts(rendered(fleet(), zone("external")))
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/mq/fleetmq:7"


def test_the_brokers_disruption_budget_is_the_fleets_and_the_operator_counts_it_alike():
    import pydantic
    from fleetmq.operator.crds import DisruptionSpec

    pdb = next(
        m for m in by_kind(rendered(fleet()), "PodDisruptionBudget") if m["metadata"]["name"] == "edge"
    )
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    r = render.render(render.Fleet.parse(fleet(disruption={"minAvailable": "50%"})), [])
    budgets = {m["metadata"]["name"]: m["spec"] for m in by_kind(r, "PodDisruptionBudget")}
    assert budgets["edge"]["minAvailable"] == "50%" and "maxUnavailable" not in budgets["edge"]
    assert all(b.get("maxUnavailable") == 1 for n, b in budgets.items() if n != "edge")  # (Redis' own)
    assert DisruptionSpec(minAvailable="50%").max_unavailable(3) == 1  # 2 of 3 must stay (rounded up)
    assert DisruptionSpec(maxUnavailable="25%").max_unavailable(3) == 1
    assert DisruptionSpec(maxUnavailable=0).max_unavailable(3) == 0
    assert DisruptionSpec().max_unavailable(5) == 1
    for bad, where in (({"maxUnavailable": 1, "minAvailable": 1}, "not both"), ({"minAvailable": "x%"}, "percentage"),
                       ({"maxUnavailable": -1}, "at least 0")):  # fmt: skip
        try:
            DisruptionSpec.model_validate(bad)
        except pydantic.ValidationError as e:
            assert where in str(e)
        else:
            raise AssertionError(f"{bad} accepted")


def test_the_managed_redis_admits_only_its_fleet_the_operator_and_allow_from():
    peer = {
        "namespaceSelector": {"matchLabels": {"team": "sre"}},
        "podSelector": {"matchLabels": {"app": "debug"}},
    }
    r = rendered(fleet(redis={"managed": True, "networkPolicy": {"allowFrom": [peer]}}), zone("external"),
                 operator_namespace="fleetmq-system")  # fmt: skip
    (policy,) = by_kind(r, "NetworkPolicy")
    assert policy["metadata"]["name"] == "edge-redis" and policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    brokers, store, operator, extra = rule["from"]
    assert brokers == {"podSelector": {"matchLabels": render.selector_labels("edge")}}
    assert store["podSelector"]["matchExpressions"][0]["values"] == ["redis", "redis-sentinel", "redis-setup"]
    assert operator["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "fleetmq-system"}}
    assert extra == peer
    # an operator outside the cluster is no pod: no peer for it; and the policy can be left out
    (outside,) = by_kind(rendered(fleet(redis={"managed": True}), zone("external")), "NetworkPolicy")
    assert len(outside["spec"]["ingress"][0]["from"]) == 2
    off = rendered(fleet(redis={"managed": True, "networkPolicy": {"enabled": False}}), zone("external"))
    assert "NetworkPolicy" not in {m["kind"] for m in off.manifests}


def test_an_authentication_chain_reaches_the_brokers_with_its_keys_as_mounted_files():
    chain = [
        {"mechanism": "jwt", "from": "username", "algorithms": ["RS256", "HS256"], "jwksUrl": "https://idp/jwks",
         "jwksRef": {"name": "idp-keys", "key": "jwks.json"}, "secretRef": {"name": "idp-hmac", "key": "hmac"},
         "verifyClaims": {"sub": "%c"}, "aclClaim": "acl", "jwksRefreshMin": "30s"},
        {"mechanism": "http", "url": "http://auth.platform:8080/mqtt", "cacheTtl": "30s",
         "headers": {"X-Source": "fleetmq"}, "headerSecretRefs": {"X-Api-Key": {"name": "auth-key", "key": "key"}}},
    ]  # fmt: skip
    r = rendered(fleet(), zone("external", authentication={"chain": chain}))
    cfg = BrokerConfig.model_validate(yaml.safe_load(by_kind(r, "ConfigMap")[0]["data"][render.CONFIG_KEY]))
    jwt_, http = cfg.zones["external"].authentication
    base = "/etc/fleetmq/authn/external"
    assert (jwt_.from_, jwt_.jwks_url, jwt_.jwks_refresh_min, jwt_.acl_claim) == (
        "username",
        "https://idp/jwks",
        30.0,
        "acl",
    )
    assert jwt_.jwks_file == f"{base}/0/jwksRef/jwks.json" and jwt_.secret_file == f"{base}/0/secretRef/hmac"
    assert http.header_files == {"X-Api-Key": f"{base}/1/header-0/key"} and http.headers == {
        "X-Source": "fleetmq"
    }
    assert http.cache_ttl == 30.0
    pod = broker_sts(r)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = {path: {k: v for k, v in volumes[name].items() if k != "name"} for path, name in mounts.items()
               if path.startswith(base)}  # fmt: skip
    assert sources == {
        f"{base}/0/jwksRef": {
            "configMap": {"name": "idp-keys", "items": [{"key": "jwks.json", "path": "jwks.json"}]}
        },
        f"{base}/0/secretRef": {
            "secret": {"secretName": "idp-hmac", "items": [{"key": "hmac", "path": "hmac"}]}
        },
        f"{base}/1/header-0": {
            "secret": {"secretName": "auth-key", "items": [{"key": "key", "path": "key"}]}
        },
    }


def test_a_listener_with_allow_from_gets_the_brokers_a_network_policy_and_proxy_protocol_reaches_them():
    lb = {"ipBlock": {"cidr": "10.20.0.0/16"}}
    r = rendered(fleet(), zone("external", listeners=[
        {"name": "mqtt", "port": 1883, "allowFrom": [lb], "proxyProtocol": True, "proxyProtocolTimeout": "5s"},
        {"name": "ws", "port": 8083, "protocol": "ws"},
    ]))  # fmt: skip
    (policy,) = [m for m in by_kind(r, "NetworkPolicy") if m["metadata"]["name"] == "edge"]
    assert policy["spec"]["podSelector"] == {"matchLabels": render.selector_labels("edge")}
    assert policy["spec"]["ingress"] == [
        {"from": [lb], "ports": [{"protocol": "TCP", "port": 1883}]},
        {
            "ports": [
                {"protocol": "TCP", "port": p}
                for p in sorted([8083, render.Fleet.parse(fleet()).spec.metrics.port])
            ]
        },
    ]
    cfg = BrokerConfig.model_validate(yaml.safe_load(by_kind(r, "ConfigMap")[0]["data"][render.CONFIG_KEY]))
    mqtt = next(lst for lst in cfg.listeners if lst.name == "external/mqtt")
    assert mqtt.proxy_protocol and mqtt.proxy_protocol_timeout == 5.0
    others = by_kind(rendered(fleet(), zone("external")), "NetworkPolicy")
    assert "edge" not in [m["metadata"]["name"] for m in others]  # (nothing restricted: none for the brokers)


def test_spec_api_renders_the_config_section_its_keys_its_port_and_service():
    off = rendered(fleet(), zone("external"))
    assert "api" not in off.config and not [
        s for s in by_kind(off, "Service") if s["metadata"]["name"] == "edge-api"
    ]
    r = rendered(fleet(api={"enabled": True, "port": 8090, "serviceType": "LoadBalancer"}), zone("external"))
    assert r.config["api"] == {"bind": "0.0.0.0:8090", "keys_file": "/etc/fleetmq/api/keys.yaml"}
    BrokerConfig.model_validate(r.config)  # the broker takes it
    pod = broker_sts(r)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "api", "containerPort": 8090, "protocol": "TCP"} in c["ports"]
    assert {"name": "api-keys", "mountPath": "/etc/fleetmq/api", "readOnly": True} in c["volumeMounts"]
    assert {"name": "api-keys", "secret": {"secretName": "edge-api-keys",
                                           "items": [{"key": "keys.yaml", "path": "keys.yaml"}]}} in pod["volumes"]  # fmt: skip
    (svc,) = [s for s in by_kind(r, "Service") if s["metadata"]["name"] == "edge-api"]
    assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["ports"][0]["targetPort"] == "api"
    assert svc["spec"]["selector"] == render.selector_labels("edge")


def test_the_generated_api_keys_secret_holds_the_hashes_for_the_pods_and_the_key_for_the_user():
    import base64

    from fleetmq.broker import apikeys

    key, record = apikeys.new_key("admin", "admin")
    secret = render.api_keys_secret(render.Fleet.parse(fleet()), apikeys.dump([record]), key)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data[render.API_ADMIN_KEY] == key and key not in data["keys.yaml"]
    assert apikeys.parse(data["keys.yaml"])[0].hash == apikeys.digest(key)
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "BrokerFleet"
