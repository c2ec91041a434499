"""Certificates the operator gets: the fleet's CA and what it signs (operator/pki.py), which certificates a
fleet needs and from whom (render/certificates.py), and how a pending one holds a zone back."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fleetmq.operator import pki, render
from fleetmq.operator.crds import ListenerSpec, MqttUserSpec
from fleetmq.operator.render import certificates as certs
from pydantic import ValidationError

from .operator_support import fleet, user, zone

NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
TLS = {"name": "mqtts", "port": 8883, "protocol": "tls", "verifyPeer": True, "peerCertAsUsername": "cn"}


def test_the_fleet_ca_signs_server_and_client_certificates_a_tls_stack_accepts(tmp_path):
    """What pki issues is what Python's ssl (OpenSSL) accepts both ways: the server's names verified
    against the CA, the client's certificate verified by the server's context."""
    now = dt.datetime.now(dt.UTC)
    ca = pki.new_ca("fleetmq mq/edge CA", now)
    server = pki.issue(ca, pki.Wanted("svc", "server", 3600, 1200, ("svc", "svc.mq.svc")), now)
    client = pki.issue(ca, pki.Wanted("device-7", "client", 3600, 1200), now)
    paths = {}
    for name, data in {"ca": ca.cert_pem, "s.crt": server.cert_pem, "s.key": server.key_pem,
                       "c.crt": client.cert_pem, "c.key": client.key_pem}.items():  # fmt: skip
        (tmp_path / name).write_bytes(data)
        paths[name] = str(tmp_path / name)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(paths["s.crt"], paths["s.key"])
    srv.load_verify_locations(paths["ca"])
    srv.verify_mode = ssl.CERT_REQUIRED
    cli = ssl.create_default_context(cafile=paths["ca"])
    cli.load_cert_chain(paths["c.crt"], paths["c.key"])
    a, b = ssl.MemoryBIO(), ssl.MemoryBIO()
    c, d = ssl.MemoryBIO(), ssl.MemoryBIO()
    s_obj = srv.wrap_bio(a, b, server_side=True)
    c_obj = cli.wrap_bio(c, d, server_hostname="svc.mq.svc")
    for _ in range(10):  # pump the handshake between the two ends in memory
        for obj in (c_obj, s_obj):
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
        a.write(d.read())
        c.write(b.read())
    assert s_obj.getpeercert()["subject"] == ((("commonName", "device-7"),),)
    cert = x509.load_pem_x509_certificate(server.cert_pem)
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    assert (
        x509.load_pem_x509_certificate(ca.cert_pem)
        .extensions.get_extension_for_class(x509.BasicConstraints)
        .value.path_length
        == 0
    )


def test_renewal_falls_due_renew_before_the_end_or_at_once_when_anything_differs():
    ca = pki.new_ca("ca", NOW)
    wanted = pki.Wanted("svc", "server", 600, 540, ("svc", "svc.mq"))
    pair = pki.issue(ca, wanted, NOW)
    assert pki.renewal_due(pair.cert_pem, ca, wanted, NOW) == NOW + dt.timedelta(seconds=60)
    assert pki.renewal_due(None, ca, wanted, NOW) == NOW
    assert pki.renewal_due(b"garbage", ca, wanted, NOW) == NOW
    other_ca = pki.new_ca("ca", NOW)
    assert pki.renewal_due(pair.cert_pem, other_ca, wanted, NOW) == NOW  # the CA was replaced
    for changed in (
        pki.Wanted("svc", "server", 600, 540, ("svc",)),  # a name went
        pki.Wanted("other", "server", 600, 540, ("svc", "svc.mq")),
        pki.Wanted("svc", "client", 600, 540, ("svc", "svc.mq")),
        pki.Wanted("svc", "server", 3600, 540, ("svc", "svc.mq")),  # another duration
    ):
        assert pki.renewal_due(pair.cert_pem, ca, changed, NOW) == NOW, changed
    # renewBefore alone changing moves the date, not the certificate
    assert pki.renewal_due(
        pair.cert_pem, ca, pki.Wanted("svc", "server", 600, 300, wanted.dns_names), NOW
    ) == (NOW + dt.timedelta(seconds=300))


def test_listener_tls_and_user_type_tls_are_validated_as_the_crd_says():
    ok = ListenerSpec.model_validate({**TLS, "tls": {"duration": "10m", "renewBefore": "9m"}})
    assert ok.tls is not None and (ok.tls.duration, ok.tls.renew_before) == (600, 540)
    assert ListenerSpec.model_validate({**TLS, "tls": {}}).tls.renew_before == 30 * 86400  # a third of 90d
    for bad, message in (
        ({**TLS}, "needs tlsSecretRef or tls"),
        ({**TLS, "tls": {}, "tlsSecretRef": {"name": "x"}}, "exclude each other"),
        ({"name": "m", "port": 1883, "tls": {}}, "tls needs protocol tls or wss"),
        ({**TLS, "tls": {"duration": "4m"}}, "duration must be at least 300s"),
        ({**TLS, "tls": {"duration": "10m", "renewBefore": "10m"}}, "less than duration"),
        ({**TLS, "tls": {"issuer": {"name": "ca"}, "duration": "30m"}}, "at least 3600s"),
        ({**TLS, "tls": {"issuer": {"name": "ca"}, "duration": "2h", "renewBefore": "2m"}}, "at least 300s"),
    ):
        with pytest.raises(ValidationError, match=message):
            ListenerSpec.model_validate(bad)
    u = MqttUserSpec.model_validate({"fleetRef": {"name": "edge"}, "zones": ["z"], "type": "tls"})
    assert u.password_ref("dev") is None  # no generated password for a certificate user
    assert u.common_name("device-7") == "device-7"
    named = MqttUserSpec.model_validate(
        {"fleetRef": {"name": "edge"}, "zones": ["z"], "type": "tls", "certificateCommonName": "cn-7"}
    )
    assert named.common_name("device-7") == "cn-7"


def _needed(zones: list[dict], users: list[dict]):
    parsed = render.Fleet.parse(fleet())
    accepted, rejected = render.select_zones(parsed, zones)
    assert not rejected
    selected, _ = render.select_users(users, accepted)
    zone_objs = {z["metadata"]["name"]: {**z, "metadata": {**z["metadata"], "uid": "z-uid"}} for z in zones}
    return parsed, accepted, certs.needed(parsed, accepted, selected, zone_objs, {u["metadata"]["name"]: u
                                                                                 for u in users})  # fmt: skip


def test_a_fleet_needs_a_certificate_per_listener_with_tls_and_per_user_of_type_tls():
    listener = {**TLS, "tls": {"duration": "10m", "renewBefore": "9m", "dnsNames": ["mqtt.example.com"]}}
    z = zone("external", listeners=[{"name": "mqtt", "port": 1883}, listener])
    users = [user("dev-1", type="tls"), user("alice")]
    parsed, accepted, (needs, problems) = _needed([z], users)
    assert not problems
    by_secret = {n.secret: n for n in needs}
    assert set(by_secret) == {"external-mqtts-tls", "dev-1-tls"}
    server = by_secret["external-mqtts-tls"]
    assert server.wanted.dns_names == (
        "edge-external-mqtts", "edge-external-mqtts.mq", "edge-external-mqtts.mq.svc",
        "edge-external-mqtts.mq.svc.cluster.local", "*.edge-headless.mq.svc",
        "*.edge-headless.mq.svc.cluster.local", "mqtt.example.com",
    )  # fmt: skip
    assert (server.wanted.usage, server.issuer, server.owner["kind"]) == ("server", None, "MqttZone")
    client = by_secret["dev-1-tls"]
    assert (client.wanted.common_name, client.wanted.usage, client.owner["uid"]) == (
        "dev-1",
        "client",
        "uid-dev-1",
    )
    # the pods mount the listener's Secret and the broker reads it, with its ca.crt for verifyPeer
    out = render.render(parsed, accepted, users=render.select_users(users, accepted)[0])
    listeners = {lst["name"]: lst for lst in out.config["listeners"]}
    assert listeners["external/mqtts"]["certfile"] == "/etc/fleetmq/tls/external-mqtts-tls/tls.crt"
    assert listeners["external/mqtts"]["cafile"] == "/etc/fleetmq/tls/external-mqtts-tls/ca.crt"
    assert out.config["zones"]["external"]["cert_users"] == {"dev-1": "dev-1"}
    assert out.config["zones"]["external"]["certificate_users"] == "known"
    sts = next(m for m in out.manifests if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "edge")
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls-0", "secret": {"secretName": "external-mqtts-tls"}} in volumes


def test_with_an_issuer_a_cert_manager_certificate_and_users_take_their_zones_issuer():
    issuer = {"name": "fleet-ca", "kind": "ClusterIssuer"}
    listener = {**TLS, "tls": {"issuer": issuer, "duration": "24h", "renewBefore": "8h"}}
    z = zone("external", listeners=[listener])
    parsed, _, (needs, problems) = _needed([z], [user("dev-1", type="tls", tls={"duration": "48h"})])
    assert not problems
    by_secret = {n.secret: n for n in needs}
    cert = certs.certificate(parsed, by_secret["external-mqtts-tls"])
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["metadata"]["name"] == "external-mqtts-tls"
    spec = cert["spec"]
    assert spec["issuerRef"] == {"name": "fleet-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert (spec["secretName"], spec["duration"], spec["renewBefore"]) == (
        "external-mqtts-tls",
        "86400s",
        "28800s",
    )
    assert "server auth" in spec["usages"] and spec["dnsNames"][0] == "edge-external-mqtts"
    assert spec["secretTemplate"]["labels"]["fleetmq.io/fleet"] == "edge"
    client = certs.certificate(parsed, by_secret["dev-1-tls"])
    assert client["spec"]["commonName"] == "dev-1" and "client auth" in client["spec"]["usages"]
    assert client["spec"]["issuerRef"]["name"] == "fleet-ca" and "dnsNames" not in client["spec"]
    assert client["metadata"]["ownerReferences"][0]["kind"] == "MqttUser"
    # a common name over X.509's 64 characters cannot be issued: said, not attempted
    _, _, (_, problems) = _needed([z], [user("d" * 70, type="tls")])
    assert "at most 64 characters" in problems["d" * 70] and "certificateCommonName" in problems["d" * 70]
    assert len(pki.short_name("fleetmq CA " + "n" * 63 + "/edge")) == 64
    # two zones whose verifying listeners use different issuers: the user cannot have one
    other = zone("other", listeners=[{**TLS, "port": 8884, "tls": {}}], created="2024-01-02T00:00:00Z")
    _, _, (_, problems) = _needed([z, other], [user("dev-2", type="tls", zones=["external", "other"])])
    assert "different issuers: ClusterIssuer fleet-ca, the fleet's CA" in problems["dev-2"]


def test_a_zone_waiting_for_its_certificate_keeps_what_it_applied_or_waits():
    before = zone("external")
    waiting = zone("external", gen=2, listeners=[{"name": "mqtt", "port": 1883}, {**TLS, "tls": {}}])
    new = zone("fresh", listeners=[{**TLS, "port": 8884, "tls": {}}], created="2024-01-02T00:00:00Z")
    parsed = render.Fleet.parse(fleet())
    applied, _ = render.select_zones(parsed, [before])
    accepted, _ = render.select_zones(parsed, [waiting, new])
    missing = {"external-mqtts-tls": "not issued yet", "fresh-mqtts-tls": "not issued yet"}
    kept, held = render.hold_back(accepted, missing, {z.name: z for z in applied})
    assert [(z.name, z.generation) for z in kept] == [("external", 1)]
    assert held == {"external": "listener mqtts: not issued yet", "fresh": "listener mqtts: not issued yet"}
    assert render.hold_back(accepted, {}, {}) == (accepted, {})
    # the CA's Secret round-trips; a Secret without the keys is no key pair
    ca = pki.new_ca("ca", NOW)
    assert certs.key_pair(certs.ca_secret(parsed, ca)) == ca
    assert certs.key_pair({"data": {"tls.crt": "eA=="}}) is None
    assert x509.load_pem_x509_certificate(ca.cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
