"""The chain and what its authenticators answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ..zones import AclRule

log = logging.getLogger("fleetmq.authn")
_closing: set[asyncio.Task[None]] = set()  # (a task is only weakly held by its loop)


class Verdict(Enum):
    ALLOW = "allow"
    DENY = "deny"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a CONNECT says of its client, as authenticators see it."""

    client_id: str
    username: str | None
    password: bytes | None
    peerhost: str


class Authorizer(Protocol):
    """A service that decides per action and topic what one client may do (an http authenticator's
    acl_url). Its answers are asked before the ACL rules; IGNORE leaves the decision to them."""

    #: how long an answer holds for this client (seconds; 0: asked again each time)
    ttl: float

    async def authorize(self, action: str, topic: str) -> Verdict:
        """ "publish" to a topic, "subscribe" to a filter; raises when the service cannot answer (the
        channel manager denies then: it fails closed)."""
        ...


@dataclass(frozen=True, slots=True)
class Identity:
    """What an authenticator that allowed a client learned of it."""

    superuser: bool = False
    rules: tuple[AclRule, ...] = ()  # the client's own ACL rules, matched before the zone's
    expires_at: float | None = None  # wall-clock seconds: the connection ends then (a token's exp)
    authorizer: Authorizer | None = None  # asked what the client may publish and subscribe to


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    why: str  # a short reason for logs and metrics ("expired", "bad_signature"...); never a credential
    identity: Identity | None = None
    unavailable: bool = False  # denied because the authenticator could not answer

    @classmethod
    def allow(cls, identity: Identity, why: str = "allowed") -> Decision:
        return cls(Verdict.ALLOW, why, identity)

    @classmethod
    def deny(cls, why: str, *, unavailable: bool = False) -> Decision:
        return cls(Verdict.DENY, why, unavailable=unavailable)


IGNORED = Decision(Verdict.IGNORE, "ignored")


class Authenticator(Protocol):
    mechanism: str

    async def authenticate(self, credentials: Credentials, now: float) -> Decision:
        """The decision on one CONNECT; raises only for what the chain counts as unavailable."""
        ...

    async def close(self) -> None:
        """Let go of what it holds open (connections to its service)."""
        ...


class Chain:
    """A zone's authenticators, tried in order."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = tuple(authenticators)
        self._last_warning: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self.authenticators)

    async def authenticate(self, credentials: Credentials, now: float) -> tuple[str, Decision]:
        """(the mechanism that decided, its decision); ("", IGNORED) when every one ignored."""
        for a in self.authenticators:
            try:
                decision = await a.authenticate(credentials, now)
            except Exception as e:  # its source away, a bug: fail closed, and say so (not per CONNECT)
                self._warn(a.mechanism, f"{type(e).__name__}: {e}")
                decision = Decision.deny("unavailable", unavailable=True)
            if decision.verdict is not Verdict.IGNORE:
                return a.mechanism, decision
        return "", IGNORED

    async def close(self) -> None:
        for a in self.authenticators:
            await a.close()

    def close_soon(self) -> None:
        """close() once the running loop gets to it (a chain replaced by a config change)."""
        if self.authenticators:
            with contextlib.suppress(RuntimeError):  # (no loop running: nothing was opened)
                loop = asyncio.get_running_loop()
                task = loop.create_task(self.close())
                _closing.add(task)
                task.add_done_callback(_closing.discard)

    def _warn(self, mechanism: str, message: str) -> None:
        """At most one warning a second per mechanism: an authenticator down must not flood the log."""
        t = time.monotonic()
        if t - self._last_warning.get(mechanism, -1e9) >= 1.0:
            self._last_warning[mechanism] = t
            log.warning("%s authentication cannot answer, CONNECTs are refused: %s", mechanism, message)
