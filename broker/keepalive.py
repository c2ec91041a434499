"""Keep alive (EMQX's emqx_keepalive): close a connection that stays silent too long.

The deadline is keepalive * backoff * 2 seconds after the last packet (backoff 0.75 gives the spec's 1.5x).
Checking is lazy: one timer per connection fires at the earliest possible expiry and re-arms itself for the
time still left, so receiving a packet costs one timestamp, not a timer reschedule.
"""

from __future__ import annotations


class KeepAlive:
    """Immutable once made: the clients with the same keep alive under the same backoff share one (`shared_keepalive`)."""

    __slots__ = ("interval", "timeout")

    def __init__(self, interval: int, backoff: float) -> None:
        self.interval = interval
        self.timeout = interval * backoff * 2

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    def remaining(self, last_recv: float, now: float) -> float:
        """Seconds until expiry (<= 0 when the connection has been silent too long)."""
        return self.timeout - (now - last_recv)


#: the KeepAlive of each (interval, backoff) asked for: a fleet's clients use a handful of intervals, and
#: one object each is 72 bytes of every connection saved. Bounded: emptied past SHARED_MAX entries.
_shared: dict[tuple[int, float], KeepAlive] = {}
SHARED_MAX = 4096


def shared_keepalive(interval: int, backoff: float) -> KeepAlive:
    """The shared KeepAlive for `interval` seconds under `backoff`."""
    key = (interval, backoff)
    ka = _shared.get(key)
    if ka is None:
        if len(_shared) >= SHARED_MAX:
            _shared.clear()
        ka = _shared[key] = KeepAlive(interval, backoff)
    return ka


def effective_keepalive(client_keepalive: int, server_keepalive: int | None) -> tuple[int, bool]:
    """The keep alive in force and whether the server overrode the client's value."""
    if server_keepalive is not None and server_keepalive != client_keepalive:
        return server_keepalive, True
    return client_keepalive, False
