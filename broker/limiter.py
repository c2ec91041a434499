"""Rate limits: the connect rate per zone and the publish rate per connection (token buckets), and the
pace of evictions (Pacer)."""

from __future__ import annotations


class TokenBucket:
    """Rate limit: `rate` per second with a burst of one second's worth."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = self.burst
        self.stamp = now

    def take(self, now: float, amount: float = 1.0) -> float:
        """Take `amount` tokens; returns 0 if there were enough, else the seconds until there will be. An
        amount above the burst (a message bigger than a second's worth of bytes) is taken once the bucket
        is full, leaving it in debt: the rate holds on average, and no amount waits forever."""
        tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        need = min(amount, self.burst)
        if tokens >= need:
            self.tokens = tokens - amount
            return 0.0
        self.tokens = tokens
        return (need - tokens) / self.rate


class Pacer:
    """At most `rate` a second, evenly spaced, and never catching up: after a stall (a busy event loop, a
    starved CPU), the next one goes an interval after the last, not as many at once as the stall skipped.
    A paced eviction promises the nodes its clients land on that rate, not an average over the whole run."""

    __slots__ = ("interval", "last")

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.last: float | None = None

    def delay(self, now: float) -> float:
        """Seconds until the next one may go."""
        return 0.0 if self.last is None else max(0.0, self.last + self.interval - now)

    def went(self, now: float) -> None:
        self.last = now
