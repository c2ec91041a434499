"""An HTTP authentication service (EMQX's http authenticator), asked with aiohttp.

The request carries the CONNECT's client id, username, password and address (as the config's `body`
places them); the answer is JSON {"result": "allow" | "deny" | "ignore", "is_superuser": bool, "acl":
[rules]}. A service that cannot answer (unreachable, a timeout, a status other than 2xx, an answer that
is not that JSON) denies: the chain fails closed. Answers are reused for cache_ttl per client id and
credentials, so a client reconnecting in a loop does not become a request per CONNECT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import TypeAdapter, ValidationError

from ..topic import CACHED_TOPIC_MAX
from ..zones import AclRule, HttpAuthentication
from .chain import IGNORED, Credentials, Decision, Identity, Verdict

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


def _answer(status: int, body: bytes) -> tuple[dict[str, Any], Any]:
    """A service's JSON answer and its result; ServiceError when it is not one."""
    if not 200 <= status < 300:
        raise ServiceError(f"answered HTTP {status}")
    try:
        answer = json.loads(body) if body else {}
        return answer, answer.get("result")
    except (ValueError, AttributeError) as e:
        raise ServiceError(f"answered something that is not a JSON object: {body[:100]!r}") from e


def verdict(status: int, body: bytes) -> Verdict:
    """The verdict in an authorization service's answer (acl_url); ServiceError when it is not one."""
    _, result = _answer(status, body)
    try:
        return Verdict(result)
    except ValueError:
        raise ServiceError(f"answered result {result!r}, not allow, deny or ignore") from None


def decision(status: int, body: bytes) -> Decision:
    """The decision in a service's answer; ServiceError when it is not one."""
    answer, result = _answer(status, body)
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
        self._acl_cache: OrderedDict[tuple[str, str, str, str], tuple[float, Verdict]] = OrderedDict()
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
                return self._with_authorizer(hit[1], c)
        got = decision(*await self._ask(s.url, fields(s.body, c)))
        if s.cache_ttl:
            _keep(self._cache, key, (time.monotonic() + s.cache_ttl, got), s.cache_size)
        return self._with_authorizer(got, c)

    def _with_authorizer(self, d: Decision, c: Credentials) -> Decision:
        """An allowed client's identity gets the acl_url's authorizer, if there is one."""
        if d.identity is None or self.settings.acl_url is None:
            return d
        authorizer = HttpAuthorizer(self, dataclasses.replace(c, password=None))  # (it needs no password)
        return dataclasses.replace(d, identity=dataclasses.replace(d.identity, authorizer=authorizer))

    async def authorize(self, c: Credentials, action: str, topic: str) -> Verdict:
        """The acl_url's verdict on one action of one client (its answers reused for cache_ttl, but
        never for a topic longer than topic.CACHED_TOPIC_MAX: made-up topics cannot fill the cache)."""
        s = self.settings
        assert s.acl_url is not None
        key = (c.client_id, c.username or "", action, topic)
        cached = bool(s.cache_ttl) and len(topic) <= CACHED_TOPIC_MAX
        if cached:
            hit = self._acl_cache.get(key)
            if hit is not None and time.monotonic() < hit[0]:
                return hit[1]
        body = {"clientid": c.client_id, "username": c.username or "", "peerhost": c.peerhost,
                "action": action, "topic": topic}  # fmt: skip
        got = verdict(*await self._ask(s.acl_url, body))
        if cached:
            _keep(self._acl_cache, key, (time.monotonic() + s.cache_ttl, got), s.cache_size)
        return got

    async def _ask(self, url: str, body: dict[str, str]) -> tuple[int, bytes]:
        s = self.settings
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.timeout))
        headers = {**s.headers, **{name: self._header(name) for name in s.header_files}}
        kw: dict[str, Any] = {"params": body} if s.method == "get" else {"json": body}
        # (what is raised is logged: never with the request, whose query may hold a password)
        try:
            async with self._session.request(s.method.upper(), url, headers=headers, **kw) as r:
                return r.status, await r.read()
        except TimeoutError:
            raise ServiceError(f"no answer from {url} within {s.timeout:g}s") from None
        except aiohttp.ClientError as e:
            raise ServiceError(f"cannot ask {url}: {type(e).__name__}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpAuthorizer:
    """An http authenticator's acl_url, for one client it allowed (chain.Authorizer)."""

    __slots__ = ("_credentials", "_service", "ttl")

    def __init__(self, service: HttpAuthenticator, credentials: Credentials) -> None:
        self._service = service
        self._credentials = credentials
        self.ttl = service.settings.cache_ttl

    async def authorize(self, action: str, topic: str) -> Verdict:
        return await self._service.authorize(self._credentials, action, topic)


def _keep(cache: OrderedDict[Any, Any], key: Any, value: Any, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)
