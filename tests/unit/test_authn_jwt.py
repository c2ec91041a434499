"""The jwt authenticator and the chain (broker/authn), with tokens PyJWT signs with real keys."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fleetmq.broker.auth import Acl
from fleetmq.broker.authn.chain import IGNORED, Chain, Credentials, Decision, Verdict
from fleetmq.broker.authn.jwt import JwtAuthenticator, key_set
from fleetmq.broker.zones import AclRule, JwtAuthentication

NOW = time.time()  # (for the chain's `now` only: PyJWT checks exp and nbf against the clock itself)
RULES = [{"permission": "allow", "action": "all", "filter": "devices/%c/#"}]


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str) -> dict[str, object]:
    alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
    cls = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    return {**json.loads(cls.to_jwk(key.public_key())), "kid": kid, "alg": alg, "use": "sig"}


def token(key, claims: dict[str, object], kid: str | None = None, alg: str = "RS256") -> bytes:
    headers = {"kid": kid} if kid else None
    return jwt.encode({"exp": time.time() + 600, **claims}, key, algorithm=alg, headers=headers).encode()


def creds(password: bytes | None, client_id: str = "dev-1", username: str | None = "u") -> Credentials:
    return Credentials(client_id, username, password, "10.0.0.9")


def run(authenticator, c: Credentials, now: float = NOW) -> Decision:
    return asyncio.run(authenticator.authenticate(c, now))


@pytest.fixture(scope="module")
def keys():
    return rsa_key(), rsa_key()


@pytest.fixture
def pem(tmp_path, keys) -> Path:
    path = tmp_path / "pub.pem"
    path.write_bytes(keys[0].public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return path


def settings(**kw) -> JwtAuthentication:
    return JwtAuthentication.model_validate({"mechanism": "jwt", **kw})


def test_a_valid_token_allows_with_its_acl_claim_and_its_expiry(keys, pem):
    a = JwtAuthenticator(settings(public_key_file=str(pem), verify_claims={"sub": "%c"}, acl_claim="acl"))
    exp = time.time() + 60
    d = run(a, creds(token(keys[0], {"sub": "dev-1", "acl": RULES, "exp": exp})))
    assert d.verdict is Verdict.ALLOW and d.identity is not None
    assert d.identity.rules == (AclRule.model_validate(RULES[0]),) and d.identity.expires_at == exp
    # the rules come before the zone's, %c substituted
    acl = Acl([AclRule(permission="deny", filter="#")]).bind("u", "dev-1", d.identity.rules)
    assert acl.can_publish("devices/dev-1/t") and not acl.can_publish("devices/dev-2/t")


@pytest.mark.parametrize(
    ("why", "make"),
    [
        ("expired", lambda k: token(k[0], {"sub": "dev-1", "exp": time.time() - 5})),
        ("not_yet_valid", lambda k: token(k[0], {"sub": "dev-1", "nbf": time.time() + 60})),
        ("bad_signature", lambda k: token(k[1], {"sub": "dev-1"})),
        ("claim_sub", lambda k: token(k[0], {"sub": "dev-2"})),
        ("claim_sub", lambda k: token(k[0], {})),
        ("algorithm", lambda k: token(b"a secret of thirty-two bytes ...", {"sub": "dev-1"}, alg="HS256")),
    ],
)
def test_a_token_that_fails_is_denied_and_says_why(keys, pem, why, make):
    a = JwtAuthenticator(settings(public_key_file=str(pem), verify_claims={"sub": "%c"}))
    d = run(a, creds(make(keys)))
    assert (d.verdict, d.why) == (Verdict.DENY, why)


def test_what_is_not_a_jwt_is_left_to_the_next_authenticator(pem):
    a = JwtAuthenticator(settings(public_key_file=str(pem)))
    for password in (b"hunter2", None, b"a.b.c", b"\xff\xfe"):
        assert run(a, creds(password)) is IGNORED


def test_the_token_may_come_in_the_username_and_a_bad_acl_claim_denies(keys, pem):
    a = JwtAuthenticator(settings(public_key_file=str(pem), acl_claim="acl", **{"from": "username"}))
    good = token(keys[0], {"acl": RULES}).decode()
    assert run(a, creds(None, username=good)).verdict is Verdict.ALLOW
    bad = token(keys[0], {"acl": [{"permission": "maybe", "filter": "#"}]}).decode()
    assert run(a, creds(None, username=bad)).why == "bad_acl_claim"


def test_hmac_secret_from_a_file(tmp_path):
    secret = tmp_path / "hmac.key"
    secret.write_bytes(b"a secret of thirty-two bytes at least\n")
    a = JwtAuthenticator(settings(algorithms=["HS256"], secret_file=str(secret)))
    ok = token(b"a secret of thirty-two bytes at least", {}, alg="HS256")
    assert run(a, creds(ok)).verdict is Verdict.ALLOW
    other = token(b"another secret of thirty-two bytes ..", {}, alg="HS256")
    assert run(a, creds(other)).why == "bad_signature"


def test_a_rotated_jwks_file_applies_without_a_restart(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk(keys[0], "k1")]}))
    a = JwtAuthenticator(settings(jwks_file=str(path)))
    old, new = token(keys[0], {}, "k1"), token(keys[1], {}, "k2")
    assert run(a, creds(old)).verdict is Verdict.ALLOW and run(a, creds(new)).why == "unknown_key"
    path.write_text(json.dumps({"keys": [jwk(keys[1], "k2")]}))
    later = time.time() + 10
    os.utime(path, (later, later))  # (a new mtime even within the filesystem's resolution)
    assert run(a, creds(new)).verdict is Verdict.ALLOW and run(a, creds(old)).why == "unknown_key"
    # an EC key in the set works alike
    ec_key = ec.generate_private_key(ec.SECP256R1())
    path.write_text(json.dumps({"keys": [jwk(ec_key, "e1")]}))
    os.utime(path, (later + 10, later + 10))
    assert run(a, creds(token(ec_key, {}, "e1", alg="ES256"))).verdict is Verdict.ALLOW


def test_a_jwks_url_is_fetched_again_for_an_unknown_key_id_at_most_once_a_refresh_min(keys):
    served = {"keys": [jwk(keys[0], "k1")]}
    fetched: list[str] = []

    async def fetch(url: str) -> bytes:
        fetched.append(url)
        return json.dumps(served).encode()

    a = JwtAuthenticator(settings(jwks_url="https://idp.example/jwks", jwks_refresh_min=0), fetch)
    assert run(a, creds(token(keys[0], {}, "k1"))).verdict is Verdict.ALLOW and len(fetched) == 1
    assert run(a, creds(token(keys[0], {}, "k1"))).verdict is Verdict.ALLOW and len(fetched) == 1
    served["keys"] = [jwk(keys[1], "k2")]  # the identity provider rotated its key
    assert run(a, creds(token(keys[1], {}, "k2"))).verdict is Verdict.ALLOW and len(fetched) == 2

    slow = JwtAuthenticator(settings(jwks_url="https://idp.example/jwks", jwks_refresh_min=3600), fetch)
    run(slow, creds(token(keys[1], {}, "k2")))
    n = len(fetched)
    for _ in range(5):  # unknown key ids cannot make it fetch more than once a jwks_refresh_min
        assert run(slow, creds(token(keys[0], {}, "nope"))).why == "unknown_key"
    assert len(fetched) == n


def test_an_unreachable_jwks_url_fails_closed_through_the_chain(keys):
    async def fetch(url: str) -> bytes:
        raise OSError("connection refused")

    chain = Chain([JwtAuthenticator(settings(jwks_url="http://127.0.0.1:9/jwks"), fetch)])
    mechanism, d = asyncio.run(chain.authenticate(creds(token(keys[0], {}, "k1")), NOW))
    assert (mechanism, d.verdict, d.unavailable) == ("jwt", Verdict.DENY, True)


def test_key_sources_and_their_errors_are_named(tmp_path):
    with pytest.raises(ValueError, match="need public_key_file, jwks_file or jwks_url"):
        settings(algorithms=["RS256"])
    with pytest.raises(ValueError, match="need secret_file"):
        settings(algorithms=["HS256"])
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(ValueError, match=r"bad\.pem: not a PEM public key"):
        JwtAuthenticator(settings(public_key_file=str(bad)))
    with pytest.raises(ValueError, match=r"jwks\.json: not a usable JSON Web Key Set"):
        key_set(b'{"keys": "no"}', "jwks.json")


def test_the_chain_passes_on_ignore_and_stops_at_the_first_answer(keys, pem):
    class Fixed:
        mechanism = "fixed"

        def __init__(self, d: Decision) -> None:
            self.d, self.asked = d, 0

        async def authenticate(self, c: Credentials, now: float) -> Decision:
            self.asked += 1
            return self.d

    jwt_first = JwtAuthenticator(settings(public_key_file=str(pem)))
    last = Fixed(Decision.deny("nope"))
    chain = Chain([jwt_first, last])
    assert asyncio.run(chain.authenticate(creds(b"hunter2"), NOW)) == ("fixed", last.d)
    assert asyncio.run(chain.authenticate(creds(token(keys[0], {})), NOW))[0] == "jwt" and last.asked == 1
    assert asyncio.run(Chain([Fixed(IGNORED)]).authenticate(creds(None), NOW)) == ("", IGNORED)


def test_waiting_connects_share_one_fetch_and_a_failed_one_is_not_retried_within_refresh_min(keys):
    served = {"keys": [jwk(keys[0], "k1")]}
    fetched: list[str] = []
    down = [True]

    async def fetch(url: str) -> bytes:
        fetched.append(url)
        await asyncio.sleep(0.05)
        if down[0]:
            raise OSError("connection refused")
        return json.dumps(served).encode()

    a = JwtAuthenticator(settings(jwks_url="https://idp.example/jwks", jwks_refresh_min=3600), fetch)
    chain = Chain([a])

    async def many(n: int) -> list[Decision]:
        c = creds(token(keys[0], {}, "k1"))
        return [d for _, d in await asyncio.gather(*(chain.authenticate(c, NOW) for _ in range(n)))]

    assert all(d.unavailable for d in asyncio.run(many(20))) and len(fetched) == 1
    assert all(d.unavailable for d in asyncio.run(many(5))) and len(fetched) == 1  # (refused at once)
    down[0] = False
    b = JwtAuthenticator(settings(jwks_url="https://idp.example/jwks"), fetch)
    decisions = asyncio.run(Chain([b]).authenticate(creds(token(keys[0], {}, "k1")), NOW))
    assert decisions[1].verdict is Verdict.ALLOW and len(fetched) == 2
