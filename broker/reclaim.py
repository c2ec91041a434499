"""Memory given back to the system once many clients have left.

A closed connection's objects are freed as it closes (no reference cycle keeps them), but the process
keeps the memory they were in: CPython gives an arena of its allocator back only when nothing in it is
left, and glibc's heap gives back only what is free at its top. After a wave of disconnects (a rollout
moving clients away, a site going offline), the node would keep the RSS of its peak until clients come
back. So when its connections have fallen well below their peak, the node asks glibc to return every
free page of its heap (malloc_trim), after a full collection has emptied CPython's free lists (whose
blocks would keep arenas), and after uvloop's free list of callback handles has been swapped for handles
made while the heap was small (HandleReserve).

Not on the per-message path: a check every few seconds, a trim after a thousand connections have gone.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Sized
from typing import Any

log = logging.getLogger("fleetmq.reclaim")

#: how often the connection count is looked at (seconds)
CHECK_EVERY = 1.0
#: connections gone since the count's last peak that make a trim worth it
AFTER_CLOSED = 1000
#: the least time between two trims (seconds): churn does not turn into a trim every check
MIN_GAP = 10.0
#: freed callback handles uvloop keeps for reuse (its DEFAULT_FREELIST_SIZE)
UVLOOP_FREELIST = 250


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def rss_bytes() -> int:
    """The process's resident set size, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _nothing() -> None:
    pass


class HandleReserve:
    """Keeps uvloop's free list of callback handles from holding on to the memory of clients that left.

    uvloop keeps the last UVLOOP_FREELIST callback handles it freed, for reuse (a Cython free list, which
    no collection empties). After a wave of connections, those were made among the connections' objects,
    all over the arenas the wave took: one handle keeps a 1 MB arena of CPython's allocator from going
    back, and 250 of them kept 16 of the 35 MB that 18,000 subscribed clients had taken (a gdb walk of the
    arenas after they left). The reserve holds UVLOOP_FREELIST handles made at start, in the arenas the
    node had then. To swap, it takes as many handles as the list holds (the list's come first), gives its
    own back (they fill the list), then lets go of the ones it took: the list being full, their memory
    goes back to the allocator. Then it takes its own back.

    A handle goes to the list when its last reference goes, so the reserve's are cancelled and left until
    the loop has dropped its own references (at its next turn). Timer handles have a free list too, but
    one of those pinned an arena only now and then, and each takes a float of its own when made: a
    reserve of them would pin more than it frees."""

    __slots__ = ("_context", "_held", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._held: list[Any] = []
        self._context = contextvars.Context()  # (one for all: a handle copies the caller's otherwise)

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> HandleReserve | None:
        """A reserve for uvloop; None for asyncio's own loops, whose handles are plain objects."""
        return cls(loop) if type(loop).__module__.partition(".")[0] == "uvloop" else None

    async def _take(self) -> list[Any]:
        loop, context = self._loop, self._context
        handles = [loop.call_soon(_nothing, context=context) for _ in range(UVLOOP_FREELIST)]
        for handle in handles:
            handle.cancel()
        await asyncio.sleep(0)  # (the loop's next turn lets go of them)
        return handles

    async def fill(self) -> None:
        self._held = await self._take()

    async def swap(self) -> None:
        taken = await self._take()
        self._held = []  # (into the free list)
        del taken  # (the free list full: back to the allocator)
        self._held = await self._take()


class Reclaimer:
    """Trims the heap when the connections have fallen AFTER_CLOSED below their peak since the last trim,
    once they stop falling: a wave of disconnects takes a few seconds, and a trim in its middle would
    leave the rest of it in the heap until the next (MIN_GAP later at best). A wave still under way
    MIN_GAP after it crossed the threshold gets its trim then."""

    __slots__ = ("_connections", "_last", "_peak", "_prev", "_since", "_trim", "trims")

    def __init__(self, connections: Sized, trim: Callable[[], object] | None) -> None:
        self._connections = connections
        self._trim = trim
        self._peak = self._prev = len(connections)
        self._last = -MIN_GAP
        self._since: float | None = None  # when the count first fell AFTER_CLOSED below the peak
        self.trims = 0

    def due(self, now: float) -> bool:
        """Whether it is time to trim (called every CHECK_EVERY: it follows the count)."""
        n = len(self._connections)
        falling, self._prev = n < self._prev, n
        if n >= self._peak:
            self._peak, self._since = n, None
            return False
        if self._trim is None or self._peak - n < AFTER_CLOSED:
            return False
        if self._since is None:
            self._since = now
        return now - self._last >= MIN_GAP and not (falling and now - self._since < MIN_GAP)

    def check(self, now: float) -> bool:
        """Trim if it is time to; whether it did."""
        if not self.due(now):
            return False
        self.trim(now, rss_bytes())
        return True

    def trim(self, now: float, before: int) -> None:
        """Collect, trim, and say how much the RSS fell since `before` (bytes)."""
        assert self._trim is not None
        n = len(self._connections)
        gone = self._peak - n
        started = time.perf_counter()
        # A full collection first: it empties CPython's free lists (tuples, floats, ...), whose blocks, made
        # while the clients were here, would each keep a small-object arena from going back. A few ms, the
        # start-up heap being frozen (cli.py).
        gc.collect()
        took = time.perf_counter() - started
        self._trim()
        self._peak, self._last, self._since = n, now, None
        self.trims += 1
        log.info(
            "%d connections now, %d fewer than at their peak: gave the system back %.1f MB (collection %.1f ms)",
            n,
            gone,
            (before - rss_bytes()) / 2**20,
            took * 1e3,
        )

    async def run(self) -> None:
        if self._trim is None:
            log.info("no malloc_trim in this C library: memory of closed connections is kept for reuse")
            return
        reserve = HandleReserve.for_loop(asyncio.get_running_loop())
        if reserve is not None:
            await reserve.fill()
        while True:
            await asyncio.sleep(CHECK_EVERY)
            now = time.monotonic()
            if self.due(now):
                before = rss_bytes()
                if reserve is not None:
                    await reserve.swap()
                self.trim(now, before)
