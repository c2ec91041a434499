"""The loop clock's timers (fleetmq.broker.clock): long ones on the wheel, short ones on the loop, on a
real event loop (asyncio's and uvloop's)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import pytest
import uvloop
from fleetmq.broker.clock import WHEEL_FROM, LoopClock, TimerWheel, WheelTimer

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.fixture(params=list(LOOPS))
def loop(request: pytest.FixtureRequest):
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


def run(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def test_a_wheel_timer_fires_at_its_deadline_or_within_a_tick_after(loop: asyncio.AbstractEventLoop):
    wheel = TimerWheel(loop)
    fired: dict[float, float] = {}
    start = loop.time()
    for delay in (0.05, 0.25, 0.3, 0.42, 0.6):
        wheel.call_later(delay, lambda delay=delay: fired.setdefault(delay, loop.time() - start))
    run(loop, 0.9)
    assert sorted(fired) == [0.05, 0.25, 0.3, 0.42, 0.6]
    for delay, at in fired.items():
        # (a millisecond of slack: the loops round their own timers to milliseconds)
        assert delay - 0.001 <= at <= delay + TimerWheel.RESOLUTION + 0.05, (delay, at)
    assert wheel.ticks == {}, "a tick's list goes once it fired"


def test_timers_of_one_tick_share_one_loop_timer(loop: asyncio.AbstractEventLoop):
    wheel = TimerWheel(loop)
    at: list[Any] = []
    real_call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        if callback == wheel._fire:
            at.append(when)
        return real_call_at(when, callback, *args, **kw)

    loop.call_at = counting_call_at  # type: ignore[method-assign]
    fired: list[int] = []

    async def arm() -> None:
        for i in range(1000):
            wheel.call_later(0.2, lambda i=i: fired.append(i))

    loop.run_until_complete(arm())
    # (uvloop's clock moves while they are set: a busy machine may cross into the next tick or two)
    assert 1 <= len(at) <= 3 and len(set(at)) == len(at), at
    run(loop, 0.45)
    assert fired == list(range(1000)), "in the order they were set"


def test_a_cancelled_timer_does_not_fire_and_lets_its_callback_go(loop: asyncio.AbstractEventLoop):
    wheel = TimerWheel(loop)
    fired: list[str] = []

    class Owner:
        def ping(self) -> None:
            fired.append("owner")

    owner = Owner()
    timer = wheel.call_later(0.2, owner.ping)
    wheel.call_later(0.2, lambda: fired.append("other"))
    timer.cancel()
    gc.collect()
    assert not any(type(o) is Owner for o in gc.get_referrers(timer)), "cancel drops the callback"
    assert [len(due.timers) for due in wheel.ticks.values()] == [1], "nor does its tick keep it"
    run(loop, 0.45)
    assert fired == ["other"]
    timer.cancel()  # (again, after its tick: nothing happens)
    alone = wheel.call_later(0.2, owner.ping)
    (tick,) = wheel.ticks.values()
    handle = tick.handle
    assert handle is not None and not handle.cancelled()
    alone.cancel()
    assert wheel.ticks == {}, "a tick whose timers were all cancelled goes at once"
    assert handle.cancelled() and tick.handle is None, "and its loop timer with it"
    again = wheel.call_later(0.2, lambda: fired.append("again"))  # (the same tick anew, its own loop timer)
    run(loop, 0.45)
    assert fired == ["other", "again"] and again.callback is None and wheel.ticks == {}


def test_a_callback_may_cancel_a_timer_of_its_own_tick(loop: asyncio.AbstractEventLoop):
    wheel = TimerWheel(loop)
    fired: list[str] = []
    timers: list[Any] = []

    async def arm() -> None:
        timers.append(wheel.call_later(0.2, lambda: (fired.append("first"), timers[1].cancel())))
        timers.append(wheel.call_later(0.2, lambda: fired.append("second")))
        timers.append(wheel.call_later(0.2, lambda: fired.append("third")))

    loop.run_until_complete(arm())
    run(loop, 0.45)
    assert fired == ["first", "third"]


def test_a_timer_that_raises_is_reported_and_the_others_of_its_tick_still_run(
    loop: asyncio.AbstractEventLoop,
):
    wheel = TimerWheel(loop)
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    fired: list[int] = []

    def boom() -> None:
        raise ValueError("a bug in one connection's timer")

    async def arm() -> None:
        wheel.call_later(0.2, lambda: fired.append(1))
        wheel.call_later(0.2, boom)
        wheel.call_later(0.2, lambda: fired.append(2))

    loop.run_until_complete(arm())
    run(loop, 0.45)
    assert fired == [1, 2]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)


def test_the_loop_clock_puts_long_timers_on_its_wheel_and_short_ones_on_the_loop(
    loop: asyncio.AbstractEventLoop,
):
    clock = LoopClock(loop)
    fired: list[str] = []
    long = clock.call_later(WHEEL_FROM, lambda: fired.append("long"))
    short = clock.call_later(0.01, lambda: fired.append("short"))
    assert isinstance(long, WheelTimer) and not isinstance(short, WheelTimer)
    run(loop, 0.1)
    assert fired == ["short"]
    run(loop, WHEEL_FROM + TimerWheel.RESOLUTION)
    assert fired == ["short", "long"]
    assert abs(clock.time() - loop.time()) < 0.05, "timers and the channel's clock read the same time"
