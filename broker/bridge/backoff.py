"""Reconnect delays: exponential, capped, jittered, and reset only once a connection proved stable.

Attempt n waits min(initial * 2^(n-1), maximum), plus a random share of up to `jitter` of it, so that many
bridges losing one remote do not come back in lockstep. A remote that accepts and then drops the
connection at once (bad credentials, an overloaded broker) keeps backing off: the count resets only when a
connection stayed up `stable_after` seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    __slots__ = ("_random", "_up_since", "attempts", "initial", "jitter", "maximum", "stable_after")

    def __init__(
        self,
        initial: float,
        maximum: float,
        jitter: float,
        stable_after: float,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.stable_after = stable_after
        self._random = rand
        self.attempts = 0  # failed attempts since the last stable connection
        self._up_since: float | None = None

    def base(self, attempt: int) -> float:
        """The delay before attempt `attempt` (1, 2, ...) without jitter."""
        return min(self.initial * 2.0 ** (attempt - 1), self.maximum)

    def next_delay(self) -> float:
        """How long to wait before the next attempt (and count it)."""
        self.attempts += 1
        base = self.base(self.attempts)
        return base + base * self.jitter * self._random()

    def connected(self, now: float) -> None:
        self._up_since = now

    def disconnected(self, now: float) -> None:
        """The connection ended: if it was up long enough, start over from the initial delay."""
        if self._up_since is not None and now - self._up_since >= self.stable_after:
            self.attempts = 0
        self._up_since = None
