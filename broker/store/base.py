"""What a session store is: the writes a node hands it (ops), what it answers, and the SessionStore
contract every store keeps (the outcome rule: fleetmq.broker.store)."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TypeVar

from ..journal import JournalChanges
from ..message import Delivery, Message, Will
from ..router import Subscription
from ..session import Session
from ..zones import ZoneSettings

T = TypeVar("T")


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
    #: receipts of messages the session took straight from its publisher's node after a copy had been
    #: queued for it through the store (its publisher sent it again elsewhere): receipt -> the message id of
    #: the session's own copy; any other copy under that receipt is a repeat
    twins: dict[tuple[str, int], int] = field(default_factory=dict)


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


@dataclass(slots=True)
class SessionInfo:
    """A session as the management API lists it, read from the store (nothing changed). `node` is the
    node its client is connected to, '' when none; `queued` counts what the store keeps for it
    (journal and queue): of a connected client, its node knows better."""

    client_id: str
    zone: str
    username: str | None
    node: str
    expiry_interval: float
    subscriptions: int
    queued: int
    awaiting_rel: int


@dataclass(slots=True)
class SessionDetail:
    info: SessionInfo
    subscriptions: list[tuple[str, Subscription]]
    queue: list[Delivery]  # in delivery order, at most the `limit` asked for


def session_info(s: Session, node: str = "") -> SessionInfo:
    """What a session held in this process counts."""
    return SessionInfo(s.client_id, s.zone_name, None, node, s.expiry_interval, len(s.subscriptions),
                       len(s.inflight) + len(s.mqueue), len(s.awaiting_rel))  # fmt: skip


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

    async def take_connection(
        self,
        zone: str,
        username: str,
        client_id: str,
        instance: str,
        limit: int,
        live: Collection[str],
        dead: Collection[str] = (),
        last: bool = False,
    ) -> bool | list[str]:
        """Count a connection of `username` for `client_id`, held by the node instance `instance`, unless
        the user already has `limit` others held by live node instances; False when it has. Entries of
        `dead` instances are dropped. Instances neither in `live` nor in `dead` are answered, with nothing
        written, for the caller to look up, unless `last` (then they count). Sent again (its reply lost),
        it answers the same."""
        raise NotImplementedError

    async def free_connection(self, zone: str, username: str, client_id: str, instance: str) -> None:
        """Uncount the connection `take_connection` counted, unless another instance holds it now (a
        takeover elsewhere). Idempotent."""
        raise NotImplementedError

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

    async def sessions(self) -> list[SessionInfo]:
        """Every session the store holds, for the management API (a store in memory: the offline ones;
        connected ones are the node's)."""
        return [session_info(s) for s in self.offline_sessions()]

    async def session(self, client_id: str, limit: int = 100) -> SessionDetail | None:
        """One stored session with its subscriptions and the first `limit` deliveries kept for it."""
        for s in self.offline_sessions():
            if s.client_id == client_id:
                kept = [*s.inflight.values(), *s.mqueue]
                return SessionDetail(session_info(s), sorted(s.subscriptions.items()), kept[:limit])
        return None


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
