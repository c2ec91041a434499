"""JWT authentication on a real broker process, its key set served over HTTP by the test and rotated.

Tokens are signed by PyJWT with keys made here (cryptography); clients are raw MQTT sockets, so the
reason codes are those on the wire.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from .harness import MOSQUITTO, uid
from .mqttraw import DISCONNECT, PUBACK

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")

V311, V5 = 4, 5


class Jwks:
    """An identity provider's key set: served at `url`, rotated by `rotate`; counts the requests."""

    def __init__(self) -> None:
        self.keys = {"k1": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
        self.requests = 0
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                jwks.requests += 1
                body = json.dumps({"keys": [jwks.jwk(kid) for kid in jwks.keys]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def jwk(self, kid: str) -> dict[str, object]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
        return {**public, "kid": kid, "alg": "RS256", "use": "sig"}

    def token(self, kid: str = "k1", **claims: object) -> bytes:
        claims.setdefault("exp", time.time() + 600)
        return jwt.encode(claims, self.keys[kid], algorithm="RS256", headers={"kid": kid}).encode()

    def rotate(self, kid: str) -> None:
        self.keys = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    j = Jwks()
    yield j
    j.close()


def jwt_zone(jwks: Jwks, **extra: object) -> dict[str, object]:
    return {
        "acl_default": "deny",
        "authentication": [{
            "mechanism": "jwt", "algorithms": ["RS256"], "jwks_url": jwks.url, "jwks_refresh_min": "1s",
            "verify_claims": {"sub": "%c"}, "acl_claim": "acl", **extra,
        }],
    }  # fmt: skip


DEVICE_RULES = [{"permission": "allow", "action": "all", "filter": "devices/%c/#"}]


@pytest.mark.parametrize("version", [V311, V5])
def test_a_valid_token_connects_and_its_acl_claim_holds(start_broker, raw_clients, jwks, version):
    bp = start_broker(zone_overrides=jwt_zone(jwks))
    cid = uid("dev")
    c = raw_clients(bp, version)
    c.connect(cid, username="device", password=jwks.token(sub=cid, acl=DEVICE_RULES))
    ack = c.subscribe([(f"devices/{cid}/cmd", 1), ("devices/other/cmd", 1)])
    assert ack.codes == [1, 0x87 if version == V5 else 0x80]
    c.publish(f"devices/{cid}/state", b"ok", qos=1, packet_id=1)
    c.publish("devices/other/state", b"no", qos=1, packet_id=2)
    acks = c.recv_n(2, ptype=PUBACK)
    if version == V5:  # (0x10: no subscriber, a success)
        assert acks[0].reason < 0x80 and acks[1].reason == 0x87, acks
    assert bp.metric("fleetmq_authentications_total", mechanism="jwt", result="allow") == 1


@pytest.mark.parametrize("version", [V311, V5])
def test_expired_foreign_and_misaddressed_tokens_are_refused_as_bad_credentials(
    start_broker, raw_clients, jwks, version
):
    bp = start_broker(zone_overrides=jwt_zone(jwks))
    cid = uid("dev")
    foreign = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tokens = {
        "expired": jwks.token(sub=cid, exp=time.time() - 10),
        "another key": jwt.encode({"sub": cid}, foreign, algorithm="RS256", headers={"kid": "k1"}).encode(),
        "sub is not the client id": jwks.token(sub="someone-else"),
    }
    for what, tok in tokens.items():
        ack = raw_clients(bp, version).connect(cid, check=False, username="device", password=tok)
        assert ack.reason == (0x86 if version == V5 else 4), what
    assert bp.metric("fleetmq_authentications_total", mechanism="jwt", result="deny") == 3


def test_a_rotated_key_set_is_used_without_a_restart(start_broker, raw_clients, jwks):
    bp = start_broker(zone_overrides=jwt_zone(jwks))
    cid = uid("dev")
    raw_clients(bp, V5).connect(cid, password=jwks.token(sub=cid))
    jwks.rotate("k2")  # the identity provider signs with a new key from now on
    time.sleep(1.1)  # (jwks_refresh_min: an unknown key id makes the broker fetch the set again)
    raw_clients(bp, V5).connect(cid, password=jwks.token("k2", sub=cid))
    assert jwks.requests == 2
    old = jwt.encode({"sub": cid, "exp": time.time() + 60}, rsa.generate_private_key(public_exponent=65537,
                     key_size=2048), algorithm="RS256", headers={"kid": "k1"}).encode()  # fmt: skip
    assert raw_clients(bp, V5).connect(cid, check=False, password=old).reason == 0x86


@pytest.mark.parametrize("version", [V311, V5])
def test_a_connection_ends_when_its_token_expires(start_broker, raw_clients, jwks, version):
    bp = start_broker(zone_overrides=jwt_zone(jwks, disconnect_after_expire=True))
    cid = uid("dev")
    c = raw_clients(bp, version)
    t0 = time.monotonic()
    c.connect(cid, username="device", password=jwks.token(sub=cid, exp=time.time() + 3))
    closed, seen = c.wait_closed(timeout=8)
    waited = time.monotonic() - t0
    assert closed and 2.0 <= waited <= 6.0, (closed, waited, seen)
    if version == V5:
        assert [(p.type, p.reason) for p in seen] == [(DISCONNECT, 0x87)]
    assert bp.metric("fleetmq_disconnects_total", reason="credentials_expired") == 1


def test_a_key_set_that_never_answers_refuses_connects_in_time_and_other_zones_go_on(
    start_broker, raw_clients
):
    """The identity provider accepts the connection and never answers: CONNECTs in its zone are refused
    (0x88 Server unavailable) once the fetch times out, and meanwhile a zone without it connects at once."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # (never accepted: the request is sent, no answer comes)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}/jwks.json"
    try:
        bp = start_broker({
            "listeners": [{"name": "jwt", "bind": "127.0.0.1:0", "zone": "default"},
                          {"name": "open", "bind": "127.0.0.1:0", "zone": "open"}],
            "zones": {"default": {"authentication": [{"mechanism": "jwt", "jwks_url": url}]}, "open": {}},
        })  # fmt: skip
        refused: list[tuple[int, float]] = []
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = jwt.encode({"a": 1}, key, algorithm="RS256", headers={"kid": "k1"}).encode()

        def device() -> None:
            c = raw_clients(bp, V5, timeout=15)
            t0 = time.monotonic()
            ack = c.connect(uid("dev"), check=False, timeout=15, password=token)
            refused.append((ack.reason, time.monotonic() - t0))

        waiting = threading.Thread(target=device)
        waiting.start()
        time.sleep(0.5)
        from .mqttraw import RawClient

        t0 = time.monotonic()
        with RawClient(bp.host, bp.ports["open"], version=V5) as other:
            other.connect(uid("other"))
        assert time.monotonic() - t0 < 1.0, "a zone without the key set waited for it"
        waiting.join(20)
        assert refused and refused[0][0] == 0x88 and refused[0][1] < 8, refused  # (the fetch gives up at 5 s)
        assert bp.metric("fleetmq_authentications_total", mechanism="jwt", result="unavailable") == 1
    finally:
        hole.close()
