"""The channel manager (EMQX's emqx_cm, with emqx_broker's routing): which client is connected where,
what happens to sessions, and where each published message goes.

It is every channel's host (channel.ChannelHost): it opens sessions (credentials, connection limits, the
will's authorization, a takeover here or from another node, the store's claim), parks them in the store
when their client leaves, expires them, publishes wills after their delay, routes messages to local
channels and to sessions elsewhere (through the store), and keeps subscriptions in the router and the
store. The fleet (cluster.Cluster) is reached through the small `Fleet` protocol; it calls back the
methods under "for the fleet".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .authn.chain import Credentials, Verdict
from .banned import BanList, Flapping
from .channel import Channel, State
from .codec import MQTT5, RC, Connect
from .eventschema import DropReason
from .journal import JournalChanges
from .message import Delivery, Message, Will
from .metrics import Metrics
from .negotiation import NEVER_EXPIRE, Negotiated
from .retained import Retained
from .router import Router, Subscription
from .session import Session
from .store.base import (
    ClaimOutcome,
    CommitResult,
    Discard,
    Enqueue,
    Op,
    Retain,
    Route,
    Save,
    SessionStore,
    retrying,
)
from .store.committer import GroupCommitter
from .trace import Tracer
from .zone import Zone

log = logging.getLogger("fleetmq.cm")
T = TypeVar("T")


class _OverQuota(Exception):
    """The client's user has max_connections_per_user connections already."""


class Fleet(Protocol):
    """What the channel manager asks of the other nodes (cluster.Cluster)."""

    #: this run of this node (its id and a random part): what the store's connection counts name
    instance: str

    def live_instances(self) -> frozenset[str]:
        """The runs of the fleet's nodes that are alive, as of the last check (about a second ago)."""

    async def check_instances(self, instances: list[str]) -> frozenset[str]:
        """Those of `instances` (runs of nodes) that are alive now."""

    async def catch_up(self, client_id: str, epoch: int, first: int, reserved: int) -> None:
        """Pull what the store queued for a session that just opened here into the positions reserved;
        returns when its held deliveries may go."""

    async def take_over(self, client_id: str, clean_start: bool) -> str | None:
        """Have the node the client is connected to hand its session over; that node, if it did."""

    async def kick_stale(self, client_id: str, owner: str, epoch: int) -> None:
        """Tell a former owner its connection of this client is over."""

    def wake(self, client_id: str) -> None:
        """Pull what the store queued for a session connected here."""

    async def sync(self) -> None:
        """Wait until what the store had queued for the sessions connected here is delivered to them."""


@dataclass(slots=True)
class Offline:
    """What the node keeps about a session parked in the store (routing needs its zone and filters)."""

    zone: str
    filters: list[str]
    expiry: asyncio.TimerHandle | None = None
    will: Will | None = None
    will_timer: asyncio.TimerHandle | None = field(default=None)
    will_at: float = 0.0  # wall-clock time the will is due


class _ClientLock:
    """One client id at a time (ChannelManager._client_id): a lock, kept while anyone holds or waits for
    it. An async context manager class rather than a generator: compiled modules have no async
    generators."""

    __slots__ = ("cid", "lock", "locks", "users")

    def __init__(self, locks: dict[str, _ClientLock], cid: str) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.locks = locks
        self.cid = cid

    async def __aenter__(self) -> None:
        self.users += 1
        try:
            await self.lock.acquire()
        except BaseException:  # (cancelled while waiting)
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.lock.release()
        self._leave()

    def _leave(self) -> None:
        self.users -= 1
        if not self.users:
            del self.locks[self.cid]


Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]
#: positions reserved, when a session opens here, for what the store still queues for it (Fleet.catch_up):
#: more than a queue ever holds, so the order is never short of room
CATCH_UP = 1 << 24
#: how long a node keeps trying to read back a claim whose reply was lost (seconds)
READ_BACK_FOR = 600.0
#: how long a node keeps asking the store for a will that fell due (seconds)
WILL_TAKE_FOR = 60.0
Target = tuple[str, int, bool, tuple[int, ...] | None]  # client id, subscription QoS, RAP, subscription ids


class ChannelManager:
    def __init__(
        self,
        node_id: str,
        zones: Mapping[str, Zone],
        router: Router,
        retained: Retained,
        store: SessionStore,
        committer: GroupCommitter,
        metrics: Metrics,
        spawn: Spawn,
    ) -> None:
        self.node_id = node_id
        self.zones = zones
        self.router = router
        self.retained_msgs = retained
        self.store = store
        self.committer = committer
        self.metrics = metrics
        self.spawn = spawn
        self.fleet: Fleet | None = None
        self.banned = BanList()  # the fleet's bans (node.Node keeps it current)
        self.flapping: Flapping | None = None
        #: a flapping client id to ban fleet-wide (node.Node's; it writes the store)
        self.on_flapping: Callable[[str], None] = lambda _cid: None
        #: packet traces (trace.py; node.Node keeps them): by client id, and those of topic filters
        self.client_tracers: dict[str, list[Tracer]] = {}
        self.topic_tracers: list[Tracer] = []
        self.channels: dict[str, Channel] = {}  # online, CONNACK sent or about to be
        self._online = self.channels.__contains__  # shared groups prefer online members
        self.offline: dict[str, Offline] = {}
        self._locks: dict[str, _ClientLock] = {}
        self._fenced_last: set[str] = set()  # sessions the last commit found owned elsewhere
        #: client id -> the connection counted for its user (max_connections_per_user), its zone, username
        self._user_connections: dict[str, tuple[Channel, str, str]] = {}
        self._authz_warned: dict[str, float] = {}  # zone -> when its authorization service was last logged
        self._client_ids = itertools.count(1)
        self._id_prefix = f"fleetmq-{node_id}-{os.getpid():x}-"
        #: how long a CONNECT waits for a store that does not answer before it is refused (seconds)
        self.claim_wait = 0.0
        committer.on_result = self._committed
        committer.on_failure = self._commit_failed

    @property
    def durable(self) -> bool:
        return self.store.durable

    @property
    def receipts_first(self) -> bool:
        return self.store.durable and not self.store.atomic

    # =============================================================================================
    # the channels' host
    # =============================================================================================
    def new_client_id(self) -> str:
        return f"{self._id_prefix}{next(self._client_ids)}"

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        self.committer.after(callback)

    def retained(self, topic_filter: str) -> Iterable[Message | None]:
        return self.retained_msgs.scan(topic_filter, time.time())

    def subscribe(self, ch: Channel, topic_filter: str, sub: Subscription) -> None:
        self.router.add(ch.client_id, topic_filter, sub)
        self._store_route(ch, topic_filter, sub)

    def unsubscribe(self, ch: Channel, topic_filter: str) -> None:
        self.router.remove(ch.client_id, topic_filter)
        self._store_route(ch, topic_filter, None)

    def _store_route(self, ch: Channel, topic_filter: str, sub: Subscription | None) -> None:
        """Subscriptions are the fleet's route table: a durable store keeps them with the session."""
        if self.store.durable and ch.session is not None:
            self.committer.add(Route(ch.client_id, ch.session.epoch, topic_filter, sub))

    # -- opening a session ---------------------------------------------------------------------------
    def open_session(self, ch: Channel, request: Negotiated) -> None:
        if self.client_tracers:
            tracers = self.client_tracers.get(request.client_id)
            if tracers:
                for tracer in tracers:
                    ch.start_trace(tracer)
                connect = Connect(request.client_id, request.version, request.clean_start,
                                  request.keepalive.interval, username=request.username)  # fmt: skip
                ch.traced("in", [connect])  # (parsed before the trace was on)
        self.spawn(self._connect(ch, request))

    async def _connect(self, ch: Channel, req: Negotiated) -> None:
        """Admit an accepted CONNECT (limits, credentials, the will's authorization), then open its
        session; the channel is told which."""
        t0 = time.perf_counter()
        if self.banned or self.flapping is not None:
            refused = self._banned(ch, req)
            if refused:
                return ch.refuse(RC.BANNED, "banned", refused)
        zone = ch.zone
        settings = ch.settings
        limits = zone.limits
        if settings.max_connections and limits.connections >= settings.max_connections:
            return ch.refuse(RC.QUOTA_EXCEEDED, "max_connections")
        if not limits.connect_allowed(ch.clock.time()):
            return ch.refuse(RC.CONNECTION_RATE_EXCEEDED, "connection_rate_exceeded")
        if ch.cert_name is not None and not zone.knows_certificate(ch.cert_name):
            log.info("refusing %r from %s: its certificate %r is no user of the zone", req.client_id,
                     ch.peer, ch.cert_name)  # fmt: skip
            return ch.refuse(RC.NOT_AUTHORIZED, "certificate_unknown")
        limits.connections += 1
        ch.counted = True
        if zone.authn:
            peer = ch.peer.rpartition(":")[0] or ch.peer
            credentials = Credentials(req.client_id, req.username, req.password, peer)
            mechanism, decision = await zone.authn.authenticate(credentials, ch.clock.wall())
            if ch.state == State.CLOSED:
                return
            if decision.verdict is not Verdict.IGNORE:
                result = "unavailable" if decision.unavailable else decision.verdict.value
                self.metrics.zone(zone.name).authentications[mechanism, result] += 1
            if decision.verdict is Verdict.DENY:
                log.info(
                    "%s authentication refused %r from %s: %s",
                    mechanism,
                    req.client_id,
                    ch.peer,
                    decision.why,
                )
                if decision.unavailable:  # (not the client's fault: it may try again)
                    return ch.refuse(RC.SERVER_UNAVAILABLE, "server_unavailable")
                return ch.refuse(RC.BAD_USER_NAME_OR_PASSWORD, "bad_username_or_password")
            if decision.identity is not None:
                ch.authenticated(decision.identity)
        auth = zone.auth
        if ch.identity is None and auth is not None and req.username is not None and not req.certified:
            # a slow hash by design: computed off the event loop (hashlib releases the GIL)
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, auth.check, req.username, req.password)
            if ch.state == State.CLOSED:
                return
            if not ok:
                log.info("bad credentials from %s", ch.peer)
                return ch.refuse(RC.BAD_USER_NAME_OR_PASSWORD, "bad_username_or_password")
        will, acl = req.will, ch.acl
        if will is not None and ch.identity is not None and ch.identity.authorizer is not None:
            ch.authorized(await self._ask_service(ch, [("publish", will.topic)]))  # (its service decides)
            if ch.state == State.CLOSED:
                return
        if will is not None and acl is not None and req.version >= MQTT5 and not acl.can_publish(will.topic):
            # Told now, with the reason, rather than finding out when the will was due that it never went
            # out. A v3 refusal (code 5) would read as bad credentials, so v3 clients are accepted and
            # their will is dropped (counted, logged) when it would be published; so is a v5 client's if
            # the rules change while it is connected.
            log.info("refusing %r: not authorized to publish its will on %r", ch.client_id, will.topic)
            return ch.refuse(RC.NOT_AUTHORIZED, "will_not_authorized", "will topic not authorized")
        try:
            session, present = await self._open_locked(ch, req.expiry, req.receive_maximum)
        except _OverQuota:
            self.metrics.zone(zone.name).quota_refusals["connections"] += 1
            log.info("refusing %r: user %r is at max_connections_per_user", ch.client_id, ch.username)
            if ch.state != State.CLOSED:
                ch.refuse(RC.QUOTA_EXCEEDED, "quota_exceeded", "too many connections of this user")
            return
        except Exception as e:
            log.warning("cannot open session for %r: %s", ch.client_id, e)
            if ch.state != State.CLOSED:
                ch.refuse(RC.SERVER_UNAVAILABLE, "server_unavailable")
            return
        if present:
            self.metrics.takeover.observe(time.perf_counter() - t0)
        first = -1
        if self.fleet is not None and session.journal is not None:
            # Messages this node routed to the session through Redis just before (its client was not here
            # yet) may land there after the claim; newer ones come straight here. They wait in the queue
            # until the older ones are in, so first deliveries keep publish order.
            first = session.hold_back(CATCH_UP)
        ch.session_opened(session, present, req.connack_props)
        if first >= 0:
            self.spawn(self._catch_up(ch, session, first))

    async def _catch_up(self, ch: Channel, session: Session, first: int) -> None:
        try:
            await self.committer.barrier()  # whatever this node routed through Redis is there now
            if self.fleet is not None and ch.session is session:
                await self.fleet.catch_up(ch.client_id, session.epoch, first, CATCH_UP)
        finally:
            if ch.session is session:
                ch.caught_up()

    def _client_id(self, cid: str) -> _ClientLock:
        """One client id at a time: two CONNECTs with it (or a CONNECT and the read-back of a claim) are
        handled one after the other (`async with self._client_id(cid)`)."""
        entry = self._locks.get(cid)
        if entry is None:
            entry = self._locks[cid] = _ClientLock(self._locks, cid)
        return entry

    async def _open_locked(self, ch: Channel, expiry: float, receive_max: int) -> tuple[Session, bool]:
        """Find or create the session of a connecting client; returns (session, session present)."""
        async with self._client_id(ch.client_id):
            limit = ch.settings.connections_quota(ch.username)
            if limit and ch.username is not None:
                await self._take_connection(ch, ch.username, limit)
            return await self._open(ch, expiry, receive_max)

    # -- authorization services ------------------------------------------------------------------------
    def authorize(self, ch: Channel, asks: list[tuple[str, str]]) -> None:
        self.spawn(self._authorize(ch, asks))

    async def _authorize(self, ch: Channel, asks: list[tuple[str, str]]) -> None:
        ch.authorized(await self._ask_service(ch, asks))

    async def _ask_service(
        self, ch: Channel, asks: list[tuple[str, str]]
    ) -> list[tuple[str, str, bool | None]]:
        """The answers of the client's authorization service: True allow, False deny, None (ignore) the
        rules decide. Asked all at once (a SUBSCRIBE's filters wait for one round trip, not one each);
        one it cannot give denies: it fails closed."""
        authorizer = ch.identity.authorizer if ch.identity is not None else None
        counts = self.metrics.zone(ch.zone_name).authorizations
        if authorizer is None:  # (its identity changed meanwhile: nothing to ask, so nothing allowed)
            return [(action, topic, False) for action, topic in asks]
        verdicts = await asyncio.gather(
            *(authorizer.authorize(action, topic) for action, topic in asks), return_exceptions=True
        )
        answers: list[tuple[str, str, bool | None]] = []
        for (action, topic), verdict in zip(asks, verdicts, strict=True):
            if isinstance(verdict, BaseException):
                if not isinstance(verdict, Exception):
                    raise verdict  # (a cancellation)
                self._service_down(ch.zone_name, f"{type(verdict).__name__}: {verdict}")
                counts[action, "unavailable"] += 1
                answers.append((action, topic, False))
                continue
            counts[action, verdict.value] += 1
            answers.append((action, topic, None if verdict is Verdict.IGNORE else verdict is Verdict.ALLOW))
        return answers

    def _service_down(self, zone: str, message: str) -> None:
        """At most one warning a second per zone: an authorization service down must not flood the log."""
        t = time.monotonic()
        if t - self._authz_warned.get(zone, -1e9) >= 1.0:
            self._authz_warned[zone] = t
            log.warning("authorization service of zone %s cannot answer, denying: %s", zone, message)

    # -- connections per user, over the fleet ---------------------------------------------------------
    @property
    def instance(self) -> str:
        """This run of this node, as the store's connection counts name it."""
        return self.fleet.instance if self.fleet is not None else self.node_id

    async def _take_connection(self, ch: Channel, username: str, limit: int) -> None:
        """Count the client among its user's connections in the fleet; _OverQuota when the user has its
        `limit` already. Under the client id's lock, as is `_free_connection`: a reconnect's count comes
        after the count its previous connection gave back."""
        cid, zone = ch.client_id, ch.zone_name
        live = self.fleet.live_instances() if self.fleet is not None else frozenset()
        instance = self.instance
        deadline = time.monotonic() + self.claim_wait
        store, fleet = self.store, self.fleet
        try:
            taken = await self._until_store(
                lambda: store.take_connection(zone, username, cid, instance, limit, live), ch, deadline
            )
            if isinstance(taken, list) and fleet is not None:  # runs of nodes it has not seen yet
                unseen = taken
                found = await self._until_store(lambda: fleet.check_instances(unseen), ch, deadline)
                live, dead = live | found, [i for i in unseen if i not in found]
                taken = await self._until_store(
                    lambda: store.take_connection(zone, username, cid, instance, limit, live, dead, True),
                    ch,
                    deadline,
                )
        except Exception:
            if cid not in self._user_connections:  # it may have run, its reply lost: given back
                self.spawn(self._free_connection(zone, username, cid))
            raise
        if taken is not True:
            raise _OverQuota
        held = self._user_connections.get(cid)
        if ch.state == State.CLOSED:  # gone meanwhile (closed() has run): given back, unless held
            if held is None:
                self.spawn(self._free_connection(zone, username, cid))
            return
        if held is not None and (held[1], held[2]) != (zone, username):
            self.spawn(self._free_connection(held[1], held[2], cid))  # the client id's previous user's
        self._user_connections[cid] = (ch, zone, username)

    async def _free_connection(self, zone: str, username: str, cid: str) -> None:
        """Give a connection's count back; sent again while the store is away (it is idempotent), for
        a count left behind would refuse the user's clients for as long as this node runs."""
        instance = self.instance
        try:
            async with self._client_id(cid):
                await retrying(
                    self.store,
                    lambda: self.store.free_connection(zone, username, cid, instance),
                    time.monotonic() + READ_BACK_FOR,
                )
        except Exception as e:
            log.warning("cannot give back the connection of %r (user %r): %s", cid, username, e)

    async def _open(self, ch: Channel, expiry: float, receive_max: int) -> tuple[Session, bool]:
        cid = ch.client_id
        telemetry = ch.telemetry
        session: Session | None = None
        old = self.channels.pop(cid, None)
        if old is not None:
            # Takeover: the old connection is closed (v5: 0x8E) and its session continues here.
            session = old.session
            old.session = None
            old.kick(RC.SESSION_TAKEN_OVER, "takenover")
            telemetry.taken_over(cid, "local")
            # The old connection ended without DISCONNECT, so its will applies; a delayed will is
            # cancelled by this very reconnect unless Clean Start ends the session [MQTT-3.1.3-9].
            if old.will is not None and (ch.clean_start or old.will_delay <= 0):
                self.publish_will(Will(old.will, old.zone_name, old.username))
            if session is not None and ch.clean_start:
                self._discard(session)
                telemetry.session("discarded", cid)
                session = None
            elif session is not None:
                session.expiry_interval = expiry
                try:
                    await self.store.set_will(session, ch.will, ch.will_delay)  # the new connection's
                except Exception:
                    # refused: the session waits for its client, as its old connection left it
                    self.committer.add(Save(session, session.expiry_interval))
                    raise
        epoch = session.epoch if session is not None else 0
        incarnation = ""
        if session is None:
            # A store away for a moment (a restart, a failover) is waited for, up to claim_wait, rather
            # than refusing the client: some clients mishandle a refused reconnect (paho-mqtt resends a
            # released QoS 2 PUBLISH as a new one after two connection attempts: README Known limits).
            deadline = time.monotonic() + self.claim_wait
            fleet = self.fleet
            # connected on another node? it hands the session over first (and counts the takeover)
            if (
                fleet is not None
                and await self._until_store(lambda: fleet.take_over(cid, ch.clean_start), ch, deadline)
                is not None
            ):
                telemetry.taken_over(cid, "remote", counted=False)
            if self.committer.pending:
                # A Save of this session (and messages queued for it) may still be on the way to the
                # store; it stays parked meanwhile, so messages published now are queued, not lost.
                await self.committer.barrier()
            token = os.urandom(8).hex()  # (sent again, the same claim gets the same answer)
            try:
                claimed = await self._until_store(
                    lambda: self.store.claim(
                        cid, ch.settings, ch.zone_name, ch.clean_start, ch.will, ch.will_delay, expiry,
                        ch.username, token,
                    ),
                    ch,
                    deadline,
                )  # fmt: skip
            except Exception as e:
                if self.store.transient(e):  # it may have run: find out once the store answers
                    self.spawn(self._read_back_claim(cid, token))
                raise
            epoch, session, incarnation = claimed.epoch, claimed.session, claimed.incarnation
            if claimed.stored is not None:
                session = Session(cid, ch.settings, ch.zone_name)
                stored = claimed.stored
                overflow = session.restore(
                    epoch=epoch,
                    expiry_interval=stored.expiry_interval,
                    next_pid=stored.next_pid,
                    order=stored.order,
                    subscriptions=stored.subscriptions,
                    deliveries=stored.deliveries,
                    awaiting_rel=stored.awaiting_rel,
                    sink=self.committer,
                    incarnation=stored.incarnation,
                    received=stored.received,
                    seen=stored.seen,
                    twins=stored.twins,
                )
                if overflow:  # more waited in Redis than the zone's queue holds: the oldest go, counted
                    telemetry.dropped_all(DropReason.QUEUE_FULL, cid, overflow, session)
            if claimed.previous and claimed.previous != self.node_id and self.fleet is not None:
                telemetry.taken_over(cid, "remote")
                self.spawn(self.fleet.kick_stale(cid, claimed.previous, epoch))
            parked = self.offline.pop(cid, None)
            if parked is not None:
                if parked.expiry is not None:
                    parked.expiry.cancel()
                if parked.will_timer is not None:
                    parked.will_timer.cancel()
                    if ch.clean_start and parked.will is not None and not self.store.durable:
                        # the old session ends: its will goes now (a durable store's claim took it from
                        # the store and answered with it: published below, once)
                        self.publish_will(parked.will)
            if claimed.ended_will is not None:
                self.publish_will(claimed.ended_will)
            if self.fleet is not None:
                # what this client published through another node before is in Redis for sessions here:
                # it reaches them before anything it publishes here now goes to them directly
                await self.fleet.sync()
            if claimed.discarded:
                self.router.remove_client(cid)
                telemetry.session("discarded", cid)
        present = session is not None
        if session is None:
            session = Session(
                cid, ch.settings, ch.zone_name, expiry_interval=expiry, receive_maximum=receive_max
            )
            session.epoch = epoch
            session.incarnation = incarnation
            telemetry.session("created", cid)
        else:
            session.expiry_interval = expiry
            session.zone_name = ch.zone_name
            session.apply_zone(ch.settings)
            session.set_receive_maximum(receive_max)
            telemetry.session("resumed", cid)
        if self.store.durable and session.expiry_interval > 0:
            # every change reaches the store before what depends on it is acknowledged
            session.enable_journal(self.committer)
        self.channels[cid] = ch
        if self.fleet is not None and session.journal is None:
            self.fleet.wake(cid)  # deliveries queued in Redis while we claimed (their wake found no one)
        return session, present

    async def _until_store(self, call: Callable[[], Awaitable[T]], ch: Channel, deadline: float) -> T:
        """`call`, made again while the store fails for a passing reason, until `deadline` or the client
        leaves (each call must be safe to make twice)."""
        return await retrying(self.store, call, deadline, lambda: ch.state == State.CLOSED)

    async def _read_back_claim(self, cid: str, token: str) -> None:
        """A claim whose reply never came may have run: its client was refused (server unavailable) all
        the same. Once the store answers, find out; if it ran, do what its answer would have had done
        (the routes of a session Clean Start ended go, its will goes out) and undo what the refused
        client would leave behind (a session marked connected here for good). Gives up after
        READ_BACK_FOR, or on an error that would only repeat."""
        outcome: ClaimOutcome | None = None

        async def read_back() -> None:
            nonlocal outcome
            async with self._client_id(cid):
                if outcome is None:
                    outcome = await self.store.claimed(cid, token)
                    if not outcome.ran:
                        return
                    log.info("a claim of %r whose reply was lost had run; undoing it", cid)
                    if outcome.discarded and cid not in self.channels:
                        self.router.remove_client(cid)
                    if outcome.ended_will is not None:
                        self.publish_will(outcome.ended_will)
                if outcome.ran:
                    await self.store.abandon(cid, token)

        try:
            await retrying(self.store, read_back, time.monotonic() + READ_BACK_FOR)
        except Exception as e:
            log.warning("gave up reading back a claim of %r whose reply was lost: %s", cid, e)

    # -- a connection ends ---------------------------------------------------------------------------
    def closed(self, ch: Channel) -> None:
        """A connection ended: uncount it, publish its will (maybe later), park or discard its session."""
        if ch.counted:
            ch.counted = False
            ch.zone.limits.connections -= 1
        cid = ch.client_id
        held = self._user_connections.get(cid)
        if held is not None and held[0] is ch:
            del self._user_connections[cid]
            self.spawn(self._free_connection(held[1], held[2], cid))
        session = ch.session
        if session is None or self.channels.get(cid) is not ch:
            return  # not connected yet, or taken over: the new connection owns the session now
        del self.channels[cid]
        ch.session = None
        expiry = session.expiry_interval
        if ch.will is not None:
            self._will(cid, Will(ch.will, ch.zone_name, ch.username), ch.will_delay, expiry)
        if expiry <= 0:
            self._discard(session)
            self.committer.add(Discard(cid, session.epoch))
            return
        parked = self.offline.get(cid) or Offline(ch.zone_name, list(session.subscriptions))
        parked.zone = ch.zone_name
        parked.filters = list(session.subscriptions)
        self.offline[cid] = parked
        pending_will = parked.will.msg if parked.will is not None and parked.will_timer is not None else None
        self.committer.add(Save(session, expiry, pending_will, parked.will_at))
        if expiry < NEVER_EXPIRE:
            parked.expiry = asyncio.get_running_loop().call_later(expiry, self._expire, cid)

    def revoke_certificates(self) -> int:
        """Disconnect (0x87) the clients whose certificate's user their zone no longer knows, after a
        config changed: removing a certificate's user revokes it at once, not at its next CONNECT."""
        revoked = [
            ch
            for ch in self.channels.values()
            if ch.cert_name is not None and not ch.zone.knows_certificate(ch.cert_name)
        ]
        for ch in revoked:
            log.info("disconnecting %r: its certificate %r is no user of zone %s any more",
                     ch.client_id, ch.cert_name, ch.zone_name)  # fmt: skip
            ch.kick(RC.NOT_AUTHORIZED, "certificate_revoked")
        return len(revoked)

    def kick(self, client_id: str, discard: bool) -> bool:
        """The management API's kick: DISCONNECT 0x98 (v3: closed); with `discard` its session ends
        instead of waiting for it (closed() then discards it, as an expiry of 0 does). Whether it was
        connected here."""
        ch = self.channels.get(client_id)
        if ch is None:
            return False
        if discard and ch.session is not None:
            ch.session.expiry_interval = 0.0
        log.info(
            "disconnecting %r: asked by the management API%s", client_id, " (session discarded)" * discard
        )
        ch.kick(RC.ADMINISTRATIVE_ACTION, "kicked")
        return True

    def end_session(self, client_id: str) -> None:
        """The management API ends the session of a client connected nowhere: its routes go, the store
        forgets it (fleet-wide), a will this node still waits to publish goes now [MQTT-3.1.3-9]."""
        parked = self.offline.pop(client_id, None)
        if parked is not None:
            for timer in (parked.expiry, parked.will_timer):
                if timer is not None:
                    timer.cancel()
            if parked.will_timer is not None and parked.will is not None:
                self.publish_will(parked.will)
            for topic_filter in parked.filters:
                self.router.remove(client_id, topic_filter)
        self.committer.add(Discard(client_id))

    def _banned(self, ch: Channel, req: Negotiated) -> str | None:
        """Why a CONNECT is refused as banned (a ban of its client id, username or address, or its client id
        flapping now), None if it is not."""
        peerhost = ch.peer.rpartition(":")[0].strip("[]") or ch.peer
        ban = self.banned.hit(req.client_id, req.username, peerhost, ch.clock.wall())
        if (
            ban is None
            and self.flapping is not None
            and self.flapping.connected(req.client_id, ch.clock.time())
        ):
            self.flapping.forget(req.client_id)
            self.metrics.flapping_bans += 1
            log.warning("client id %r from %s connects too often (flapping): banned", req.client_id, ch.peer)
            self.on_flapping(req.client_id)
            self.metrics.banned_refusals += 1
            return "banned: flapping"
        if ban is None:
            return None
        self.metrics.banned_refusals += 1
        log.info("refusing %r from %s: banned by %s %r", req.client_id, ch.peer, ban.kind, ban.who)
        return f"banned: {ban.reason}" if ban.reason else "banned"

    def kick_banned(self) -> int:
        """Disconnect (0x98) the connected clients a ban now matches."""
        now = time.time()
        hit = [
            ch for ch in self.channels.values()
            if self.banned.hit(ch.client_id, ch.username, ch.peer.rpartition(":")[0].strip("[]"), now)
        ]  # fmt: skip
        for ch in hit:
            log.info("disconnecting %r: banned", ch.client_id)
            ch.kick(RC.ADMINISTRATIVE_ACTION, "banned")
        return len(hit)

    def _let_go(self, ch: Channel, reason: int, why: str) -> None:
        """Drop this node's copy of a session without storing anything, and close its connection."""
        if self.channels.get(ch.client_id) is ch:
            del self.channels[ch.client_id]
        ch.session = None
        ch.kick(reason, why)

    # -- wills ---------------------------------------------------------------------------------------
    def publish_will(self, will: Will) -> None:
        """Publish a will that fell due, if its client may still publish on its topic: the rules may have
        changed since its CONNECT, and a v3 client was not told at CONNECT (`_connect`)."""
        zone = self.zones.get(will.zone)
        msg = will.msg
        acl = zone.acl if zone is not None else None
        if (
            zone is not None
            and acl is not None
            and not acl.bind(will.username, msg.sender).can_publish(msg.topic)
        ):
            log.warning("dropped the will of %r: not authorized to publish on %r", msg.sender, msg.topic)
            zone.telemetry.dropped(DropReason.NOT_AUTHORIZED, msg.sender, msg)
            return
        self.publish(msg, will.zone)

    def _will(self, cid: str, will: Will, delay: float, expiry: float) -> None:
        """Publish a will now, or after its delay unless the session ends first (then at its end)."""
        delay = min(delay, expiry)
        if delay <= 0:
            self.publish_will(will)
            return
        parked = self.offline.get(cid)
        if parked is None:
            parked = self.offline[cid] = Offline(will.zone, [])
        parked.will = will
        parked.will_at = time.time() + delay
        parked.will_timer = asyncio.get_running_loop().call_later(delay, self._delayed_will, cid)

    def _delayed_will(self, cid: str) -> None:
        parked = self.offline.get(cid)
        if parked is None or parked.will is None:
            return
        will, parked.will, parked.will_timer = parked.will, None, None
        if not self.store.durable:
            self.publish_will(will)
            return

        async def take_and_publish(will_at: float) -> None:
            # the will is also in Redis (so it survives this node): exactly one node publishes it, and a
            # take whose reply is lost is asked again (the same token gets the same answer)
            token = os.urandom(8).hex()
            try:
                taken = await retrying(
                    self.store,
                    lambda: self.store.take_will(cid, will_at, token),
                    time.monotonic() + WILL_TAKE_FOR,
                )
            except Exception as e:
                log.warning("the will of %r was not published: the store did not answer (%s)", cid, e)
                return
            if taken is not None:
                self.publish_will(will)

        self.spawn(take_and_publish(parked.will_at))

    def _expire(self, cid: str) -> None:
        parked = self.offline.pop(cid, None)
        if parked is None:
            return
        if parked.will_timer is not None:
            parked.will_timer.cancel()
            if parked.will is not None:
                self.publish_will(parked.will)  # session end: the will goes now [MQTT-3.1.3-9]
        for topic_filter in parked.filters:
            self.router.remove(cid, topic_filter)
        if not self.store.durable:  # a durable store expires sessions itself (fleet-wide TTL)
            self.committer.add(Discard(cid))
        zone = self.zones.get(parked.zone)
        if zone is not None:
            zone.telemetry.session("expired", cid)
        log.debug("session %r expired", cid)

    def _discard(self, session: Session) -> None:
        for topic_filter in session.subscriptions:
            self.router.remove(session.client_id, topic_filter)
        session.subscriptions.clear()

    def shutdown(self) -> None:
        for parked in self.offline.values():
            for t in (parked.expiry, parked.will_timer):
                if t is not None:
                    t.cancel()

    # =============================================================================================
    # routing (EMQX's emqx_broker)
    # =============================================================================================
    def publish(self, msg: Message, zone: str = "default") -> tuple[int, bool]:
        """Route a message; returns (sessions matched, whether the publisher's ack must await a commit).

        `zone` is the publisher's, for the no-subscribers drop counter.
        """
        durable = self.store.durable
        if msg.retain:
            self.retained_msgs.put(msg)
            if durable:
                self.committer.add(Retain(msg))
        channels = self.channels
        if self.topic_tracers:
            for tracer in self.topic_tracers:
                tracer.routed(msg.sender, msg.topic, msg.qos, msg.retain, msg.payload, msg.ts)
        matches = self.router.match(msg.topic, self._online)
        if not matches:
            z = self.zones.get(zone)
            if z is not None:
                z.telemetry.dropped(DropReason.NO_SUBSCRIBERS, msg.sender, msg)
            return 0, durable and msg.retain
        sender = msg.sender
        if len(matches) > 1 and len({cid for cid, _ in matches}) != len(matches):
            targets = _merge_overlapping(matches, sender)
        else:
            targets = [
                (cid, sub.qos, sub.retain_as_published, None if sub.sub_id is None else _sub_ids(sub.sub_id))
                for cid, sub in matches
                if not (sub.no_local and cid == sender)
            ]
        needs_commit = durable and msg.retain
        mqos = msg.qos
        mretain = msg.retain
        # what is queued in Redis for others is stored only while the publisher's journaled session is
        # still ours (Message.sender_epoch)
        here: list[Channel] | None = None
        if durable and mqos:
            pch = channels.get(sender)
            if pch is not None and pch.session is not None and pch.session.journal is not None:
                msg.sender_epoch = pch.session.epoch
                if mqos == 2 and msg.receipt is None:
                    # (with a receipt, the message is received for good: its receipt is stored, and every
                    # routing of it, this one or the resend's through the session's new owner, is
                    # deduplicated under it; taking it back would leave the receipt seen and lose it)
                    here = self._unless_fenced(sender, msg)
        receipt = msg.receipt
        for cid, sub_qos, rap, sub_ids in targets:
            qos = mqos if mqos < sub_qos else sub_qos
            retain = mretain and rap
            ch = channels.get(cid)
            if ch is not None and ch.session is not None:
                if receipt is not None and not ch.session.admit(receipt):
                    continue  # a publisher's resend routed again: this session has it (the store too)
                ch.deliver(msg, qos, retain, sub_ids)
                if qos and ch.session.journal is not None:  # journaled: the publisher's ack awaits the commit
                    needs_commit = True
                    if here is not None and qos == 2:
                        here.append(ch)
                continue
            if durable:  # the store knows whether the session exists and keeps QoS0 for it
                self.committer.add(Enqueue(cid, Delivery(msg, qos, retain, sub_ids)))
                needs_commit = True
                continue
            parked = self.offline.get(cid)
            if parked is None:
                continue  # connecting right now: it resubscribes or resumes from the store
            pz = self.zones.get(parked.zone)
            if qos == 0 and pz is not None and not pz.settings.mqueue_store_qos0:
                pz.telemetry.dropped(DropReason.QOS0_OFFLINE, cid, msg, 0)
                continue
            self.committer.add(Enqueue(cid, Delivery(msg, qos, retain, sub_ids)))
            needs_commit = True
        return len(matches), needs_commit

    def _unless_fenced(self, publisher: str, msg: Message) -> list[Channel]:
        """The local side of Message.sender_epoch, for a QoS 2 message of a journaled publisher: the
        channels it is delivered to here (filled by the caller) take it back if the commit that stores it
        finds the publisher's session fenced. Their PUBLISH waits for that commit, and this check runs
        before it (callbacks run in the order they were registered)."""
        channels: list[Channel] = []

        def check(ok: bool) -> None:
            if ok and publisher in self._fenced_last:
                for ch in channels:
                    ch.retract(msg)

        self.committer.after(check)
        return channels

    # -- what the store did --------------------------------------------------------------------------
    def _committed(self, result: CommitResult) -> None:
        self._fenced_last = {cid for cid, _epoch in result.fenced} | {cid for cid, _e in result.refused_from}
        for zone, cid, n in result.dropped:
            z = self.zones.get(zone)
            if z is not None:  # the oldest messages of a full queue in the store (ids unknown)
                # the queue was trimmed back to its limit
                z.telemetry.dropped_unseen(DropReason.QUEUE_FULL, cid, n, z.settings.max_mqueue_len)
        for zone, cid, n in result.skipped_qos0:
            z = self.zones.get(zone)
            if z is not None:
                z.telemetry.dropped_unseen(DropReason.QOS0_OFFLINE, cid, n)
        for op in result.missing:  # the session ended (expired) somewhere: its routes go too
            if op.client_id not in self.channels:
                self.router.remove_client(op.client_id)
        for cid, epoch in [*result.fenced, *result.refused_from]:
            ch = self.channels.get(cid)
            # (a write of an older connection's, sent again after a failed commit, says nothing of this one)
            if ch is not None and (ch.session is None or ch.session.epoch <= epoch):
                # Another node owns the session now: what this connection published and this commit
                # routed was refused for it (a publisher's), so it must not be acknowledged: the channel
                # goes before the acks waiting for this commit run, and its client sends it again.
                self._fence(ch)
        if result.refused:
            log.info(
                "%d deliveries not queued: their publisher's session is another node's now", result.refused
            )
        if result.rerouted:
            log.info(
                "%d deliveries routed into stale copies of sessions taken over meanwhile were queued for them",
                result.rerouted,
            )

    def _commit_failed(self, ops: list[Op]) -> None:
        """A journal write may be lost: those sessions resynchronise from the store (their clients
        reconnect and resume from what it holds, which never lost anything acknowledged)."""
        for op in ops:
            if isinstance(op, JournalChanges):
                self.resync(op.client_id, op.epoch)

    # =============================================================================================
    # for the fleet (cluster.Sessions)
    # =============================================================================================
    def session_of(self, client_id: str) -> Session | None:
        """The session of a client connected here."""
        ch = self.channels.get(client_id)
        return ch.session if ch is not None else None

    def connected(self) -> Iterable[str]:
        return list(self.channels)

    def owned(self) -> list[tuple[str, int, Message | None, float]]:
        """The sessions connected here, as the store knows them: (client id, epoch, will, will delay)."""
        return [
            (cid, ch.session.epoch, ch.will, ch.will_delay)
            for cid, ch in self.channels.items()
            if ch.session is not None
        ]

    def counts(self) -> tuple[int, int]:
        """Connections and sessions on this node (what it reports to the operator)."""
        channels = self.channels.values()
        return len(channels), sum(1 for ch in channels if ch.session is not None)

    def deliver_stored(self, client_id: str, epoch: int, deliveries: Iterable[Delivery]) -> None:
        """Deliveries the store queued for a session connected here (pulled at `epoch`)."""
        ch = self.channels.get(client_id)
        if ch is None or ch.session is None or ch.session.epoch != epoch:
            return  # they stay journaled (or queued) in Redis for the next owner
        for d in deliveries:
            ch.deliver_stored(d)

    async def hand_over(self, cid: str, clean_start: bool) -> None:
        """Another node got a CONNECT for a client connected here: close ours (0x8E), store the session."""
        ch = self.channels.get(cid)
        if ch is None or ch.session is None:
            return
        session = ch.session
        del self.channels[cid]
        ch.session = None
        ch.kick(RC.SESSION_TAKEN_OVER, "takenover")
        ch.telemetry.taken_over(cid, "handover")
        # A will without delay goes now; a delayed one is cancelled by the reconnect unless the new
        # connection's Clean Start ends the session [MQTT-3.1.3-9].
        if ch.will is not None and (clean_start or ch.will_delay <= 0):
            self.publish_will(Will(ch.will, ch.zone_name, ch.username))
        # Its routes stay: the session lives on (on the new node), and what is published here for it
        # is queued in Redis for it from now on.
        if session.expiry_interval > 0:
            self.committer.add(Save(session, session.expiry_interval))
        else:
            self._discard(session)
            self.committer.add(Discard(cid, session.epoch))
        await self.committer.barrier()

    def resync(self, client_id: str, epoch: int) -> None:
        """This node's copy of a session (at `epoch`) may differ from the store's (a write's outcome is
        unknown): close the connection (v5: 0x88); the reconnect resumes from the store."""
        ch = self.channels.get(client_id)
        if ch is None or ch.session is None or ch.session.epoch != epoch:
            return
        self._let_go(ch, RC.SERVER_UNAVAILABLE, "store_error")
        log.warning("session %r is resynchronising from the store; closed its connection", client_id)

    def fenced(self, client_id: str, epoch: int | None = None) -> None:
        """Another node owns the session now (at `epoch`, or whatever it is): let go of a stale copy."""
        ch = self.channels.get(client_id)
        if ch is None or ch.session is None or (epoch is not None and ch.session.epoch >= epoch):
            return
        self._fence(ch)

    def _fence(self, ch: Channel) -> None:
        self._let_go(ch, RC.SESSION_TAKEN_OVER, "takenover")
        log.info("session %r is owned by another node now; closed the connection here", ch.client_id)


_SUB_IDS: dict[int, tuple[int, ...]] = {}


def _sub_ids(sid: int) -> tuple[int, ...]:
    """One shared tuple per subscription identifier."""
    t = _SUB_IDS.get(sid)
    if t is None:
        t = _SUB_IDS[sid] = (sid,)
    return t


def _merge_overlapping(matches: list[tuple[str, Subscription]], sender: str) -> list[Target]:
    """One delivery per client for overlapping subscriptions: the highest QoS and every subscription id
    [MQTT-3.3.4-2, -3]; a No Local subscription does not count for the publisher itself."""
    merged: dict[str, list[Any]] = {}
    for cid, sub in matches:
        if sub.no_local and cid == sender:
            continue
        m = merged.get(cid)
        if m is None:
            merged[cid] = [sub.qos, sub.retain_as_published, [sub.sub_id] if sub.sub_id else []]
            continue
        m[0] = max(m[0], sub.qos)
        m[1] = m[1] or sub.retain_as_published
        if sub.sub_id:
            m[2].append(sub.sub_id)
    return [(cid, q, rap, tuple(ids) or None) for cid, (q, rap, ids) in merged.items()]
