"""GroupCommitter: one commit per event-loop turn, callbacks in order, nothing reported done too early."""

from __future__ import annotations

import asyncio

from fleetmq.broker.metrics import Metrics
from fleetmq.broker.store.base import CommitResult, Discard, Op
from fleetmq.broker.store.committer import GroupCommitter
from fleetmq.broker.store.memory import MemoryStore


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


async def test_routings_made_while_a_failed_commit_was_in_flight_fail_with_it():
    """Found by `python -m chaos --seed 101` (order violations after a Redis restart): a batch routing
    messages 0..2 of a publisher failed (outcome unknown) while message 3 was routed; the next batch stored
    message 3 alone, the publisher (not acknowledged for 0..2) sent them again, and every subscriber got 3
    before 0. What was written during the failed commit may build on it: it is not committed either and
    its callbacks learn so; writes that stand alone still go out."""
    from fleetmq.broker.message import Delivery, Message
    from fleetmq.broker.store.base import Enqueue

    class FailsFirst(SlowStore):
        async def commit(self, ops: list[Op]) -> CommitResult:
            first = not self.batches
            result = await super().commit(ops)
            if first:
                raise ConnectionError("Connection closed by server.")
            return result

    def routed(n: int) -> Enqueue:
        return Enqueue("sub", Delivery(Message("t", b"%d" % n, 1, False), 1, False, None))

    store = FailsFirst()
    failed: list[list[Op]] = []
    c = GroupCommitter(store, Metrics(), on_failure=failed.append)
    seen: list[str] = []
    for n in range(3):
        c.add(routed(n))
    c.after(lambda ok: seen.append(f"0..2 {ok}"))
    await asyncio.sleep(0)  # the batch is on its way
    c.add(routed(3))
    c.add(Discard("gone"))  # stands alone
    c.after(lambda ok: seen.append(f"3 {ok}"))
    assert await c.barrier() is False
    assert seen == ["0..2 False", "3 False"]
    assert await c.barrier() is True  # what stands alone
    assert not any(isinstance(op, Enqueue) for batch in store.batches[1:] for op in batch), store.batches
    assert [op for batch in store.batches[1:] for op in batch] == [Discard("gone")]
    assert [len(f) for f in failed] == [3, 1]


class Flaky(SlowStore):
    """Fails its first `failures` commits as a lost reply does (Redis may have run them), then works."""

    def __init__(self, failures: int, transient: bool = True) -> None:
        super().__init__()
        self.failures = failures
        self._transient = transient

    async def commit(self, ops: list[Op]) -> CommitResult:
        result = await super().commit(ops)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Connection closed by server.")
        return result

    def transient(self, error: Exception) -> bool:
        return self._transient


async def test_writes_that_say_where_a_session_stands_go_out_again_after_an_unknown_outcome():
    """Issue 25: a session parked (or ended, its route changed, a retained message set) in a commit whose
    reply was lost stayed as the store had it before: marked online with no TTL, its will never stored.
    Those writes are idempotent: they go out again, ahead of what came since, until they land; routings
    and journal changes do not (their sessions resynchronise from the store instead)."""
    from fleetmq.broker.message import Delivery, Message
    from fleetmq.broker.store.base import Enqueue

    store = Flaky(failures=2)
    c = GroupCommitter(store, Metrics())
    c.add(Discard("ended"))
    c.add(Enqueue("sub", Delivery(Message("t", b"x", 1, False), 1, False, None)))
    assert await c.barrier() is False
    c.add(Discard("later"))
    assert await c.barrier() is False  # the second attempt failed too; "later" was in it, after "ended"
    assert await c.barrier() is True
    assert store.batches[1] == [Discard("ended"), Discard("later")]
    assert store.batches[2] == [Discard("ended"), Discard("later")]
    assert not any(isinstance(op, Enqueue) for batch in store.batches[1:] for op in batch)


async def test_a_commit_the_store_refused_for_good_is_not_sent_again():
    store = Flaky(failures=1, transient=False)
    c = GroupCommitter(store, Metrics())
    c.add(Discard("ended"))
    assert await c.barrier() is False
    await asyncio.sleep(0.3)  # (longer than the first retry's backoff)
    assert len(store.batches) == 1


def test_the_redis_store_sends_again_what_failed_for_a_passing_reason_only():
    import redis.exceptions as rx
    from fleetmq.broker.store.redis_store import RedisStore

    transient = RedisStore.transient
    store = RedisStore.__new__(RedisStore)
    for error in (
        rx.ConnectionError("Connection closed by server."),  # sent, no reply: unknown
        rx.TimeoutError("Timeout reading from socket"),
        rx.ReadOnlyError("You can't write against a read only replica."),  # failed over
        rx.BusyLoadingError("Redis is loading the dataset in memory"),
        rx.ClusterDownError("The cluster is down"),
        rx.ResponseError("NOREPLICAS Not enough good replicas to write."),
        OSError(111, "Connection refused"),
    ):
        assert transient(store, error), error
    assert not transient(store, rx.ResponseError("ERR wrong number of arguments for 'evalsha' command"))
