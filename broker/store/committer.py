"""Group commit: every write of one event-loop turn goes to the store as one batch, and the replies
waiting for it are released together (as RabbitMQ batches fsyncs); a failed batch's idempotent writes
go out again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ..journal import Journal, JournalChanges
from ..metrics import Metrics
from .base import CommitResult, Enqueue, Op, SessionStore

log = logging.getLogger("fleetmq.store")

#: after a failed commit, its idempotent writes go out again this long after (doubling up to RETRY_MAX)
RETRY_FIRST = 0.1
RETRY_MAX = 2.0


class GroupCommitter:
    """Collects store writes during one event-loop turn and commits them in one call.

    Writes come as ops (`add`) and as the changes of session journals, which ask for a commit at their
    first change (`journal_changed`) and are taken when the batch is built. Callers register callbacks
    with `after()`; they run in registration order once the batch holding every write made before them
    is durable (ok=True) or failed (ok=False). With nothing pending, a callback runs at once, so clean
    sessions never wait.
    """

    def __init__(
        self,
        store: SessionStore,
        metrics: Metrics,
        on_result: Callable[[CommitResult], None] | None = None,
        on_failure: Callable[[list[Op]], None] | None = None,
    ) -> None:
        self.store = store
        self.on_failure = on_failure  # told which writes may not have been stored
        self.metrics = metrics
        self.on_result = on_result
        self._journals: list[Journal] = []  # journals with changes for the next batch
        self._touched = False
        self._ops: list[Op] = []
        self._waiters: list[Callable[[bool], Any]] = []
        self._scheduled = False
        self._inflight: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None  # the next attempt of idempotent writes that failed
        self._backoff = RETRY_FIRST
        self.batches = 0

    @property
    def pending(self) -> bool:
        """Whether any write made so far may not be committed yet."""
        return bool(self._ops or self._waiters or self._touched or self._inflight is not None)

    def journal_changed(self, journal: Journal) -> None:
        """A journal changed for the first time since it was last taken: commit at the end of this turn."""
        self._journals.append(journal)
        self._touched = True
        self._schedule()

    def add(self, op: Op) -> None:
        self._ops.append(op)
        self._schedule()

    def after(self, callback: Callable[[bool], Any]) -> None:
        if not self._ops and not self._waiters and not self._touched and self._inflight is None:
            callback(True)
            return
        self._waiters.append(callback)
        self._schedule()

    def _schedule(self) -> None:
        if self._retry is not None:
            return  # failed writes go first, once their backoff is over
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _collect_journals(self) -> None:
        """Take the changes of every journal touched since the last collection, in the order touched."""
        if self._touched:
            journals, self._journals = self._journals, []
            for journal in journals:
                changes = journal.take()
                if changes is not None:
                    self._ops.append(changes)
            self._touched = False

    def _flush(self) -> None:
        self._scheduled = False
        if self._inflight is not None:
            return  # the running batch reschedules us when it finishes: one commit at a time keeps order
        self._collect_journals()
        ops, waiters = self._ops, self._waiters
        self._ops, self._waiters = [], []
        self._inflight = asyncio.get_running_loop().create_task(self._commit(ops, waiters))

    async def _commit(self, ops: list[Op], waiters: list[Callable[[bool], Any]]) -> None:
        ok = True
        retry = False
        later: tuple[list[Op], list[Callable[[bool], Any]]] = ([], [])
        try:
            if ops:
                t0 = time.perf_counter()
                result = await self.store.commit(ops)
                self.metrics.store_ops["commit"].observe(time.perf_counter() - t0)
                self.batches += 1
                self._backoff = RETRY_FIRST
                if self.on_result is not None:
                    self.on_result(result)
        except Exception as e:  # a store failure must not kill the node: acks are simply withheld
            ok = False
            self.metrics.store_errors += 1
            log.warning("session store commit of %d writes failed: %s", len(ops), e)
            later = self._take_dependent()
            retry = self.store.transient(e) and self._again(ops)
            if self.on_failure is not None:
                self.on_failure(ops)
        finally:
            self._inflight = None
        self._notify(waiters, ok)
        if later[0] or later[1]:
            if later[0]:
                log.warning("%d writes made meanwhile are not committed either", len(later[0]))
                if self.on_failure is not None:
                    self.on_failure(later[0])
            self._notify(later[1], False)
        if retry:
            delay, self._backoff = self._backoff, min(self._backoff * 2, RETRY_MAX)
            self._retry = asyncio.get_running_loop().call_later(delay, self._retry_now)
        elif self._ops or self._waiters or self._touched:
            self._schedule()

    def _again(self, ops: list[Op]) -> bool:
        """After a failed commit: put its writes that say where a session stands (parked, ended, its
        routes, a retained message) back in front of what came since, to go out again. Each is
        idempotent, so running it twice (the failed attempt may have run) leaves what running it once
        does; dropping it would leave the store behind the node for good: a session marked online with
        no TTL, its will never stored, a route the node no longer has. Returns whether there are any."""
        again = [op for op in ops if not isinstance(op, Enqueue | JournalChanges)]
        if again:
            log.warning("%d writes of the failed commit will be sent again", len(again))
            self._ops[:0] = again
        return bool(again)

    def _retry_now(self) -> None:
        self._retry = None
        if self._ops or self._waiters or self._touched:
            self._schedule()

    def _take_dependent(self) -> tuple[list[Op], list[Callable[[bool], Any]]]:
        """After a failed commit, whose outcome is unknown: take what was written while it was in flight,
        the routings (Enqueue) and session changes (journals) that may build on it, and every callback
        waiting for the next commit. Committed alone they could store the rest of a publisher's window
        without its start (a later message routed before an earlier one, which the client then sends
        again), or a journal's next change without the one before. They fail with it: the publishers
        are not acknowledged and send again in order, the sessions resynchronise from the store. Writes
        that stand alone (a parked session, a route, a retained message) still go out."""
        self._collect_journals()
        dependent: list[Op] = []
        alone: list[Op] = []
        for op in self._ops:
            (dependent if isinstance(op, Enqueue | JournalChanges) else alone).append(op)
        self._ops = alone
        waiters, self._waiters = self._waiters, []
        return dependent, waiters

    @staticmethod
    def _notify(waiters: list[Callable[[bool], Any]], ok: bool) -> None:
        for cb in waiters:
            try:
                cb(ok)
            except Exception:  # pragma: no cover - a broken callback must not starve the others
                log.exception("commit callback failed")

    async def barrier(self) -> bool:
        """Wait until every write made before this call is committed; False if that commit failed."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def done(ok: bool) -> None:
            if not fut.done():
                fut.set_result(ok)

        self.after(done)
        return await fut

    async def drain(self) -> None:
        """Wait until every write made so far is committed (graceful shutdown; writes that keep failing
        keep it waiting: the caller bounds it)."""
        while (
            self._ops
            or self._waiters
            or self._touched
            or self._inflight is not None
            or self._scheduled
            or self._retry is not None
        ):
            if self._inflight is not None:
                await asyncio.shield(self._inflight)
            else:
                await asyncio.sleep(0.01 if self._retry is not None else 0)
