"""Certificates from cert-manager: its real controllers (built from its Go module, scripts/certmanager.sh)
beside the operator on a real kube-apiserver. A listener's `tls.issuer` and an MqttUser of type tls get
their certificates through cert-manager Certificates the operator writes, and a broker running what the
operator rendered accepts the device's certificate as its user."""

from __future__ import annotations

import pytest
import yaml
from cryptography import x509
from fleetmq.operator import render

from tests.integration.harness import uid
from tests.integration.mqttraw import CONNACK, PUBACK
from tests.support import free_port

from .conftest import fleet, user, wait_for, zone
from .support import mount_tls, secret_bytes, start_pod, tls_client

pytestmark = pytest.mark.redis


def _issuers(k) -> None:
    """A CA of the namespace, the way cert-manager's docs bootstrap one: a SelfSigned Issuer signs a CA
    Certificate, whose Secret a CA Issuer then signs with. Every field given: there is no webhook here."""
    key = {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never", "encoding": "PKCS1"}
    k.apply({"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "bootstrap"},
             "spec": {"selfSigned": {}}})  # fmt: skip
    k.apply({"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "devices-ca"},
             "spec": {"isCA": True, "commonName": "devices CA", "secretName": "devices-ca",
                      "duration": "8760h", "renewBefore": "720h", "privateKey": key,
                      "issuerRef": {"name": "bootstrap", "kind": "Issuer", "group": "cert-manager.io"}}})  # fmt: skip
    wait_for(lambda: secret_bytes(k, "devices-ca").get("tls.crt"), timeout=60, msg="the CA issued")
    k.apply({"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "devices"},
             "spec": {"ca": {"secretName": "devices-ca"}}})  # fmt: skip


def test_certificates_come_from_a_cert_manager_issuer_and_a_device_connects_with_its_own(
    k, run_operator, cert_manager, redis_server, tmp_path, kube_namespace
):
    mqtts_port, metrics_port = free_port(), free_port()
    _issuers(k)
    run_operator()
    issuer = {"name": "devices", "kind": "Issuer"}
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port}))
    k.apply(zone(
        listeners=[{"name": "mqtts", "port": mqtts_port, "protocol": "tls", "verifyPeer": True,
                    "peerCertAsUsername": "cn", "tls": {"issuer": issuer, "duration": "24h"}}],
        authentication={"allowAnonymous": False},
    ))  # fmt: skip
    k.apply(user("dev-1", type="tls", tls={"duration": "2h"}))
    # the operator's Certificates, as cert-manager reads them
    cert = wait_for(lambda: k.get("certificate", "external-mqtts-tls"), msg="the listener's Certificate")
    assert cert["spec"]["issuerRef"] == {"name": "devices", "kind": "Issuer", "group": "cert-manager.io"}
    assert cert["spec"]["dnsNames"][0] == "edge-external-mqtts"
    device_cert = wait_for(lambda: k.get("certificate", "dev-1-tls"), msg="the user's Certificate")
    assert (device_cert["spec"]["commonName"], device_cert["spec"]["duration"]) == ("dev-1", "7200s")
    # cert-manager issues both; the zone, held back until then, is rendered with its listener
    server = wait_for(lambda: secret_bytes(k, "external-mqtts-tls").get("tls.crt") and
                      secret_bytes(k, "external-mqtts-tls"), timeout=60, msg="cert-manager issued it")  # fmt: skip
    device = wait_for(lambda: secret_bytes(k, "dev-1-tls").get("tls.crt") and secret_bytes(k, "dev-1-tls"),
                      timeout=60, msg="cert-manager issued the user's")  # fmt: skip
    # cert-manager's Secrets get the owners of their Certificates: deleted with the zone or user, private
    # key and all (cert-manager by default leaves a Secret behind its deleted Certificate)
    for secret_name, kind in (("external-mqtts-tls", "MqttZone"), ("dev-1-tls", "MqttUser")):
        wait_for(lambda n=secret_name, kd=kind: any(o["kind"] == kd for o in
                 k.get("secret", n)["metadata"].get("ownerReferences") or []),
                 msg=f"Secret {secret_name} owned by its {kind}")  # fmt: skip
    ca = secret_bytes(k, "devices-ca")["tls.crt"]
    assert server["ca.crt"] == device["ca.crt"] == ca
    issued = x509.load_pem_x509_certificate(device["tls.crt"])
    assert issued.subject.rfc4514_string() == "CN=dev-1"
    assert issued.issuer == x509.load_pem_x509_certificate(ca).subject
    wait_for(lambda: k.condition("mqttzone", "external", "Accepted").get("status") == "True", msg="accepted")
    config = yaml.safe_load(k.get("configmap", "edge-config")["data"][render.CONFIG_KEY])
    assert [lst["name"] for lst in config["listeners"]] == ["external/mqtts"]
    assert not k.get("secret", "edge-ca")  # the fleet's own CA was not needed

    files = tmp_path / "device"
    files.mkdir()
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (files / key).write_bytes(device[key])
    config_path = tmp_path / "broker.yaml"
    config_path.write_text(mount_tls(k, tmp_path, ["external-mqtts-tls"]))
    bp = start_pod(config_path, "edge-0", mqtts_port, metrics_port, tmp_path)
    try:
        hostname = f"edge-external-mqtts.{kube_namespace}.svc"
        c = tls_client(mqtts_port, files / "ca.crt", (files / "tls.crt", files / "tls.key"), hostname)
        assert c.connect(uid("d")).type == CONNACK
        c.publish("t", b"x", qos=1)
        assert c.expect(PUBACK).reason == 0x10  # allowed (nobody subscribes)
    finally:
        bp.stop()

    # the user deleted: its Certificate goes with it (owned by the MqttUser)
    k("delete", "mqttuser", "dev-1")
    wait_for(lambda: not k.get("certificate", "dev-1-tls"), msg="the user's Certificate deleted")
    # a listener that stops asking: its Certificate is deleted by the operator
    k.apply(zone(listeners=[{"name": "mqtt", "port": 1883}], authentication={"allowAnonymous": False}))
    wait_for(lambda: not k.get("certificate", "external-mqtts-tls"), msg="the listener's Certificate deleted")
