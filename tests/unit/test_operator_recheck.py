"""The operator's next look at a fleet (Operator._recheck): one timer per fleet, the earliest, and a look
asked for during a pass that a timer started is not lost.

That last case is how a rollout or a rebalance goes on: the pass a timer runs asks for the next look
(STEER_SETTLE, the eviction time, HOLD). A look asked for while the timer's own task ran that pass was
taken as already due, and the fleet waited for the 30 s resync instead (e2e: a 3-second rebalance stage
took 30 s more)."""

from __future__ import annotations

import asyncio

from fleetmq.operator.handlers import Operator


class Passes(Operator):
    """An Operator whose reconcile records when it ran and asks for the next looks it is given."""

    def __init__(self, asks: list[float]) -> None:
        super().__init__(kube=None)  # type: ignore[arg-type]  # (no pass here reaches the API server)
        self.asks = asks
        self.times: list[float] = []

    async def reconcile(self, namespace: str, name: str) -> None:
        loop = asyncio.get_running_loop()
        self.times.append(loop.time())
        if self.asks:
            self._recheck(namespace, name, self.asks.pop(0))


def run(asks: list[float], first: float, wait: float) -> list[float]:
    async def main() -> list[float]:
        op = Passes(asks)
        start = asyncio.get_running_loop().time()
        op._recheck("ns", "edge", first)
        await asyncio.sleep(wait)
        for task in list(op.rechecks):
            task.cancel()
        return [round(t - start, 1) for t in op.times]

    return asyncio.run(main())


def test_a_look_asked_for_in_a_pass_a_timer_ran_happens():
    # the timer's pass (at 0.1 s) asks for another look 0.2 s on, and that one for one more
    assert run([0.2, 0.2], first=0.1, wait=0.8) == [0.1, 0.3, 0.5]


def test_the_earliest_look_is_kept_and_a_later_one_adds_none():
    async def main() -> list[float]:
        op = Passes([])
        start = asyncio.get_running_loop().time()
        op._recheck("ns", "edge", 0.3)
        op._recheck("ns", "edge", 0.1)  # earlier: replaces it
        op._recheck("ns", "edge", 0.5)  # later: the pending one covers it
        await asyncio.sleep(0.8)
        return [round(t - start, 1) for t in op.times]

    assert asyncio.run(main()) == [0.1]
