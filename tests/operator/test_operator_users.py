"""MqttUsers through a real kube-apiserver: rendered into the fleet's users Secret and config without
touching the pods, a generated password made once, what is wrong said in the status; and, with real
brokers running what the operator rendered, a user connecting with its password and confined by its rules,
and an mTLS client mapped to its user by the certificate's common name."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
import yaml
from fleetmq.operator import render

from tests.integration.harness import uid
from tests.integration.mqttraw import CONNACK, PUBACK, PUBLISH, RawClient
from tests.support import free_port

from .conftest import fleet, user, wait_for, zone
from .support import config_of, readyz, start_pod


def zone_cfg(k, name: str = "external") -> dict:
    return (config_of(k).get("zones") or {}).get(name) or {}


def secret_data(k, name: str) -> dict[str, str]:
    return {
        key: base64.b64decode(v).decode()
        for key, v in ((k.get("secret", name) or {}).get("data") or {}).items()
    }


def test_users_are_rendered_live_with_a_generated_password_and_their_problems_said(k, run_operator):
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: zone_cfg(k), msg="the zone rendered")
    template = wait_for(lambda: k.get("statefulset", "edge"), msg="statefulset")["spec"]["template"]
    rules = [{"permission": "allow", "action": "publish", "filter": "devices/%u/#"}]
    k.apply(user("sensor", acl=rules, certificateCommonName="sensor.example"))
    wait_for(lambda: zone_cfg(k).get("user_acl", {}).get("sensor"), msg="the user's rules rendered")
    ext = zone_cfg(k)
    assert ext["cert_users"] == {"sensor.example": "sensor"}
    assert ext["user_acl"]["sensor"] == [rules[0]]
    # its password, generated once into sensor-credentials (owned by the MqttUser), hashed into the fleet's
    # users Secret, whose file the config pins
    creds = wait_for(lambda: secret_data(k, "sensor-credentials"), msg="generated password")
    assert creds["username"] == "sensor" and len(creds["password"]) >= 24
    owner = k.get("secret", "sensor-credentials")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("MqttUser", k.get("mqttuser", "sensor")["metadata"]["uid"])
    users_file = wait_for(lambda: secret_data(k, "edge-mqttusers").get("external"), msg="users file")
    name, _, encoded = users_file.strip().partition(":")
    from fleetmq.broker.auth import verify_password

    assert name == "sensor" and verify_password(creds["password"].encode(), encoded)
    assert ext["users_files"][0]["path"] == "/etc/fleetmq/fleet-users/external"
    st = wait_for(lambda: (s := (k.get("mqttuser", "sensor") or {}).get("status")) and s.get("zones") and s,
                  msg="user status")  # fmt: skip
    assert (st["username"], st["zones"], st["secretName"]) == ("sensor", ["external"], "sensor-credentials")
    assert k.condition("mqttuser", "sensor", "Accepted")["status"] == "True"
    # the operator's next passes keep the same hash (no new salt each time: the Secret stays as it is)
    before = k.get("secret", "edge-mqttusers")["metadata"]["resourceVersion"]
    k.patch("brokerfleet", "edge", {"spec": {"logLevel": "debug"}})
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "debug",
             msg="reconciled")  # fmt: skip
    assert k.get("secret", "edge-mqttusers")["metadata"]["resourceVersion"] == before
    k.patch("brokerfleet", "edge", {"spec": {"logLevel": "info"}})
    wait_for(lambda: k.get("statefulset", "edge")["spec"]["template"] == template, msg="template back")

    # a password Secret that does not exist, with generatePassword false: SecretMissing, naming the field
    k.apply(user("locked", passwordSecretRef={"name": "locked-pw"}, generatePassword=False))
    cond = wait_for(lambda: k.condition("mqttuser", "locked", "Accepted").get("reason") == "SecretMissing"
                    and k.condition("mqttuser", "locked", "Accepted"), msg="SecretMissing")  # fmt: skip
    assert cond["message"] == "spec.passwordSecretRef: Secret locked-pw not found"
    assert k.condition("mqttuser", "locked", "Applied")["status"] == "False"
    assert k.get("secret", "locked-pw") is None  # never created when not asked to
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "locked-pw"},
             "stringData": {"password": "s3cret"}})  # fmt: skip
    k.patch("mqttuser", "locked", {"spec": {"acl": []}})  # (a change: reconcile now)
    wait_for(lambda: "locked:" in secret_data(k, "edge-mqttusers").get("external", ""), msg="rendered")
    assert secret_data(k, "locked-pw") == {"password": "s3cret"}  # an existing Secret is never written

    # a zone the fleet does not serve, a username already taken
    k.apply(user("wide", zones=["external", "nowhere"]))
    cond = wait_for(lambda: k.condition("mqttuser", "wide", "Accepted").get("reason") == "UnknownZone"
                    and k.condition("mqttuser", "wide", "Accepted"), msg="UnknownZone")  # fmt: skip
    assert cond["message"] == "spec.zones: fleet edge serves no zone nowhere"
    assert k.get("mqttuser", "wide")["status"]["zones"] == ["external"]  # rendered where it can be
    k.apply(user("twin", username="sensor"))
    cond = wait_for(lambda: k.condition("mqttuser", "twin", "Accepted").get("reason") == "UsernameConflict"
                    and k.condition("mqttuser", "twin", "Accepted"), msg="UsernameConflict")  # fmt: skip
    assert cond["message"] == "zone external: MqttUser sensor already has username 'sensor'"
    # a user of a fleet that does not exist
    k.apply(user("stray", fleet_name="nofleet"))
    wait_for(lambda: k.condition("mqttuser", "stray", "Accepted").get("reason") == "FleetNotFound",
             msg="FleetNotFound")  # fmt: skip

    # none of it rolled the pods; deleting a user takes it out of the config
    assert k.get("statefulset", "edge")["spec"]["template"] == template
    k("delete", "mqttuser", "sensor")
    wait_for(lambda: "sensor" not in zone_cfg(k).get("user_acl", {}), msg="deleted user dropped")
    # the username is free: the younger user that wanted it has it now
    wait_for(lambda: k.condition("mqttuser", "twin", "Accepted").get("status") == "True", msg="twin accepted")
    k("delete", "mqttuser", "twin")
    wait_for(
        lambda: "sensor:" not in secret_data(k, "edge-mqttusers").get("external", ""), msg="hash dropped"
    )


def tls_raw(port: int, pki: dict, cert: tuple[str, str] | None) -> RawClient:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        ctx.load_cert_chain(*cert)
    c = RawClient("127.0.0.1", port, version=5, timeout=5)
    c.sock = ctx.wrap_socket(c.sock, server_hostname="127.0.0.1")
    return c


def mount(k, config_text: str, root: Path) -> str:
    """What the kubelet does for a broker pod: the fleet's users Secret and the listener's TLS Secret as
    files, under `root` instead of /etc/fleetmq (the config's paths are moved there)."""
    base = root / "etc-fleetmq"
    for zone_name, text in secret_data(k, "edge-mqttusers").items():
        (base / "fleet-users").mkdir(parents=True, exist_ok=True)
        (base / "fleet-users" / zone_name).write_text(text)
    for key, text in secret_data(k, "edge-tls").items():
        (base / "tls" / "edge-tls").mkdir(parents=True, exist_ok=True)
        (base / "tls" / "edge-tls" / key).write_text(text)
    return config_text.replace(render.CONFIG_DIR + "/", f"{base}/")


@pytest.mark.redis
def test_a_user_connects_with_its_password_and_a_certificate_maps_to_its_user(
    k, run_operator, redis_server, tmp_path, pki
):
    mqtt_port, mqtts_port, metrics_port = free_port(), free_port(), free_port()
    run_operator()
    read = lambda path: Path(path).read_text()  # noqa: E731
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-tls"}, "type": "kubernetes.io/tls",
             "stringData": {"tls.crt": read(pki["server"][0]), "tls.key": read(pki["server"][1]),
                            "ca.crt": read(pki["ca"])}})  # fmt: skip
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port}))
    k.apply(zone(
        listeners=[{"name": "mqtt", "port": mqtt_port},
                   {"name": "mqtts", "port": mqtts_port, "protocol": "tls", "tlsSecretRef": {"name": "edge-tls"},
                    "verifyPeer": True, "peerCertAsUsername": "cn"}],
        authentication={"allowAnonymous": False},
        acl=[{"permission": "deny", "action": "publish", "filter": "devices/#"}],
    ))  # fmt: skip
    own = [{"permission": "allow", "action": "publish", "filter": "devices/%u/#"}]
    k.apply(user("sensor", acl=own))
    # the test PKI's client certificate has the common name "client"
    k.apply(user("gateway", generatePassword=False, certificateCommonName="client", acl=own))
    wait_for(lambda: set(zone_cfg(k).get("user_acl", {})) == {"sensor", "gateway"}
             and zone_cfg(k).get("cert_users"), msg="both users rendered")  # fmt: skip
    password = wait_for(
        lambda: secret_data(k, "sensor-credentials").get("password"), msg="generated password"
    )
    wait_for(lambda: "sensor:" in secret_data(k, "edge-mqttusers").get("external", ""), msg="users file")
    config_path = tmp_path / "broker.yaml"
    config_path.write_text(mount(k, k.get("configmap", "edge-config")["data"][render.CONFIG_KEY], tmp_path))
    bp = start_pod(config_path, "edge-0", mqtt_port, metrics_port, tmp_path)
    try:
        first = readyz(metrics_port)["config_hash"]

        def connack(**kw) -> int:
            c = RawClient("127.0.0.1", mqtt_port, version=5, timeout=5)
            try:
                return c.connect(uid("c"), check=False, **kw).reason
            finally:
                c.close()

        assert connack() == 0x87  # anonymous clients refused
        assert connack(username="sensor", password=b"wrong") == 0x86
        assert connack(username="gateway", password=b"") == 0x86  # a certificate-only user has no password
        watch = RawClient("127.0.0.1", mqtt_port, version=5, timeout=5)
        assert watch.connect(uid("w"), username="sensor", password=password.encode()).type == CONNACK
        watch.subscribe([("devices/#", 0)])
        sensor = RawClient("127.0.0.1", mqtt_port, version=5, timeout=5)
        sensor.connect(uid("s"), username="sensor", password=password.encode())
        gateway = tls_raw(mqtts_port, pki, pki["client"])
        assert gateway.connect(uid("g")).reason == 0  # no username: the certificate names the user
        attempts = [(sensor, "devices/sensor/t", 0), (sensor, "devices/gateway/t", 0x87),
                    (gateway, "devices/gateway/t", 0), (gateway, "devices/sensor/t", 0x87)]  # fmt: skip
        for client, topic, reason in attempts:  # each user's own rule before the zone's deny
            client.publish(topic, topic.encode(), qos=1)
            assert client.expect(PUBACK).reason == reason, topic
        got = [p.payload for p in watch.recv_all(1.0) if p.type == PUBLISH]
        assert got == [b"devices/sensor/t", b"devices/gateway/t"]

        # a rule changed through the apiserver reaches the running broker, on the same connections
        k.patch("mqttuser", "sensor", {"spec": {"acl": [{"permission": "allow", "action": "publish",
                                                          "filter": "devices/#"}]}})  # fmt: skip
        text = wait_for(lambda: (t := k.get("configmap", "edge-config")["data"][render.CONFIG_KEY])
                        and "devices/#" in str(yaml.safe_load(t)["zones"]["external"]["user_acl"]["sensor"])
                        and t, msg="re-rendered")  # fmt: skip
        config_path.write_text(mount(k, text, tmp_path))
        wait_for(lambda: readyz(metrics_port)["config_hash"] != first, msg="the broker applied it")
        sensor.publish("devices/gateway/t2", b"now allowed", qos=1)
        assert sensor.expect(PUBACK).reason == 0
        assert [p.payload for p in watch.recv_all(1.0) if p.type == PUBLISH] == [b"now allowed"]
        assert bp.alive() and bp.metric("fleetmq_config_reload_errors_total") == 0
    finally:
        bp.stop()
