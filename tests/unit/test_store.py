"""GroupCommitter: one commit per event-loop turn, callbacks in order, nothing reported done too early."""

from __future__ import annotations

import asyncio

from fleetmq.broker.metrics import Metrics
from fleetmq.broker.store import CommitResult, Discard, GroupCommitter, MemoryStore, Op


class SlowStore(MemoryStore):
    """A store whose commit takes a while, like a Redis round trip."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Op]] = []

    async def commit(self, ops: list[Op]) -> CommitResult:
        self.batches.append(list(ops))
        await asyncio.sleep(0.01)
        return await super().commit(ops)


async def test_writes_of_one_turn_are_one_batch():
    store = SlowStore()
    c = GroupCommitter(store, Metrics())
    for i in range(5):
        c.add(Discard(f"c{i}"))
    await c.barrier()
    assert [len(b) for b in store.batches] == [5]


async def test_pending_covers_a_batch_being_committed():
    """A client reconnecting while its session's Save is in flight must wait for it (regression)."""
    c = GroupCommitter(SlowStore(), Metrics())
    c.add(Discard("x"))
    assert c.pending
    await asyncio.sleep(0)  # the flush hands the batch to the commit task
    assert c.pending, "a batch that is being committed is still pending"
    await c.barrier()
    assert not c.pending


async def test_callbacks_wait_for_earlier_writes_and_keep_order():
    store = SlowStore()
    c = GroupCommitter(store, Metrics())
    seen: list[str] = []
    c.after(lambda ok: seen.append("immediate"))  # nothing pending: runs at once
    assert seen == ["immediate"]
    c.add(Discard("a"))
    c.after(lambda ok: seen.append(f"first {ok}"))
    c.add(Discard("b"))
    c.after(lambda ok: seen.append(f"second {ok}"))
    assert seen == ["immediate"]
    await c.barrier()
    assert seen == ["immediate", "first True", "second True"]


async def test_failed_commit_reports_false_and_counts():
    class Broken(MemoryStore):
        async def commit(self, ops: list[Op]) -> CommitResult:
            raise ConnectionError("redis away")

    m = Metrics()
    c = GroupCommitter(Broken(), m)
    c.add(Discard("a"))
    results: list[bool] = []
    c.after(results.append)
    assert await c.barrier() is False
    assert results == [False]
    assert m.store_errors == 1
