"""Session stores and group commit.

A store keeps what must outlive a connection: offline sessions with their queues.
Its interface is asynchronous and batched from the start: every write of one event-loop turn is handed to
`commit()` as one list, so a Redis store sends it in one round trip (one pipeline / script call) and the
acks that wait for it (publisher confirms) are released together, as RabbitMQ batches fsyncs.

Outcomes. Every call to a store ends in one of three ways: applied; not applied (refused, or never
sent); or unknown: sent, and the connection broke before the reply (Redis shut down, failed over, the
network cut it after the write). A call raising may have applied, so an unknown outcome is never taken
for "not applied": nothing is compensated on its strength (no release, undo or delete written because
of it). Each caller either makes its write idempotent, so that sending it again once the store answers
leaves the state one run would, or reads the outcome back before deciding anything else
(`SessionStore.transient` tells a failure worth sending again from one that would only repeat):

- group commit: a session's journal changes and the routings into other sessions are not sent again;
  the publishers are not acknowledged (they resend, and a resend finds what the first attempt stored:
  a QoS 2 record awaiting PUBREL, in the same transaction as its routing, or a receipt on a Redis
  Cluster) and the sessions read back what the store holds when their clients reconnect (resync).
  Parks, ends, route changes and retained messages are idempotent and go out again until they land.
- claim: carries a token; the same claim sent again gets the same answer. One never answered is read
  back (`claimed`) and what its refused client would leave behind undone (`abandon`).
- pulls: a session whose pull's reply was lost resynchronises (its client resumes from the store,
  which moved the deliveries into the session's journal atomically with the pull).
- wills: taken (`take_will`) and released with a dead node's sessions (`reap`) by token: the same
  taker asking again gets the same answer, any other taker nothing.
- a connected session's will (`set_will`), the re-assertion after an outage, heartbeats, route and
  registry sets: idempotent, sent again as they are.
- bridge leases (bridge.Lease): SET NX whose reply is lost is read back (the holder is this node).
- event-log batches (events.EventLog): idempotent per record (a high-water mark per node run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .journal import Journal, JournalChanges
from .message import Delivery, Message, Will
from .metrics import Metrics
from .router import Subscription
from .session import Session
from .zones import ZoneSettings

log = logging.getLogger("fleetmq.store")
T = TypeVar("T")

#: after a failed commit, its idempotent writes go out again this long after (doubling up to RETRY_MAX)
RETRY_FIRST = 0.1
RETRY_MAX = 2.0


@dataclass(slots=True)
class Save:
    """Park a session whose client disconnected, until it expires (after `ttl` seconds) or is taken back."""

    session: Session
    ttl: float = 0.0
    will: Message | None = None  # a will waiting for its delay (due at will_at, wall-clock seconds)
    will_at: float = 0.0


@dataclass(slots=True)
class Enqueue:
    """Queue a delivery in an offline session (the store applies max_mqueue_len, dropping the oldest).

    A message routed from a journaled publisher session (`Message.sender_epoch`) is stored only if that
    session is still this node's at that epoch, as its awaiting-PUBREL record is. A node fenced meanwhile
    routes nothing for a session it lost: its client sends the message again to the new owner, which would
    route it a second time (a QoS 2 message delivered twice)."""

    client_id: str
    delivery: Delivery


@dataclass(slots=True)
class Discard:
    """Delete a session (ended, expired, or replaced by a clean start); fenced by its epoch if given."""

    client_id: str
    epoch: int = 0


@dataclass(slots=True)
class Route:
    """Add (sub) or remove (sub=None) one subscription of an owned session: the fleet's route table."""

    client_id: str
    epoch: int
    topic_filter: str
    sub: Subscription | None


@dataclass(slots=True)
class Retain:
    """Set (or, with an empty payload, clear) the retained message of a topic."""

    msg: Message


Op = Save | JournalChanges | Enqueue | Discard | Route | Retain


@dataclass(slots=True)
class CommitResult:
    """What a commit did that the broker must account for (metrics, events)."""

    dropped: list[tuple[str, str, int]] = field(default_factory=list)  # (zone, client, n) from full queues
    # (zone, client, n) QoS0 messages not queued for an offline session (mqueue_store_qos0: false)
    skipped_qos0: list[tuple[str, str, int]] = field(default_factory=list)
    missing: list[Enqueue] = field(default_factory=list)  # enqueues for sessions that no longer exist
    #: sessions another node owns now: (client id, the stale epoch this node wrote at)
    fenced: list[tuple[str, int]] = field(default_factory=list)
    refused: int = 0  # guarded deliveries not stored: their publisher's session was fenced
    #: those publishers' sessions (client id, the epoch they routed at): another node owns each now, so
    #: this one must not acknowledge what they published (their clients send it again to the new owner)
    refused_from: set[tuple[str, int]] = field(default_factory=set)
    rerouted: int = 0  # deliveries routed into a fenced session's stale copy here, queued for its owner
    duration: float = 0.0


@dataclass(slots=True)
class StoredSession:
    """What a store that outlives the process keeps of a session, for the node that claims it to restore
    (Session.restore)."""

    expiry_interval: float
    next_pid: int
    order: int
    subscriptions: list[tuple[str, Subscription]]
    deliveries: list[Delivery]  # window (with a packet id) and queue, in any order (each knows its place)
    awaiting_rel: list[tuple[int, float, int]]  # packet id, time received, receipt (0: none)
    incarnation: str = ""  # receipts (Message.receipt): this session's, the counter, and those it got
    received: int = 0
    seen: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Claimed:
    """A session claimed for a connecting client: the session itself (a store in this process's memory
    keeps the object), what a store keeps of it, or neither when there was none (or Clean Start ended it)."""

    epoch: int  # grows on every claim: writes from an older owner are refused (fencing)
    session: Session | None = None
    stored: StoredSession | None = None
    discarded: bool = False  # Clean Start ended a stored session (its routes go)
    previous: str | None = None  # the node the client was connected to before (it is told to let go)
    ended_will: Will | None = None  # Clean Start ended a session whose will was waiting: publish it
    incarnation: str = ""  # of a session the claim created (a stored one's is in `stored`)


@dataclass(slots=True)
class ClaimOutcome:
    """What a claim whose reply never came did, read back once the store answers (SessionStore.claimed)."""

    ran: bool
    discarded: bool = False  # Clean Start ended a stored session (its routes go)
    ended_will: Will | None = None  # that session's will, still to publish


class SessionStore(ABC):
    """Where sessions live while their client is away."""

    #: whether writes outlive this process (acks of persistent sessions then wait for the commit)
    durable = False
    #: whether one commit is one transaction whatever sessions it touches; a store without (a Redis
    #: Cluster: none spans slots) gets a journaled publisher's QoS 2 receipt before its routing
    #: (Message.receipt)
    atomic = True

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def claim(
        self,
        client_id: str,
        zone: ZoneSettings,
        zone_name: str,
        clean_start: bool,
        will: Message | None = None,
        will_delay: float = 0.0,
        expiry: float = 0.0,
        username: str | None = None,
        token: str = "",
    ) -> Claimed:
        """Take a stored session over for a connecting client on this node (with its will and expiry, and
        the username its will is authorized by). `token` names this claim: a store that may run it
        without answering (its reply lost) keeps it, so that `claimed` can tell later."""

    async def claimed(self, client_id: str, token: str) -> ClaimOutcome:
        """Whether the claim named `token`, whose outcome is unknown, ran (a store in memory always
        answers, so never has to say)."""
        return ClaimOutcome(ran=False)

    async def abandon(self, client_id: str, token: str) -> None:
        """Undo what a claim that ran left behind, its client refused meanwhile: a session it resumed waits
        for its client again, one it created ends. Idempotent."""
        return None

    async def take_will(self, client_id: str, will_at: float, token: str = "") -> Will | None:
        """Claim a will whose delay ran out; None if another node published it or the client came back.
        The same `token` asking again (its reply lost) gets the same answer."""
        raise NotImplementedError

    async def set_will(self, session: Session, will: Message | None, will_delay: float) -> None:
        """Keep a connected session's will (and expiry) where other nodes find it if this one dies."""
        return None

    async def load_routes(self) -> list[tuple[str, str, Subscription]]:
        """Every stored subscription (client id, filter, options), to fill the router at start."""
        return []

    async def load_retained(self) -> list[Message]:
        return []

    @abstractmethod
    async def commit(self, ops: list[Op]) -> CommitResult:
        """Apply the writes of one event-loop turn atomically, in one round trip."""

    def transient(self, error: Exception) -> bool:
        """Whether a failed call may succeed if sent again once the store is back: its outcome is unknown
        (sent, no reply) or the store refused it for a passing reason (restarting, failing over). An
        error that running it again would only repeat (a bad request) is not."""
        return False

    @abstractmethod
    def offline_sessions(self) -> list[Session]:
        """Sessions held for absent clients (for gauges and expiry bookkeeping)."""


async def retrying(
    store: SessionStore,
    call: Callable[[], Awaitable[T]],
    deadline: float,
    stop: Callable[[], bool] = lambda: False,
) -> T:
    """`call`, made again while `store` fails for a passing reason (transient), until `deadline`
    (time.monotonic()) or `stop()`; then its error is raised. Each call must be safe to make twice: the
    failed one may have run."""
    delay = 0.05
    while True:
        try:
            return await call()
        except Exception as e:
            if not store.transient(e) or stop() or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


class MemoryStore(SessionStore):
    """Sessions in this process's memory: the default of `make run`, lost when the process ends."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._epochs: dict[str, int] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._sessions.clear()

    async def claim(
        self,
        client_id: str,
        zone: ZoneSettings,
        zone_name: str,
        clean_start: bool,
        will: Message | None = None,
        will_delay: float = 0.0,
        expiry: float = 0.0,
        username: str | None = None,
        token: str = "",
    ) -> Claimed:
        epoch = self._epochs[client_id] = self._epochs.get(client_id, 0) + 1
        session = self._sessions.pop(client_id, None)
        if session is not None and clean_start:
            return Claimed(epoch, discarded=True)
        if session is not None:
            session.epoch = epoch
        return Claimed(epoch, session)

    async def commit(self, ops: list[Op]) -> CommitResult:
        result = CommitResult([], [])
        sessions = self._sessions
        for op in ops:
            if isinstance(op, Save):
                sessions[op.session.client_id] = op.session
            elif isinstance(op, Enqueue):
                s = sessions.get(op.client_id)
                if s is None:
                    result.missing.append(op)
                    continue
                dropped = s.enqueue(op.delivery)
                if dropped:
                    result.dropped.append((s.zone_name, op.client_id, len(dropped)))
            elif isinstance(op, Discard):
                sessions.pop(op.client_id, None)
                self._epochs.pop(op.client_id, None)
        return result

    def offline_sessions(self) -> list[Session]:
        return list(self._sessions.values())


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
