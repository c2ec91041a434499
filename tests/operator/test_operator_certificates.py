"""Certificates the operator issues, through a real kube-apiserver and a real broker running what it
rendered: a listener's server certificate and an MqttUser's client certificate from the fleet's CA, a
10-minute validity renewed with the connection made before staying up, and a deleted user's certificate
refused; with an issuer named and no cert-manager in the cluster, the zone waits and says why."""

from __future__ import annotations

import json
import socket
import ssl
import time

import pytest
import yaml
from cryptography import x509
from fleetmq.operator import render

from tests.integration.harness import uid
from tests.integration.mqttraw import CONNACK, DISCONNECT, PINGRESP, PUBACK, pingreq
from tests.support import free_port

from .conftest import fleet, user, wait_for, zone
from .support import mount_tls, readyz, secret_bytes, start_pod, tls_client


def serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@pytest.mark.redis
def test_issued_certificates_authenticate_renew_without_dropping_and_are_revoked_with_the_user(
    k, run_operator, redis_server, tmp_path, kube_namespace
):
    mqtts_port, metrics_port = free_port(), free_port()
    run_operator()
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port}))
    k.apply(zone(
        listeners=[{"name": "mqtts", "port": mqtts_port, "protocol": "tls", "verifyPeer": True,
                    "peerCertAsUsername": "cn", "tls": {"duration": "10m", "renewBefore": "570s"}}],
        authentication={"allowAnonymous": False},
        acl=[{"permission": "allow", "action": "publish", "filter": "devices/%u/#"},
             {"permission": "deny", "action": "publish", "filter": "#"}],
    ))  # fmt: skip
    k.apply(user("dev-1", type="tls", tls={"duration": "10m", "renewBefore": "570s"}))
    ca = wait_for(lambda: secret_bytes(k, "edge-ca"), msg="the fleet's CA")
    server = wait_for(lambda: secret_bytes(k, "external-mqtts-tls"), msg="the listener's certificate")
    device = wait_for(lambda: secret_bytes(k, "dev-1-tls"), msg="the user's certificate")
    assert server["ca.crt"] == device["ca.crt"] == ca["tls.crt"]
    cert = x509.load_pem_x509_certificate(device["tls.crt"])
    assert cert.subject.rfc4514_string() == "CN=dev-1"
    assert k.get("secret", "dev-1-tls")["type"] == "kubernetes.io/tls"
    owners = {n: k.get("secret", n)["metadata"]["ownerReferences"][0]["kind"]
              for n in ("edge-ca", "external-mqtts-tls", "dev-1-tls")}  # fmt: skip
    assert owners == {"edge-ca": "BrokerFleet", "external-mqtts-tls": "MqttZone", "dev-1-tls": "MqttUser"}
    assert not k.get("secret", "dev-1-credentials")  # a certificate user gets no generated password
    wait_for(lambda: k.condition("mqttuser", "dev-1", "Accepted").get("status") == "True", msg="accepted")

    files = tmp_path / "device"
    files.mkdir()
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (files / key).write_bytes(device[key])
    device_cert = (files / "tls.crt", files / "tls.key")
    hostname = f"edge-external-mqtts.{kube_namespace}.svc"  # the Service's name is in the certificate
    config_path = tmp_path / "broker.yaml"
    config_path.write_text(mount_tls(k, tmp_path, ["external-mqtts-tls"]))
    bp = start_pod(config_path, "edge-0", mqtts_port, metrics_port, tmp_path)
    try:
        c = tls_client(mqtts_port, files / "ca.crt", device_cert, hostname)
        assert c.connect(uid("d")).type == CONNACK  # no username: the certificate is the user
        c.publish("devices/dev-1/t", b"x", qos=1)
        assert c.expect(PUBACK).reason == 0x10  # allowed (no subscriber has it)
        c.publish("devices/dev-2/t", b"x", qos=1)
        assert c.expect(PUBACK).reason == 0x87  # it is dev-1, confined by %u

        # renewal: due 30 s after issuance; a new key and certificate, the connection made before stays
        renewed = wait_for(lambda: (s := secret_bytes(k, "external-mqtts-tls"))["tls.crt"] != server["tls.crt"]
                           and s, timeout=60, msg="the listener's certificate renewed")  # fmt: skip
        assert renewed["tls.key"] != server["tls.key"] and renewed["ca.crt"] == ca["tls.crt"]
        wait_for(lambda: secret_bytes(k, "dev-1-tls")["tls.crt"] != device["tls.crt"], timeout=30,
                 msg="the user's certificate renewed")  # fmt: skip
        events = k("get", "events", "-o", "jsonpath={.items[*].reason}").stdout
        assert "Issued" in events and "Renewed" in events
        first = readyz(metrics_port)["config_hash"]
        config_path.write_text(mount_tls(k, tmp_path, ["external-mqtts-tls"]))  # the kubelet brings it

        def serves_renewed() -> bool:
            ctx = ssl.create_default_context(cafile=str(files / "ca.crt"))
            ctx.load_cert_chain(str(device_cert[0]), str(device_cert[1]))
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", mqtts_port)),
                                 server_hostname=hostname) as s:  # fmt: skip
                der = s.getpeercert(binary_form=True)
            return x509.load_der_x509_certificate(der).serial_number == serial(renewed["tls.crt"])

        wait_for(serves_renewed, timeout=15, msg="new handshakes get the renewed certificate")
        c.send(pingreq())
        assert c.expect(PINGRESP).type == PINGRESP  # the connection made before is still up

        # deleting the user revokes its certificate: its client is disconnected, its next CONNECT refused
        t0 = time.monotonic()
        k("delete", "mqttuser", "dev-1")
        wait_for(lambda: "dev-1" not in (yaml.safe_load(k.get("configmap", "edge-config")["data"]
                 [render.CONFIG_KEY])["zones"]["external"].get("cert_users") or {}), msg="re-rendered")  # fmt: skip
        # the broker pod (kwok's) is told, so its kubelet brings the changed config now, not in a minute
        cm_hash = k.get("configmap", "edge-config")["metadata"]["annotations"][render.A_CONFIG_HASH]

        def pods_hashes() -> list[str | None]:
            pods = json.loads(k("get", "pods", "-l", "fleetmq.io/fleet=edge", "-o", "json").stdout)["items"]
            return [(p["metadata"].get("annotations") or {}).get(render.A_CONFIG_HASH) for p in pods]

        wait_for(lambda: pods_hashes() == [cm_hash], msg="the pod annotated with the new config")
        config_path.write_text(mount_tls(k, tmp_path, ["external-mqtts-tls"]))
        wait_for(lambda: readyz(metrics_port)["config_hash"] != first, msg="the broker applied it")
        closed, seen = c.wait_closed(timeout=10)
        assert closed and [(p.type, p.reason) for p in seen] == [(DISCONNECT, 0x87)]
        again = tls_client(mqtts_port, files / "ca.crt", device_cert, hostname)
        assert again.connect(uid("d"), check=False).reason == 0x87
        assert time.monotonic() - t0 < 30
        assert bp.alive() and bp.metric("fleetmq_config_reload_errors_total") == 0
    finally:
        bp.stop()


def test_a_listener_whose_issuer_cannot_issue_holds_its_zone_back_and_says_why(k, run_operator):
    """tls.issuer names a cert-manager issuer that cannot issue: the zone is not rendered with a listener
    whose Secret cannot come (a pod would wait for it forever), and its status says why; the zone's earlier
    version keeps running. (This control plane has no cert-manager unless test_operator_certmanager.py ran
    in the same session before: then its CRDs are there and the issuer named does not exist.)"""
    cert_manager_crds = k("get", "crd", "certificates.cert-manager.io", check=False).returncode == 0
    run_operator()
    k.apply(fleet())
    k.apply(zone())
    wait_for(lambda: "external" in (yaml.safe_load(((k.get("configmap", "edge-config") or {}).get("data") or {})
             .get(render.CONFIG_KEY) or "{}") or {}).get("zones", {}), msg="the zone rendered")  # fmt: skip
    k.apply(zone(listeners=[{"name": "mqtt", "port": 1883},
                            {"name": "mqtts", "port": 8883, "protocol": "tls",
                             "tls": {"issuer": {"name": "acme", "kind": "ClusterIssuer"}}}]))  # fmt: skip
    cond = wait_for(lambda: (c := k.condition("mqttzone", "external", "Accepted")).get("reason")
                    == "CertificatePending" and c, msg="CertificatePending")  # fmt: skip
    if cert_manager_crds:
        assert cond["message"].startswith("listener mqtts: waiting for cert-manager to issue Certificate "
                                          "external-mqtts-tls"), cond  # fmt: skip
    else:
        assert cond["message"] == (
            "listener mqtts: tls.issuer needs cert-manager: the cluster serves no Certificate (cert-manager.io/v1)"
        )
    config = yaml.safe_load(k.get("configmap", "edge-config")["data"][render.CONFIG_KEY])
    assert [lst["name"] for lst in config["listeners"]] == ["external/mqtt"]  # the version applied before
    assert not k.get("secret", "edge-ca")  # nothing of the fleet's own CA was needed
