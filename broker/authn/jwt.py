"""JSON Web Tokens (EMQX's jwt authenticator), verified with PyJWT.

The token is the CONNECT's password (or username). A value that is not a JWT at all is not this
authenticator's business (ignore: a later one, or the users files, may know it); a JWT that fails its
signature, its exp / nbf, or a required claim is denied.

Keys: an HMAC secret (HS*), a PEM public key, a JWKS file (read again when it changes, so a rotated key
set applies without a restart) and a JWKS URL (fetched at the first CONNECT, again every jwks_refresh in
the background, and at once for a key id it does not hold, at most once a jwks_refresh_min).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import TypeAdapter, ValidationError

from ..zones import AclRule, JwtAuthentication
from .chain import IGNORED, Credentials, Decision, Identity, log

Fetch = Callable[[str], Awaitable[bytes]]
FETCH_TIMEOUT = 5.0
_RULES = TypeAdapter(list[AclRule])


async def fetch_url(url: str) -> bytes:
    """GET `url` (off the event loop: key sets are fetched rarely, and urllib needs no extra dependency)."""

    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as r:  # (http or https: the config's pattern)
            body: bytes = r.read(1 << 20)
            return body

    return await asyncio.get_running_loop().run_in_executor(None, get)


def key_set(raw: bytes | str | Mapping[str, Any], source: str) -> dict[str | None, list[jwt.PyJWK]]:
    """kid -> keys of a JWKS document (keys without a kid under None); ValueError says what is wrong."""
    try:
        doc = json.loads(raw) if isinstance(raw, bytes | str) else raw
        keys = jwt.PyJWKSet.from_dict(dict(doc)).keys
    except (ValueError, TypeError, jwt.PyJWKSetError, jwt.InvalidKeyError) as e:
        raise ValueError(f"{source}: not a usable JSON Web Key Set: {e}") from e
    out: dict[str | None, list[jwt.PyJWK]] = {}
    for k in keys:
        out.setdefault(k.key_id, []).append(k)
    return out


def decide(claims: Mapping[str, Any], settings: JwtAuthentication, c: Credentials) -> Decision:
    """The decision on a token whose signature and times verified: its required claims, its rules."""
    for name, wanted in settings.verify_claims.items():
        if "%u" in wanted and c.username is None:
            return Decision.deny(f"claim_{name}")
        value = wanted.replace("%c", c.client_id).replace("%u", c.username or "")
        if name not in claims or str(claims[name]) != value:
            return Decision.deny(f"claim_{name}")
    rules: tuple[AclRule, ...] = ()
    if settings.acl_claim is not None and settings.acl_claim in claims:
        try:
            rules = tuple(_RULES.validate_python(claims[settings.acl_claim]))
        except ValidationError:
            return Decision.deny("bad_acl_claim")
    expires = claims.get("exp") if settings.disconnect_after_expire else None
    return Decision.allow(Identity(rules=rules, expires_at=float(expires) if expires is not None else None))


class JwtAuthenticator:
    mechanism = "jwt"

    def __init__(self, settings: JwtAuthentication, fetch: Fetch = fetch_url) -> None:
        """Reads the secret and public key now (raises OSError / ValueError naming the file)."""
        self.settings = settings
        self._fetch = fetch
        self._secret: bytes | None = None
        self._public: Any = None
        if settings.secret_file is not None:
            self._secret = Path(settings.secret_file).read_bytes().rstrip(b"\r\n")
        if settings.public_key_file is not None:
            try:
                self._public = load_pem_public_key(Path(settings.public_key_file).read_bytes())
            except ValueError as e:
                raise ValueError(f"{settings.public_key_file}: not a PEM public key: {e}") from e
        self._file_keys: dict[str | None, list[jwt.PyJWK]] = {}
        self._file_stamp: tuple[float, int] | None = None
        self._url_keys: dict[str | None, list[jwt.PyJWK]] | None = None
        self._url_fetched = -1e18  # monotonic time of the last fetch (tried)
        self._fetching: asyncio.Task[None] | None = None

    async def authenticate(self, c: Credentials, now: float) -> Decision:
        s = self.settings
        raw = c.password if s.from_ == "password" else (c.username or "").encode() or None
        if not raw:
            return IGNORED
        try:
            token = raw.decode()
            header = jwt.get_unverified_header(token)
        except (UnicodeDecodeError, jwt.DecodeError):
            return IGNORED  # not a JWT: not for this authenticator
        alg = header.get("alg")
        if alg not in s.algorithms:
            return Decision.deny("algorithm")
        kid = header.get("kid")
        keys = await self._keys(alg, kid if isinstance(kid, str) else None)
        if not keys:
            return Decision.deny("unknown_key")
        for key in keys:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    leeway=s.leeway,
                    options={"verify_aud": False},  # (an aud to check is a verify_claims entry)
                )
            except jwt.InvalidSignatureError:
                continue
            except jwt.ExpiredSignatureError:
                return Decision.deny("expired")
            except jwt.ImmatureSignatureError:
                return Decision.deny("not_yet_valid")
            except jwt.InvalidTokenError:
                return Decision.deny("invalid_token")
            return decide(claims, s, c)
        return Decision.deny("bad_signature")

    async def close(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()

    async def _keys(self, alg: str, kid: str | None) -> list[Any]:
        """The keys a token with this algorithm and key id may be signed with."""
        if alg.startswith("HS"):
            return [self._secret] if self._secret is not None else []
        out: list[Any] = []
        if self._public is not None and kid is None:
            out.append(self._public)
        self._read_file()
        sets = [self._file_keys]
        if self.settings.jwks_url is not None:
            url_keys = await self._url(kid)
            if url_keys is not None:
                sets.append(url_keys)
        for keys in sets:
            if kid is not None:
                out += [k.key for k in keys.get(kid, ())]
            else:
                out += [k.key for ks in keys.values() for k in ks if k.algorithm_name in (alg, None)]
        return out

    def _read_file(self) -> None:
        """The JWKS file as it is now: read again when its mtime or size changed."""
        path = self.settings.jwks_file
        if path is None:
            return
        st = os.stat(path)  # (gone: an error the chain counts as unavailable)
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._file_stamp:
            self._file_keys = key_set(Path(path).read_bytes(), path)
            self._file_stamp = stamp

    async def _url(self, kid: str | None) -> dict[str | None, list[jwt.PyJWK]] | None:
        """The JWKS URL's keys: fetched the first time, again for a key id they lack (a rotation) and
        every jwks_refresh in the background. Fetches are shared by the CONNECTs that wait for one, and a
        failed one is not tried again within jwks_refresh_min: an identity provider that is down is
        not flooded, and the CONNECTs meanwhile are refused at once."""
        s = self.settings
        since = time.monotonic() - self._url_fetched
        unknown = self._url_keys is None or (kid is not None and kid not in self._url_keys)
        fetching = self._fetching is not None and not self._fetching.done()
        if unknown and (fetching or since >= s.jwks_refresh_min):
            if not fetching:
                self._fetching = asyncio.get_running_loop().create_task(self._fetch_url())
            assert self._fetching is not None
            await asyncio.shield(self._fetching)  # (a CONNECT given up on does not stop the fetch)
        elif self._url_keys is None:
            raise LookupError(f"no key set from {s.jwks_url} yet: the last fetch failed {since:.0f}s ago")
        elif since >= s.jwks_refresh and not fetching:
            self._fetching = asyncio.get_running_loop().create_task(self._fetch_url(quiet=True))
        return self._url_keys

    async def _fetch_url(self, quiet: bool = False) -> None:
        url = self.settings.jwks_url
        assert url is not None
        self._url_fetched = time.monotonic()
        try:
            self._url_keys = key_set(await self._fetch(url), url)
        except Exception as e:
            if self._url_keys is None and not quiet:
                raise  # no key set yet: the chain denies and says why
            log.warning("cannot fetch the JWKS %s, the keys fetched before stay in use: %s", url, e)
