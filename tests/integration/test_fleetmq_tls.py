"""TLS listeners: certificates the test makes, real paho clients over TLS, client-certificate checks."""

from __future__ import annotations

import queue
import socket
import ssl
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support import free_port

from .harness import HOST, MOSQUITTO, uid

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


def tls_broker(start_broker, pki, zone: dict | None = None, **listener):
    """A broker with a tcp listener and a tls one (the test PKI's server certificate); (broker, tls port)."""
    port = free_port()
    cert, key = pki["server"]
    return start_broker(
        {
            **({"zones": {"default": zone}} if zone is not None else {}),
            "listeners": [
                {"name": "mqtt", "zone": "default", "bind": f"{HOST}:0", "protocol": "tcp"},
                {"name": "mqtts", "zone": "default", "bind": f"{HOST}:{port}", "protocol": "tls",
                 "certfile": cert, "keyfile": key, **listener},
            ]
        }
    ), port  # fmt: skip


def tls_client(port: int, ca: str, cert: tuple[str, str] | None = None, version=mqtt.MQTTv5):
    got: queue.Queue[bytes] = queue.Queue()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=uid("tls"), protocol=version)
    c.tls_set(ca_certs=ca, certfile=cert[0] if cert else None, keyfile=cert[1] if cert else None,
              tls_version=ssl.PROTOCOL_TLS_CLIENT)  # fmt: skip
    c.on_message = lambda _c, _u, m: got.put(m.payload)
    c.connect(HOST, port)
    c.loop_start()
    return c, got


@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_tls_round_trip(start_broker, pki, version):
    _bp, port = tls_broker(start_broker, pki)
    c, got = tls_client(port, pki["ca"], version=version)
    try:
        topic = uid("tls/")
        c.subscribe(topic, 1)
        time.sleep(0.3)
        c.publish(topic, b"over tls", qos=1).wait_for_publish(5)
        assert got.get(timeout=5) == b"over tls"
    finally:
        c.disconnect()
        c.loop_stop()


def test_tls_requires_client_certificate(start_broker, pki):
    _bp, port = tls_broker(start_broker, pki, cafile=pki["ca"], verify_peer=True)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=uid("nocert"), protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=pki["ca"], tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.connect(HOST, port)
        # TLS 1.3 reports a missing client certificate only at the first read
        for _ in range(20):
            rc = c.loop(timeout=0.1)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                raise ConnectionError(f"closed: {rc}")
        raise AssertionError("a client without a certificate stayed connected")
    c, got = tls_client(port, pki["ca"], cert=pki["client"])
    try:
        topic = uid("mtls/")
        c.subscribe(topic, 0)
        time.sleep(0.3)
        c.publish(topic, b"mutual", qos=0)
        assert got.get(timeout=5) == b"mutual"
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_refused(start_broker, pki):
    _bp, port = tls_broker(start_broker, pki)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki["ca"])
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection((HOST, port), timeout=5) as raw, pytest.raises(ssl.SSLError):
        ctx.wrap_socket(raw, server_hostname=HOST)


def test_rotated_certificate_is_used_without_restart(start_broker, pki, tmp_path):
    """cert-manager renews the Secret mounted as certfile/keyfile: new handshakes get the new certificate."""
    import shutil

    from tests.support import wait_until

    from .pki import make_pki

    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki["server"][0], crt)
    shutil.copy(pki["server"][1], key)
    bp, port = tls_broker(start_broker, {"server": (str(crt), str(key))})
    c, _ = tls_client(port, pki["ca"])
    (tmp_path / "renewed").mkdir()
    renewed = make_pki(tmp_path / "renewed")
    shutil.copy(renewed["server"][1], key)  # a half-rotated pair is refused, the old one stays
    time.sleep(1.5)
    c2, _ = tls_client(port, pki["ca"])
    c2.disconnect()
    c2.loop_stop()
    assert bp.metric("fleetmq_config_reload_errors_total") >= 1
    shutil.copy(renewed["server"][0], crt)

    def handshake_with(ca: str) -> bool:
        ctx = ssl.create_default_context(cafile=ca)
        try:
            with (
                socket.create_connection((HOST, port), timeout=5) as raw,
                ctx.wrap_socket(raw, server_hostname=HOST),
            ):
                return True
        except ssl.SSLError:
            return False

    wait_until(lambda: handshake_with(renewed["ca"]), timeout=10, msg="renewed certificate served")
    assert not handshake_with(pki["ca"])
    assert c.is_connected()  # the connection made before the rotation goes on
    c.disconnect()
    c.loop_stop()


def tls_raw(port: int, pki, cert: tuple[str, str] | None, version: int = 5):
    """A raw MQTT client over TLS (reason codes visible), with a client certificate if given."""
    from .mqttraw import RawClient

    ctx = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        ctx.load_cert_chain(*cert)
    c = RawClient(HOST, port, version=version)
    c.sock = ctx.wrap_socket(c.sock, server_hostname=HOST)
    return c


@pytest.mark.parametrize("verify_peer", [True, False])
def test_certificate_common_name_is_the_username(start_broker, raw_clients, pki, tmp_path, verify_peer):
    """peer_cert_as_username: cn: a verified certificate authenticates the client as the user its common
    name maps to (cert_users), whose own rules then apply; the CONNECT's credentials are not used."""
    from .harness import passwd
    from .mqttraw import PUBACK, PUBLISH

    users = tmp_path / "users"
    passwd(users, "alice", "wonderland")
    zone = {
        "users_file": str(users),
        "allow_anonymous": False,
        "cert_users": {"client": "device-7"},  # the test PKI's client certificate has CN "client"
        "user_acl": {
            "device-7": [{"permission": "allow", "action": "publish", "filter": "devices/%u/#"}],
            "alice": [{"permission": "allow", "action": "publish", "filter": "devices/#"}],
        },
        "acl": [{"permission": "deny", "action": "publish", "filter": "devices/#"}],
    }
    bp, port = tls_broker(start_broker, pki, zone, cafile=pki["ca"], verify_peer=verify_peer,
                          peer_cert_as_username="cn")  # fmt: skip
    watch = raw_clients(bp, 5)
    watch.connect(uid("watch"), username="alice", password=b"wonderland")
    watch.subscribe([("devices/#", 0)])
    device = tls_raw(port, pki, pki["client"])
    # no username, a wrong password: neither matters, the certificate decides
    assert device.connect(uid("dev"), username="alice", password=b"wrong").reason == 0
    for topic in ("devices/device-7/t", "devices/device-8/t", "devices/alice/t"):
        device.publish(topic, topic.encode(), qos=1)
    assert [a.reason for a in device.recv_n(3, timeout=5, ptype=PUBACK)] == [0, 0x87, 0x87]
    assert [p.payload for p in watch.recv_all(1.0) if p.type == PUBLISH] == [b"devices/device-7/t"]
    if not verify_peer:  # without a certificate: the CONNECT's credentials, checked as on any listener
        anon = tls_raw(port, pki, None)
        assert anon.connect(uid("anon"), check=False).reason == 0x87
        alice = tls_raw(port, pki, None)
        assert alice.connect(uid("a"), username="alice", password=b"wonderland").reason == 0
        alice.publish("devices/device-8/t", b"by alice", qos=1)
        assert alice.expect(PUBACK).reason == 0


def test_peer_cert_as_username_needs_a_ca(tmp_path):
    from fleetmq.broker.config import ConfigError, load_config

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "listeners: [{name: t, bind: '127.0.0.1:0', protocol: tls, certfile: c, keyfile: k, "
        "peer_cert_as_username: cn}]\n"
    )
    with pytest.raises(ConfigError, match=r"listeners\.0\.peer_cert_as_username: needs cafile"):
        load_config(cfg)


def test_known_certificate_users_only_and_removing_one_revokes_its_certificate(
    start_broker, raw_clients, pki, tmp_path
):
    """certificate_users: known: a verified certificate is only a user the zone knows (cert_users, or a
    username of its users file). Removing the user in a reload disconnects its connected client with 0x87
    at once, and refuses its next CONNECT with 0x87; a v3.1.1 client's connection is closed."""
    import json

    from tests.support import wait_until

    from .harness import passwd, rewrite
    from .mqttraw import CONNACK, DISCONNECT, PINGRESP, pingreq

    users = tmp_path / "users"
    passwd(users, "alice", "wonderland")
    zone = {"users_file": str(users), "allow_anonymous": False, "certificate_users": "known",
            "cert_users": {"client": "device-7"}}  # fmt: skip
    bp, port = tls_broker(start_broker, pki, zone, cafile=pki["ca"], verify_peer=True,
                          peer_cert_as_username="cn")  # fmt: skip
    v5 = tls_raw(port, pki, pki["client"])
    assert v5.connect(uid("dev")).reason == 0
    v3 = tls_raw(port, pki, pki["client"], version=4)
    assert v3.connect(uid("dev3")).reason == 0
    alice = raw_clients(bp, 5)
    alice.connect(uid("a"), username="alice", password=b"wonderland")

    def config_hash() -> str:
        return json.loads(bp.http_get("/readyz")[1])["config_hash"]

    before = config_hash()
    rewrite(bp, lambda cfg: cfg["zones"]["default"].update(cert_users={}))
    wait_until(lambda: config_hash() != before, timeout=10, msg="config reloaded")
    closed, seen = v5.wait_closed(timeout=5)
    assert closed and [(p.type, p.reason) for p in seen] == [(DISCONNECT, 0x87)]
    closed, seen = v3.wait_closed(timeout=5)
    assert closed and not seen
    again = tls_raw(port, pki, pki["client"])
    assert again.connect(uid("dev"), check=False).reason == 0x87
    alice.send(pingreq())  # a password user of the zone is left alone
    alice.expect(PINGRESP)
    assert "certificate 'client' is no user of zone default any more" in bp.log()

    # a username of the users file is a known user too
    passwd(users, "client", "unused")
    before = config_hash()
    rewrite(bp, lambda cfg: cfg["zones"]["default"].update(max_inflight=7))  # (a reload reads the file)
    wait_until(lambda: config_hash() != before, timeout=10, msg="config reloaded")
    back = tls_raw(port, pki, pki["client"])
    packet = back.connect(uid("dev"))
    assert packet.type == CONNACK and packet.reason == 0
