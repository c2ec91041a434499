"""The operator against a real kube-apiserver, running as its own ServiceAccount (operator/rbac.yaml).

Without kube-controller-manager the StatefulSet gets no pods; the tests then check what exists
(readyReplicas 0, Progressing). With it (and kwok) they also see owner-reference garbage collection.
"""

from __future__ import annotations

import json
import time

import pytest
from fleetmq.broker.config import BrokerConfig
from fleetmq.operator import render

from .conftest import bridge, fleet, wait_for, zone
from .support import CHILDREN, cm_hash, config_of, hash_with_zone


def test_fleet_and_zone_become_owned_children_with_status(k, run_operator):
    run_operator()
    k.apply(fleet())
    k.apply(zone(session={"maxInflight": 5}))
    for kind, name in CHILDREN:
        wait_for(lambda kind=kind, name=name: k.get(kind, name), msg=f"{kind} {name}")
    f = k.get("brokerfleet", "edge")
    for kind, name in CHILDREN:
        obj = k.get(kind, name)
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "BrokerFleet", "edge", f["metadata"]["uid"], True,
        )  # fmt: skip
        full = json.loads(k("get", kind, name, "-o", "json", "--show-managed-fields").stdout)
        managers = {m["manager"] for m in full["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {"fleetmq-operator"}
    cfg = config_of(k)
    assert cfg["zones"]["external"]["max_inflight"] == 5
    assert BrokerConfig.model_validate(cfg).config_hash() == cm_hash(k)
    sts = k.get("statefulset", "edge")
    pod = sts["spec"]["template"]["spec"]
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sts["spec"]["replicas"] == 2
    assert k.get("service", "edge-external-mqtt")["spec"]["ports"][0]["port"] == 1883

    accepted = wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("status") == "True",
                        msg="zone accepted")  # fmt: skip
    assert accepted
    st = wait_for(lambda: (k.get("brokerfleet", "edge").get("status") or {}).get("conditions") and
                  k.get("brokerfleet", "edge")["status"], msg="fleet status")  # fmt: skip
    conds = {c["type"]: c for c in st["conditions"]}
    assert set(conds) == {"Ready", "Progressing", "ConfigApplied", "Degraded", "StoreReady"}
    for c in conds.values():
        assert (
            c["observedGeneration"] == f["metadata"]["generation"] and c["lastTransitionTime"] and c["reason"]
        )
    assert conds["Degraded"]["status"] == "False"
    assert conds["Ready"]["status"] == "False"  # no pod reports the config yet
    assert conds["ConfigApplied"]["reason"] == "ReportsUnavailable"  # redis://127.0.0.1:1 is not there
    assert (conds["StoreReady"]["status"], conds["StoreReady"]["reason"]) == ("False", "Unreachable")
    assert st["store"]["mode"] == "standalone" and st["store"]["managed"] is False
    assert st["selector"] == render.selector_string("edge")
    assert st["zones"]["external"]["generation"] == 1 and st["zoneCount"] == 1
    events = json.loads(k("get", "events", "-o", "json").stdout)["items"]
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
    assert ("edge", "ConfigRendered") in reasons and ("edge", "Created") in reasons


def test_zone_changes_are_live_and_image_changes_roll(k, run_operator):
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: k.get("statefulset", "edge"), msg="statefulset")
    wait_for(lambda: k.get("service", "edge-external-mqtt"), msg="service")
    before_hash = hash_with_zone(k)
    sts = k.get("statefulset", "edge")
    template, sts_gen = sts["spec"]["template"], sts["metadata"]["generation"]

    k.patch("mqttzone", "external", {"spec": {
        "session": {"maxInflight": 1},
        "acl": [{"permission": "deny", "action": "subscribe", "filter": "secret/#"}],
        "listeners": [{"name": "mqtt", "port": 1883}, {"name": "alt", "port": 1884}],
    }})  # fmt: skip
    wait_for(lambda: cm_hash(k) != before_hash, msg="config re-rendered")
    cfg = config_of(k)
    assert cfg["zones"]["external"]["max_inflight"] == 1
    assert cfg["zones"]["external"]["acl"] == [
        {"permission": "deny", "action": "subscribe", "filter": "secret/#"}
    ]
    assert {lst["bind"] for lst in cfg["listeners"]} == {"0.0.0.0:1883", "0.0.0.0:1884"}
    wait_for(lambda: k.get("service", "edge-external-alt"), msg="service of the new listener")
    sts = k.get("statefulset", "edge")
    assert sts["spec"]["template"] == template and sts["metadata"]["generation"] == sts_gen
    wait_for(lambda: (k.get("brokerfleet", "edge")["status"]["zones"]["external"]["generation"] == 2),
             msg="status shows generation 2")  # fmt: skip

    k.patch("mqttzone", "external", {"spec": {"listeners": [{"name": "mqtt", "port": 1883}]}})
    wait_for(
        lambda: k.get("service", "edge-external-alt") is None, msg="service of the removed listener pruned"
    )

    k.patch("brokerfleet", "edge", {"spec": {"image": "fleetmq/broker:9.9", "eventLog": {"enabled": True}}})
    wait_for(lambda: k.get("statefulset", "edge")["metadata"]["generation"] > sts_gen, msg="rollout")
    new = k.get("statefulset", "edge")["spec"]["template"]
    assert new["spec"]["containers"][0]["image"] == "fleetmq/broker:9.9"
    restart = render.A_RESTART_HASH
    assert new["metadata"]["annotations"][restart] != template["metadata"]["annotations"][restart]


def test_drift_is_corrected_and_fields_the_operator_does_not_set_are_kept(k, run_operator):
    """Server-side apply: the operator owns the fields it sets and reverts changes to them; a field it does
    not set (an annotation, a label, a Service's sessionAffinity) is someone else's and stays."""
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: k.get("service", "edge-external-mqtt"), msg="service")
    wait_for(lambda: cm_hash(k), msg="config")
    k("annotate", "statefulset", "edge", "example.com/owner=team-a")
    k("label", "statefulset", "edge", "example.com/cost-center=42")
    k("annotate", "service", "edge-external-mqtt", "example.com/exposed=yes")
    k.patch("service", "edge-external-mqtt", {"spec": {"sessionAffinity": "ClientIP"}})
    k.patch("statefulset", "edge", {"spec": {"replicas": 7}})
    k.patch("service", "edge-external-mqtt", [{"op": "replace", "path": "/spec/ports/0/targetPort", "value": 1999}],
            "json")  # fmt: skip
    k.patch("configmap", "edge-config", {"data": {render.CONFIG_KEY: "zones: {}\n"}})
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 2, msg="replicas restored")
    wait_for(
        lambda: k.get("service", "edge-external-mqtt")["spec"]["ports"][0]["targetPort"] == 1883,
        msg="target port restored",
    )
    wait_for(lambda: "external" in config_of(k)["zones"], msg="config restored")
    time.sleep(2)  # two more resyncs
    sts, svc = k.get("statefulset", "edge"), k.get("service", "edge-external-mqtt")
    assert sts["metadata"]["annotations"]["example.com/owner"] == "team-a"
    assert sts["metadata"]["labels"]["example.com/cost-center"] == "42"
    assert sts["metadata"]["labels"][render.L_MANAGED] == render.MANAGER  # the operator's labels as well
    assert svc["metadata"]["annotations"]["example.com/exposed"] == "yes"
    assert svc["spec"]["sessionAffinity"] == "ClientIP"
    k("delete", "service", "edge-external-mqtt")
    wait_for(lambda: k.get("service", "edge-external-mqtt"), msg="service recreated")


def test_pod_templates_and_listener_services_reach_the_cluster(k, run_operator):
    """spec.pod and a listener's service, applied to the real API server, which checks the Kubernetes types
    the CRD keeps as given against their schema: what it refuses is said in Degraded and the running
    StatefulSet stays. (It does not validate a StatefulSet's pod template further: a sidecar mounting no
    volume is refused only when the StatefulSet controller creates its pod, in a FailedCreate event.)"""
    run_operator()
    pod = {
        "labels": {"sidecar.istio.io/inject": "true"},
        "annotations": {"vault.hashicorp.com/agent-inject": "true"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mqtt", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mqtt"]}]}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "DoNotSchedule"}],
        "serviceAccountName": "edge-brokers",
        "imagePullSecrets": [{"name": "registry"}],
        "env": [{"name": "TZ", "value": "UTC"}],
        "envFrom": [{"configMapRef": {"name": "extra", "optional": True}}],
        "volumes": [{"name": "logs", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "logs", "mountPath": "/var/log/fleetmq"}],
        "sidecars": [{"name": "shipper", "image": "fluent/fluent-bit:3",
                      "volumeMounts": [{"name": "logs", "mountPath": "/logs", "readOnly": True}]}],
    }  # fmt: skip
    k("create", "serviceaccount", "edge-brokers")
    k.apply(fleet(pod=pod, service={"annotations": {"a": "fleet"}}))
    k.apply(zone(listeners=[
        {"name": "mqtt", "port": 1883},
        {"name": "lb", "port": 1884, "service": {"type": "LoadBalancer", "nodePort": 31884, "annotations": {"b": "lb"},
                                                 "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local"}},
        {"name": "np", "port": 1885, "service": {"type": "NodePort"}},
    ]))  # fmt: skip
    tpl = wait_for(lambda: (s := k.get("statefulset", "edge")) and "tolerations" in s["spec"]["template"]["spec"]
                   and s["spec"]["template"], msg="statefulset with the pod template")  # fmt: skip
    assert tpl["metadata"]["labels"]["sidecar.istio.io/inject"] == "true"
    assert tpl["metadata"]["labels"][render.L_INSTANCE] == "edge"
    assert set(tpl["metadata"]["annotations"]) == {"vault.hashicorp.com/agent-inject", render.A_RESTART_HASH}
    spec = tpl["spec"]
    assert spec["tolerations"] == pod["tolerations"] and spec["affinity"] == pod["affinity"]
    assert spec["topologySpreadConstraints"][0]["labelSelector"] == {
        "matchLabels": render.selector_labels("edge")
    }
    assert spec["serviceAccountName"] == "edge-brokers" and spec["imagePullSecrets"] == [{"name": "registry"}]
    broker, shipper = spec["containers"]
    assert (broker["name"], shipper["name"]) == ("broker", "shipper")
    assert broker["env"][-1] == {"name": "TZ", "value": "UTC"} and broker["envFrom"] == pod["envFrom"]
    assert broker["volumeMounts"][-1] == {"name": "logs", "mountPath": "/var/log/fleetmq"}
    assert {"name": "logs", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    lb = wait_for(lambda: k.get("service", "edge-external-lb"), msg="load balancer Service")
    assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["ports"][0]["nodePort"] == 31884
    assert lb["spec"]["externalTrafficPolicy"] == "Local"
    assert lb["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert lb["metadata"]["annotations"] == {"a": "fleet", "b": "lb"}
    np = wait_for(lambda: k.get("service", "edge-external-np"), msg="node port Service")
    assert np["spec"]["type"] == "NodePort" and np["spec"]["ports"][0]["nodePort"]  # one the cluster picked
    assert k.get("service", "edge-external-mqtt")["spec"]["type"] == "ClusterIP"

    # back to the fleet's type: the node port and what goes with a load balancer go too
    k.patch(
        "mqttzone",
        "external",
        {"spec": {"listeners": [{"name": "mqtt", "port": 1883}, {"name": "lb", "port": 1884}]}},
    )
    wait_for(
        lambda: k.get("service", "edge-external-lb")["spec"]["type"] == "ClusterIP", msg="ClusterIP again"
    )
    lb = k.get("service", "edge-external-lb")
    assert "nodePort" not in lb["spec"]["ports"][0] and "loadBalancerSourceRanges" not in lb["spec"]
    assert lb["metadata"]["annotations"] == {"a": "fleet"}

    # a sidecar the API server refuses (the CRD keeps containers as given): said, the StatefulSet kept
    before = k.get("statefulset", "edge")["metadata"]["generation"]
    k.patch("brokerfleet", "edge", {"spec": {"pod": {"sidecars": [
        {"name": "shipper", "image": "fluent/fluent-bit:3", "ports": "1883"}]}}})  # fmt: skip
    cond = wait_for(lambda: (c := k.condition("brokerfleet", "edge", "Degraded")).get("reason") == "ApplyFailed" and c,
                    msg="apply failure said")  # fmt: skip
    assert "StatefulSet edge" in cond["message"]
    assert '.spec.template.spec.containers[name="shipper"].ports: expected list' in cond["message"]
    assert k.get("statefulset", "edge")["metadata"]["generation"] == before


def test_scale_subresource(k, run_operator):
    run_operator()
    k.apply(fleet())
    wait_for(lambda: k.get("statefulset", "edge"), msg="statefulset")
    k("scale", "brokerfleet", "edge", "--replicas=4")
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["replicas"] == 4, msg="scaled")
    scale = json.loads(k("get", "--raw",
                         f"/apis/fleetmq.io/v1alpha1/namespaces/{k.ns}/brokerfleets/edge/scale").stdout)  # fmt: skip
    assert scale["spec"]["replicas"] == 4
    wait_for(lambda: k.get("brokerfleet", "edge")["status"].get("selector"), msg="selector in status")


def test_bad_zones_are_reported_without_touching_the_running_fleet(k, run_operator):
    run_operator()
    k.apply(zone("orphan", fleet_name="nowhere"))
    cond = wait_for(lambda: k.condition("mqttzone", "orphan", "Accepted").get("reason") == "FleetNotFound"
                    and k.condition("mqttzone", "orphan", "Accepted"), msg="orphan reported")  # fmt: skip
    assert cond["status"] == "False" and "nowhere" in cond["message"]

    k.apply(fleet())
    k.apply(zone("first"))
    wait_for(
        lambda: k.condition("mqttzone", "first", "Accepted").get("status") == "True", msg="first accepted"
    )
    running = hash_with_zone(k, "first")
    time.sleep(1.1)  # a later creationTimestamp: the older zone keeps the port
    k.apply(zone("second"))
    cond = wait_for(lambda: k.condition("mqttzone", "second", "Accepted").get("reason") == "PortConflict"
                    and k.condition("mqttzone", "second", "Accepted"), msg="conflict reported")  # fmt: skip
    assert "port 1883 is already used by zone first" in cond["message"]
    degraded = wait_for(lambda: k.condition("brokerfleet", "edge", "Degraded").get("status") == "True"
                        and k.condition("brokerfleet", "edge", "Degraded"), msg="fleet degraded")  # fmt: skip
    assert degraded["reason"] == "ZoneRejected" and "second" in degraded["message"]
    assert (
        cm_hash(k) == running
        and set(config_of(k)["zones"]) >= {"first"}
        and "second" not in config_of(k)["zones"]
    )
    assert k.get("service", "edge-second-mqtt") is None

    # a zone whose fleet is created later is picked up
    k.patch("mqttzone", "orphan", {"spec": {"fleetRef": {"name": "edge"},
                                            "listeners": [{"name": "mqtt", "port": 2883}]}})  # fmt: skip
    wait_for(
        lambda: k.condition("mqttzone", "orphan", "Accepted").get("status") == "True", msg="orphan adopted"
    )
    wait_for(lambda: "orphan" in config_of(k)["zones"], msg="orphan rendered")

    # deleting the zone that holds the port frees it: the refused zone is accepted, the deleted one pruned
    k("delete", "mqttzone", "first")
    wait_for(
        lambda: k.condition("mqttzone", "second", "Accepted").get("status") == "True", msg="second accepted"
    )
    wait_for(
        lambda: "first" not in config_of(k)["zones"] and "second" in config_of(k)["zones"], msg="re-rendered"
    )
    wait_for(lambda: k.get("service", "edge-first-mqtt") is None, msg="deleted zone's Service pruned")
    assert k.get("service", "edge-second-mqtt")["spec"]["ports"][0]["port"] == 1883
    wait_for(
        lambda: k.condition("brokerfleet", "edge", "Degraded").get("status") == "False", msg="healthy again"
    )


def test_deleting_the_fleet(k, run_operator, control_plane):
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: k.get("statefulset", "edge"), msg="statefulset")
    wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("status") == "True", msg="accepted")
    k("delete", "brokerfleet", "edge", "--wait=true", "--timeout=30s")
    assert k.get("brokerfleet", "edge") is None  # the operator released its finalizer
    wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("reason") == "FleetNotFound",
             msg="zone reports the fleet gone")  # fmt: skip
    if control_plane.controllers:  # the garbage collector follows the owner references
        for kind, name in CHILDREN:
            wait_for(lambda kind=kind, name=name: k.get(kind, name) is None, msg=f"{kind} {name} collected")


def test_restarting_the_operator_changes_no_pod_template(k, run_operator):
    """Upgrading (restarting) the operator must not roll the brokers."""
    first = run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("status") == "True", msg="accepted")
    before = k.get("statefulset", "edge")
    first.stop()
    run_operator()
    time.sleep(3)  # resumed and resynced a few times
    after = k.get("statefulset", "edge")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"]["template"] == before["spec"]["template"]


def test_a_rollout_adds_a_pod_before_each_old_one_goes_and_zone_changes_keep_them(
    k, run_operator, control_plane
):
    """With kube-controller-manager, scheduler and kwok: real StatefulSet pods on fake nodes."""
    if not control_plane.controllers:
        import pytest

        pytest.skip("needs kube-controller-manager, kube-scheduler and kwok (make envtest)")
    run_operator()
    k.apply(fleet(replicas=3))
    k.apply(zone())

    def pods() -> list[dict]:
        out = json.loads(k("get", "pods", "-l", render.selector_string("edge"), "-o", "json").stdout)["items"]
        return out

    def ready(p: dict) -> bool:
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])
        )

    wait_for(lambda: len([p for p in pods() if ready(p)]) == 3, timeout=90, msg="3 ready pods")
    assert sorted(p["metadata"]["name"] for p in pods()) == ["edge-0", "edge-1", "edge-2"]
    uids = {p["metadata"]["uid"] for p in pods()}
    before = hash_with_zone(k)
    k.patch("mqttzone", "external", {"spec": {"session": {"maxInflight": 1}}})
    wait_for(lambda: cm_hash(k) != before, msg="config re-rendered")
    time.sleep(2)
    assert {p["metadata"]["uid"] for p in pods()} == uids  # live change: no pod replaced

    k.patch("brokerfleet", "edge", {"spec": {"image": "fleetmq/broker:next"}})
    fewest, most, reasons = 3, 0, set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        current = pods()
        live = [p for p in current if not p["metadata"].get("deletionTimestamp")]
        fewest = min(fewest, len([p for p in live if ready(p)]))
        most = max(most, len(live))
        rollout_st = (k.get("brokerfleet", "edge").get("status") or {}).get("rollout")
        if rollout_st:
            reasons.add(rollout_st["reason"])
        done = [p for p in live if ready(p) and p["spec"]["containers"][0]["image"] == "fleetmq/broker:next"]
        if len(done) == 3 and len(current) == 3:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(
            f"rollout did not finish: {[(p['metadata']['name'], p['spec']['containers'][0]['image']) for p in pods()]}"
        )
    # each old pod went only once a new one was there to take its clients: never fewer than 3 Ready
    assert fewest == 3 and most == 4, (fewest, most)
    assert sorted(p["metadata"]["name"] for p in pods()) == ["edge-3", "edge-4", "edge-5"]
    assert reasons == {"RollingOut"}
    wait_for(lambda: k.get("brokerfleet", "edge")["status"].get("updatedReplicas") == 3
             and not k.get("brokerfleet", "edge")["status"].get("rollout"), msg="status: rolled")  # fmt: skip
    sts = k.get("statefulset", "edge")["spec"]
    assert (
        sts["ordinals"]["start"],
        sts["replicas"],
        sts["updateStrategy"]["rollingUpdate"]["partition"],
    ) == (3, 3, 3)


def test_bridges_are_rendered_and_a_missing_secret_is_reported(k, run_operator):
    """An MqttBridge goes into its fleet's config; one whose password Secret does not exist is refused in
    its conditions, naming the field; once the Secret exists it is rendered, its password copied into the
    fleet's bridge Secret, and the pods' template stays as it was (no rolling restart for a bridge). A
    changed password reaches the copy at the next resync."""
    import base64

    run_operator()
    k.apply(fleet())
    k.apply(bridge("cloud", forwards=[{"filter": "up/#", "destination": "site1/{#}", "maxQos": 1}]))
    wait_for(lambda: "bridges" in config_of(k) and [b["name"] for b in config_of(k)["bridges"]] == ["cloud"],
             msg="the bridge rendered")  # fmt: skip
    (b,) = config_of(k)["bridges"]
    assert b["forwards"][0]["destination"] == "site1/{#}" and b["forwards"][0]["max_qos"] == 1
    wait_for(lambda: k.condition("mqttbridge", "cloud", "Accepted").get("status") == "True", msg="accepted")
    template = k.get("statefulset", "edge")["spec"]["template"]
    k.apply(bridge("locked", remote={"host": "h", "passwordSecretRef": {"name": "locked-pw"}}))
    cond = wait_for(lambda: k.condition("mqttbridge", "locked", "Accepted").get("reason") == "SecretMissing"
                    and k.condition("mqttbridge", "locked", "Accepted"), msg="missing Secret reported")  # fmt: skip
    assert "spec.remote.passwordSecretRef" in cond["message"] and "locked-pw" in cond["message"]
    assert [b["name"] for b in config_of(k)["bridges"]] == ["cloud"]
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "locked-pw"},
             "stringData": {"password": "s3cret"}})  # fmt: skip
    k.patch("mqttbridge", "locked", {"spec": {"persist": True}})  # (a change: reconcile now)
    wait_for(lambda: [b["name"] for b in config_of(k)["bridges"]] == ["cloud", "locked"], msg="rendered")
    locked = config_of(k)["bridges"][1]
    assert locked["remote"]["password_file"] == "/etc/fleetmq/bridge-secrets/locked.password"

    def copied() -> str | None:
        data = (k.get("secret", "edge-bridge-secrets").get("data") or {}).get("locked.password")
        return base64.b64decode(data).decode() if data else None

    wait_for(lambda: copied() == "s3cret", msg="the password copied into the fleet's bridge Secret")
    assert k.get("statefulset", "edge")["spec"]["template"] == template, "a bridge changed the pods' template"
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "locked-pw"},
             "stringData": {"password": "rotated"}})  # fmt: skip
    wait_for(lambda: copied() == "rotated", msg="the rotated password copied at a resync")
    # a second bridge to the same remote under locked's client id (edge-locked, its default) is refused
    k.apply(bridge("twin", remote={"host": "h", "clientId": "edge-locked"}))
    cond = wait_for(lambda: k.condition("mqttbridge", "twin", "Accepted").get("reason") == "SessionConflict"
                    and k.condition("mqttbridge", "twin", "Accepted"), msg="the session conflict reported")  # fmt: skip
    assert (
        cond["message"] == "spec.remote.clientId: bridge locked already connects to h:1883 as 'edge-locked'"
    )
    assert [b["name"] for b in config_of(k)["bridges"]] == ["cloud", "locked"]
    k("delete", "mqttbridge", "cloud")
    wait_for(lambda: [b["name"] for b in config_of(k)["bridges"]] == ["locked"], msg="deleted bridge dropped")


@pytest.mark.timeout(300)
def test_a_pod_template_the_api_server_refuses_shows_in_degraded(k, run_operator, control_plane):
    """A StatefulSet is accepted with a serviceAccountName that does not exist; each of its pods is then
    refused (the ServiceAccount admission plugin), which only its FailedCreate events say. The fleet's
    Degraded condition says it, naming the StatefulSet and the API server's words, until it is fixed."""
    if not control_plane.controllers:
        pytest.skip("needs kube-controller-manager (make envtest)")
    run_operator()
    k.apply(fleet(replicas=1, pod={"serviceAccountName": "no-such-account"}))
    k.apply(zone())
    cond = wait_for(
        lambda: (c := k.condition("brokerfleet", "edge", "Degraded")).get("reason") == "FailedCreate" and c,
        timeout=90,
        msg="Degraded: FailedCreate",
    )
    assert cond["status"] == "True", cond
    assert "StatefulSet edge: FailedCreate" in cond["message"] and "no-such-account" in cond["message"], cond
    # fixed: the account is gone from the pod template (both of its fields: the server would restore
    # serviceAccountName from the deprecated serviceAccount), the pod is made, and Degraded clears
    k.patch("brokerfleet", "edge", {"spec": {"pod": None}})
    wait_for(lambda: k.get("pod", "edge-0"), timeout=120, msg="the pod made once the template is fixed")
    template = k.get("statefulset", "edge")["spec"]["template"]["spec"]
    assert "serviceAccountName" not in template and "serviceAccount" not in template, template
    wait_for(
        lambda: k.condition("brokerfleet", "edge", "Degraded").get("status") == "False",
        timeout=120,
        msg="Degraded cleared once the pod exists",
    )
