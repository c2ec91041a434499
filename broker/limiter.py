"""Rate limits (connect rate per zone, publish rate per connection) as token buckets."""

from __future__ import annotations


class TokenBucket:
    """Rate limit: `rate` per second with a burst of one second's worth."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = self.burst
        self.stamp = now

    def take(self, now: float) -> float:
        """Take one token; returns 0 if there was one, else the seconds until there will be."""
        tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate
