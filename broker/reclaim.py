"""Memory given back to the system once many clients have left.

A closed connection's objects are freed as it closes (no reference cycle keeps them), but the process
keeps the memory they were in: CPython gives an arena of its allocator back only when nothing in it is
left, and glibc's heap gives back only what is free at its top. After a wave of disconnects (a rollout
moving clients away, a site going offline), the node would keep the RSS of its peak until clients come
back. So when its connections have fallen well below their peak, the node asks glibc to return every
free page of its heap (malloc_trim), after a full collection has emptied CPython's free lists (whose
blocks would keep arenas).

Not on the per-message path: a check every few seconds, a trim after a thousand connections have gone.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Sized

log = logging.getLogger("fleetmq.reclaim")

#: how often the connection count is looked at (seconds)
CHECK_EVERY = 1.0
#: connections gone since the count's last peak that make a trim worth it
AFTER_CLOSED = 1000
#: the least time between two trims (seconds): churn does not turn into a trim every check
MIN_GAP = 10.0


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

    def check(self, now: float) -> bool:
        """Trim if it is time to; whether it did."""
        n = len(self._connections)
        falling, self._prev = n < self._prev, n
        if n >= self._peak:
            self._peak, self._since = n, None
            return False
        if self._trim is None or self._peak - n < AFTER_CLOSED:
            return False
        if self._since is None:
            self._since = now
        if now - self._last < MIN_GAP or (falling and now - self._since < MIN_GAP):
            return False
        gone, before = self._peak - n, rss_bytes()
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
        return True

    async def run(self) -> None:
        if self._trim is None:
            log.info("no malloc_trim in this C library: memory of closed connections is kept for reuse")
            return
        while True:
            await asyncio.sleep(CHECK_EVERY)
            self.check(time.monotonic())
