"""The clocks the protocol state machines read, passed in rather than read from the system.

Two clocks, because they answer different questions: timers (keep alive, retransmission, awaiting
PUBREL) run on a monotonic clock that never steps back; message timestamps and expiry are wall-clock
times, which other nodes of the fleet read too. A test gives a channel a clock it moves by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Monotonic seconds: what timers and rates are measured in."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch: a message's timestamp, shared with the rest of the fleet."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` once after `delay` monotonic seconds, unless the timer is cancelled first."""
        ...


class LoopClock:
    """An event loop's clock and timers, and the system's wall clock."""

    __slots__ = ("call_later", "time")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # (bound once: the per-message path reads the time without an extra call frame; asyncio's own
        # loops read time.monotonic, which is then called directly, not through their Python method)
        plain = getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time
        self.time: Callable[[], float] = time.monotonic if plain else loop.time
        self.call_later: Callable[[float, Callable[[], None]], Timer] = loop.call_later

    wall = staticmethod(time.time)
