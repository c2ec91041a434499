"""The clocks the protocol state machines read, passed in rather than read from the system.

Two clocks, because they answer different questions: timers (keep alive, retransmission, awaiting
PUBREL) run on a monotonic clock that never steps back; message timestamps and expiry are wall-clock
times, which other nodes of the fleet read too. A test gives a channel a clock it moves by hand.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import ClassVar, Protocol


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
    """An event loop's clock and timers, and the system's wall clock. Timers of a second or more go on a
    wheel (TimerWheel), the shorter ones on the loop."""

    __slots__ = ("_loop", "_wheel", "time")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # (bound once: the per-message path reads the time without an extra call frame; asyncio's own
        # loops read time.monotonic, which is then called directly, not through their Python method)
        plain = getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time
        self.time: Callable[[], float] = time.monotonic if plain else loop.time
        self._loop = loop
        self._wheel = TimerWheel(loop)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        if delay >= WHEEL_FROM:
            return self._wheel.call_later(delay, callback)
        return self._loop.call_later(delay, callback)

    wall = staticmethod(time.time)


#: timers this long or longer go on the wheel: keep alive (1.5 x the client's), the CONNECT deadline,
#: retransmission and awaiting-PUBREL intervals; what must be prompt (a paced batch, a rate's next token)
#: is shorter
WHEEL_FROM = 1.0


class TimerWheel:
    """Timers for what every connection keeps one of, at a tenth of a second's resolution.

    A loop's own timer is heavy for that: uvloop's is a handle, a libuv timer and a copy of the caller's
    context, 650 bytes per connection with keep alive on. Here a timer is an entry in the table of its
    tick (its deadline rounded up to RESOLUTION), and the loop has one timer per tick that has entries.
    A timer fires at its deadline or up to RESOLUTION later, never earlier. Cancelling takes it out of
    its tick's table at once, and the table out of the wheel once empty: closed connections leave
    nothing behind to pin the memory they came in."""

    RESOLUTION: ClassVar[float] = 0.1

    __slots__ = ("_loop", "ticks")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.ticks: dict[int, _Tick] = {}

    def call_later(self, delay: float, callback: Callable[[], None]) -> WheelTimer:
        loop = self._loop
        tick = math.ceil((loop.time() + delay) / self.RESOLUTION)
        due = self.ticks.get(tick)
        if due is None:
            due = self.ticks[tick] = _Tick(self, tick)
            due.handle = loop.call_at(tick * self.RESOLUTION, self._fire, tick)
        timer = WheelTimer(callback, due)
        due.timers[timer] = None
        return timer

    def _fire(self, tick: int) -> None:
        due = self.ticks.pop(tick, None)
        if due is None:  # (every timer of the tick was cancelled)
            return
        for timer in list(due.timers):  # (in the order set; a callback may cancel a later one of the tick)
            callback = timer.callback
            if callback is None:
                continue
            timer.callback = timer._due = None
            try:
                callback()
            except Exception as e:  # as the loop does with its own timers: say so, and run the others
                self._loop.call_exception_handler(
                    {"message": f"Exception in timer callback {callback!r}", "exception": e}
                )


class _Tick:
    __slots__ = ("handle", "tick", "timers", "wheel")

    def __init__(self, wheel: TimerWheel, tick: int) -> None:
        self.wheel = wheel
        self.tick = tick
        self.timers: dict[WheelTimer, None] = {}
        #: the loop's timer for the tick: cancelled with its last entry, so that it does not stay behind,
        #: up to a keep alive's length, among the freed memory of the connections that left
        self.handle: asyncio.TimerHandle | None = None


class WheelTimer:
    __slots__ = ("_due", "callback")

    def __init__(self, callback: Callable[[], None], due: _Tick) -> None:
        self.callback: Callable[[], None] | None = callback
        self._due: _Tick | None = due  # its tick, until it fires or is cancelled

    def cancel(self) -> None:
        self.callback = None
        due, self._due = self._due, None
        if due is not None:
            timers = due.timers
            timers.pop(self, None)
            if not timers:
                due.wheel.ticks.pop(due.tick, None)
                if due.handle is not None:
                    due.handle.cancel()
                    due.handle = None
