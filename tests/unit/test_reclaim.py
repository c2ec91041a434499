"""When the node gives memory back after clients leave (fleetmq.broker.reclaim)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import uvloop
from fleetmq.broker.reclaim import AFTER_CLOSED, MIN_GAP, HandleReserve, Reclaimer, malloc_trim, rss_bytes


class Trims:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return 1


def test_it_trims_once_connections_fell_well_below_their_peak_and_stopped_falling(
    caplog: pytest.LogCaptureFixture,
):
    conns, trims = list(range(5000)), Trims()
    r = Reclaimer(conns, trims)
    del conns[-(AFTER_CLOSED - 1) :]
    assert not r.check(100.0), "not for fewer than AFTER_CLOSED gone"
    del conns[-1:]
    assert not r.check(101.0), "not while they are still leaving"
    with caplog.at_level(logging.INFO, logger="fleetmq.reclaim"):
        assert r.check(102.0) and trims.n == 1, "once they stopped"
    assert f"{5000 - AFTER_CLOSED} connections now, {AFTER_CLOSED} fewer than at their peak" in caplog.text
    assert not r.check(103.0), "the count it trimmed at is the new peak"
    del conns[-AFTER_CLOSED:]
    r.check(103.5)
    assert not r.check(102.0 + MIN_GAP / 2), "not twice within MIN_GAP"
    assert r.check(102.0 + MIN_GAP) and trims.n == 2 == r.trims


def test_a_wave_that_goes_on_gets_its_trim_min_gap_after_it_crossed_the_threshold():
    conns, trims = list(range(10 * AFTER_CLOSED)), Trims()
    r = Reclaimer(conns, trims)
    now = 100.0
    del conns[-AFTER_CLOSED:]
    assert not r.check(now)
    while trims.n == 0:  # (a hundred leave every check, for as long as it takes)
        now += 2.0
        del conns[-100:]
        r.check(now)
    assert now - 100.0 >= MIN_GAP and now - 100.0 < MIN_GAP + 2.0


def test_connections_coming_back_raise_the_peak():
    conns, trims = list(range(100)), Trims()
    r = Reclaimer(conns, trims)
    conns.extend(range(AFTER_CLOSED))
    assert not r.check(100.0)
    del conns[-AFTER_CLOSED:]
    assert not r.check(200.0)  # (leaving)
    assert r.check(202.0) and trims.n == 1


def test_without_malloc_trim_it_only_watches():
    conns = list(range(AFTER_CLOSED * 2))
    r = Reclaimer(conns, None)
    conns.clear()
    assert not r.check(100.0) and r.trims == 0


def test_this_c_library_has_malloc_trim_and_it_gives_freed_heap_back():
    """glibc (the image's and this machine's): freed blocks in the middle of the heap go back to the
    system only when trimmed."""
    trim = malloc_trim()
    assert trim is not None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 64 MB of 4 KB blocks (under the mmap threshold: from the heap), every 8th one kept as a pin
    blocks = [libc.malloc(4096) for _ in range(16384)]
    for b in blocks:
        libc.memset(b, 1, 4096)
    pins = blocks[7::8]
    freed = [b for i, b in enumerate(blocks) if i % 8 != 7]
    for b in freed:
        libc.free(b)
    before = rss_bytes()
    trim()
    after = rss_bytes()
    for b in pins:
        libc.free(b)
    assert before - after > 16 * 2**20, (before, after)


def _arenas() -> int:
    """CPython's small-object arenas (1 MB each) in use now (from its allocator's own statistics, which
    it writes to the C stderr)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        found = re.search(rb"# arenas allocated current\s*=\s*([\d,]+)", out.read())
    assert found is not None
    return int(found.group(1).replace(b",", b""))


def wave_of_handles() -> tuple[int, int, int]:
    """Arenas before a wave, once it is gone, and after the reserve's swap (run in a fresh interpreter)."""

    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        reserve = HandleReserve.for_loop(loop)
        assert reserve is not None
        await reserve.fill()
        gc.collect()
        before = _arenas()
        wave: list[object] = []
        handles: list[asyncio.Handle | None] = []
        for i in range(1000):
            wave.append([(i,) * 13 for _ in range(100)])  # (13-tuples: a handle's size class, its pools)
            handle = loop.call_soon(lambda: None)
            handle.cancel()
            handles.append(handle)
        await asyncio.sleep(0)  # (the loop lets go of them)
        for k in range(0, len(handles), 4):  # every 4th goes first: the ones kept, from all over the wave
            handles[k] = None
        del handles, wave
        gc.collect()
        kept = _arenas()
        await reserve.swap()
        after = _arenas()
        ran = asyncio.Event()
        loop.call_soon(ran.set)  # (the loop's own handles still work)
        await asyncio.wait_for(ran.wait(), 5)
        return before, kept, after

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def test_uvloop_handles_kept_for_reuse_no_longer_keep_the_memory_of_a_wave():
    """A wave of 15 MB of small objects, and among them 1,000 callback handles, alive at once (as when a
    thousand connections close in one turn of the loop): once it is gone, the 250 handles uvloop keeps for
    reuse keep the arenas they were made in; swapped for the reserve's, those arenas go back. In a fresh
    interpreter: in a test process that ran many tests, the wave fits in the free pools of the arenas it
    already has, and shows nothing."""
    run = subprocess.run(
        [sys.executable, "-c", "from tests.unit.test_reclaim import wave_of_handles; print(*wave_of_handles())"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    before, kept, after = map(int, run.stdout.split())
    assert kept - before >= 8, f"the wave's handles kept {kept - before} arenas: nothing for the test to show"
    assert after - before < (kept - before) / 2, f"most go back: {before} arenas, {kept} kept, {after} after"


def test_asyncio_loops_need_no_reserve():
    loop = asyncio.new_event_loop()
    try:
        assert HandleReserve.for_loop(loop) is None
    finally:
        loop.close()
