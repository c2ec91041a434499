"""An HTTP authentication service (EMQX's http authenticator), asked with aiohttp.

The request carries the CONNECT's client id, username, password and address (as the config's `body`
places them); the answer is JSON {"result": "allow" | "deny" | "ignore", "is_superuser": bool, "acl":
[rules]}. A service that cannot answer (unreachable, a timeout, a status other than 2xx, an answer that
is not that JSON) denies: the chain fails closed. Answers are reused for cache_ttl per client id and
credentials, so a client reconnecting in a loop does not become a request per CONNECT.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import TypeAdapter, ValidationError

from ..zones import AclRule, HttpAuthentication
from .chain import IGNORED, Credentials, Decision, Identity

_RULES = TypeAdapter(list[AclRule])


class ServiceError(Exception):
    """The service's answer cannot be used (the chain counts it as unavailable)."""


def fields(template: dict[str, str], c: Credentials) -> dict[str, str]:
    """The body's fields with %c, %u, %P and %a in place (an absent username or password: empty)."""
    password = c.password.decode(errors="replace") if c.password is not None else ""
    values = {"%c": c.client_id, "%u": c.username or "", "%P": password, "%a": c.peerhost}
    out = {}
    for name, value in template.items():
        for placeholder, v in values.items():
            value = value.replace(placeholder, v)
        out[name] = value
    return out


def decision(status: int, body: bytes) -> Decision:
    """The decision in a service's answer; ServiceError when it is not one."""
    if not 200 <= status < 300:
        raise ServiceError(f"answered HTTP {status}")
    try:
        answer = json.loads(body) if body else {}
        result = answer.get("result")
    except (ValueError, AttributeError) as e:
        raise ServiceError(f"answered something that is not a JSON object: {body[:100]!r}") from e
    if result == "ignore":
        return IGNORED
    if result == "deny":
        return Decision.deny("denied_by_service")
    if result != "allow":
        raise ServiceError(f"answered result {result!r}, not allow, deny or ignore")
    try:
        rules = tuple(_RULES.validate_python(answer.get("acl") or []))
    except ValidationError as e:
        raise ServiceError(f"answered acl rules that are not rules: {e.error_count()} errors") from e
    return Decision.allow(Identity(superuser=answer.get("is_superuser") is True, rules=rules))


class HttpAuthenticator:
    mechanism = "http"

    def __init__(self, settings: HttpAuthentication) -> None:
        """Reads the header files now (raises OSError naming the file)."""
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._cache: OrderedDict[bytes, tuple[float, Decision]] = OrderedDict()
        self._header_files: dict[str, tuple[tuple[float, int], str]] = {}
        for name in settings.header_files:
            self._header(name)

    def _header(self, name: str) -> str:
        """A header from its file, read again when the file changed (a rotated Secret)."""
        path = self.settings.header_files[name]
        st = os.stat(path)
        stamp = (st.st_mtime, st.st_size)
        known = self._header_files.get(name)
        if known is None or known[0] != stamp:
            known = self._header_files[name] = (stamp, Path(path).read_text().strip())
        return known[1]

    async def authenticate(self, c: Credentials, now: float) -> Decision:
        s = self.settings
        key = b""
        if s.cache_ttl:
            key = hashlib.sha256(
                b"\0".join(
                    [
                        c.client_id.encode(),
                        (c.username or "").encode(),
                        c.password or b"",
                        c.peerhost.encode(),
                    ]
                )
            ).digest()
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() < hit[0]:
                return hit[1]
        got = await self._ask(fields(s.body, c))
        if s.cache_ttl:
            self._cache[key] = (time.monotonic() + s.cache_ttl, got)
            self._cache.move_to_end(key)
            while len(self._cache) > s.cache_size:
                self._cache.popitem(last=False)
        return got

    async def _ask(self, body: dict[str, str]) -> Decision:
        s = self.settings
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.timeout))
        headers = {**s.headers, **{name: self._header(name) for name in s.header_files}}
        kw: dict[str, Any] = {"params": body} if s.method == "get" else {"json": body}
        # (what is raised is logged: never with the request, whose query may hold a password)
        try:
            async with self._session.request(s.method.upper(), s.url, headers=headers, **kw) as r:
                return decision(r.status, await r.read())
        except TimeoutError:
            raise ServiceError(f"no answer from {s.url} within {s.timeout:g}s") from None
        except aiohttp.ClientError as e:
            raise ServiceError(f"cannot ask {s.url}: {type(e).__name__}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
