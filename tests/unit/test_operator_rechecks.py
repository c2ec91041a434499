"""When the operator looks at a fleet again without a Kubernetes event (operator/handlers.py): the
rollout's and the rebalance's waits, and a store that changes while only the brokers' reports say so."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fleetmq.operator import handlers
from fleetmq.operator.handlers import Operator


def _operator() -> tuple[Operator, list[tuple[str, float]]]:
    op = Operator(kube=None)  # type: ignore[arg-type]  # (no API call is made here)
    calls: list[tuple[str, float]] = []

    async def request(namespace: str, name: str) -> None:
        calls.append((name, time.monotonic()))

    op.request = request  # type: ignore[method-assign]
    return op, calls


async def test_a_burst_of_passes_asks_for_one_look_and_a_later_need_gets_its_own():
    op, calls = _operator()
    t0 = time.monotonic()
    for delay in (0.2, 0.25, 0.5):  # (covered by the look at 0.2 s)
        op._recheck("ns", "edge", delay)
    op._recheck("ns", "edge", 1.5)
    op._recheck("ns", "other", 0.25)
    await asyncio.sleep(2.5)
    assert [name for name, _ in calls] == ["edge", "other", "edge"]
    for (_, t), want in zip(calls, (0.2, 0.25, 1.5), strict=True):
        assert want <= t - t0 < want + 0.8  # (a busy machine wakes late, never early)
    assert not op.rechecks and op.recheck_due[("ns", "edge")] == set()


async def test_a_pending_look_is_cancelled_when_the_operator_stops():
    op, calls = _operator()
    op._recheck("ns", "edge", 5.0)
    op.kube = _Closable()  # type: ignore[assignment]
    await op.close()
    assert not calls and not op.rechecks


class _Closable:
    async def close(self) -> None:
        pass


def _status(primary: str | None, ready: str) -> dict[str, Any]:
    return {"store": {"primary": primary}, "conditions": [{"type": "StoreReady", "status": ready}]}


async def test_a_changing_store_is_looked_at_again_until_it_has_settled(monkeypatch):
    op, _ = _operator()
    asked: list[float] = []
    monkeypatch.setattr(op, "_recheck", lambda ns, name, delay: asked.append(delay))
    key = ("ns", "edge")
    op._follow_store(key, _status("r-0", "True"), _status("r-0", "True"))
    assert asked == []  # steady: the resync is enough
    op._follow_store(key, _status("r-0", "True"), _status("r-0", "False"))  # its primary's pod gone
    op._follow_store(key, _status("r-0", "False"), _status("r-1", "True"))  # a replica took over
    op._follow_store(key, _status("r-1", "True"), _status("r-1", "True"))  # (within STORE_SETTLE)
    assert asked == [handlers.STORE_REFRESH] * 3
    op.store_changing[key] = time.monotonic() - 1  # STORE_SETTLE later
    op._follow_store(key, _status("r-1", "True"), _status("r-1", "True"))
    assert len(asked) == 3 and key not in op.store_changing
