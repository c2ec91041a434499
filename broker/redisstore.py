"""The Redis session store: sessions a fleet of nodes shares, so a client resumes on any node.

Layout: every key of one session carries the hash tag ``{client_id}`` (one Redis Cluster slot):
``fmq:{cid}:m`` meta hash (epoch, node, zone, limits), ``:s`` subscriptions (filter -> options; the
fleet's route table), ``:q`` deliveries queued for it by other nodes, ``:i`` the journal of its
deliveries (message id -> order, packet id, stage, message: the Inflight Window and the Message Queue),
``:r`` incoming QoS2 packet ids awaiting PUBREL. Fleet-wide: ``fmq:retained``.

Multi-key changes of a session are Lua scripts fenced by the session's epoch: a node whose epoch is stale
(the session was taken over meanwhile) cannot write. Claiming and pulling move ``:q`` into ``:i`` inside
the script, so a delivery is always in Redis until its client acknowledges it. Sessions that wait for
their client carry a TTL of their expiry interval, so Redis deletes them when they expire, whichever
node is alive. Every write of one event-loop turn goes to Redis as one pipeline (group commit).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from . import keys, wire
from .config import RedisStoreConfig
from .journal import JournalChanges
from .message import Delivery, Message, Will
from .redisclient import StoreConnections
from .router import Subscription
from .session import Session
from .store import (
    Claimed,
    CommitResult,
    Discard,
    Enqueue,
    Op,
    Retain,
    Route,
    Save,
    SessionStore,
    StoredSession,
)
from .wire import (
    journal_field,
    journal_value,
    pack_delivery,
    pack_message,
    pack_sub,
    unpack_journal,
    unpack_message,
    unpack_sub,
)
from .zones import ZoneSettings

log = logging.getLogger("fleetmq.redis")

CHUNK = 512  # values per HSET/RPUSH call inside scripts (Lua's unpack() has a limit)


# -- scripts ---------------------------------------------------------------------------------------
_PRELUDE = """
local function hset_pairs(key, list, first, n)
  local t = {}
  for j = 0, n - 1 do
    t[#t + 1] = list[first + 2 * j]; t[#t + 1] = list[first + 2 * j + 1]
    if #t >= CHUNK_N then redis.call('HSET', key, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HSET', key, unpack(t)) end
end
local function hdel_list(key, list, first, n)
  local t = {}
  for j = 0, n - 1 do
    t[#t + 1] = list[first + j]
    if #t >= CHUNK_N then redis.call('HDEL', key, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HDEL', key, unpack(t)) end
end
-- Move up to n (all if n <= 0) deliveries queued in q into the journal i, numbering them in order from
-- `first` (positions the owner reserved for them: its later deliveries come after, whatever it stored
-- since) or, without one, from the stored counter. The counter only grows.
local function move_queue(m, q, i, n, first)
  local items = redis.call('LRANGE', q, 0, n > 0 and n - 1 or -1)
  local stored = tonumber(redis.call('HGET', m, 'order') or '0')
  local start = first or stored
  if #items == 0 then return start, items end
  redis.call('LTRIM', q, #items, -1)
  local t = {}
  for k = 1, #items do
    t[#t + 1] = string.sub(items[k], 1, @ID_LEN@)
    t[#t + 1] = string.format('%d', start + k - 1) .. ':' .. items[k]
    if #t >= CHUNK_N then redis.call('HSET', i, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HSET', i, unpack(t)) end
  redis.call('HSET', m, 'order', string.format('%d', math.max(stored, start + #items)))
  return start, items
end
-- Whether each of n publisher sessions, whose meta keys are KEYS[first_key...], is still at the epoch in
-- ARGV[first_arg...]: what a node routed for a publisher fenced meanwhile is not queued (its client sends
-- it again to the new owner, which routes it itself).
local function guards_ok(first_key, first_arg, n)
  local ok = {}
  for g = 1, n do ok[g] = redis.call('HGET', KEYS[first_key + g - 1], 'epoch') == ARGV[first_arg + g - 1] end
  return ok
end
-- Append packed deliveries to the queue q of the session with meta m, as any routing through the store
-- does: wake its owner if the queue was empty (the owner drains the whole queue when woken, and wakes
-- itself after a partial pull), keep the session's TTL, and trim an offline session's queue to its limit
-- (the oldest go). Returns how many were dropped and the session's zone.
local function queue_push(m, q, cid, items)
  local meta = redis.call('HMGET', m, 'maxq', 'zone', 'online', 'node')
  local online = meta[3] == '1'
  local before = redis.call('LLEN', q)
  for j = 1, #items, CHUNK_N do
    redis.call('RPUSH', q, unpack(items, j, math.min(j + CHUNK_N - 1, #items)))
  end
  local len = before + #items
  if before == 0 and len > 0 and online and meta[4] then
    redis.call('PUBLISH', @NODE_CHANNEL_PREFIX@ .. meta[4], wake(cid))
  end
  local ttl = redis.call('PTTL', m)
  if ttl > 0 then redis.call('PEXPIRE', q, ttl) end
  local dropped = 0
  local max = tonumber(meta[1] or '0')
  if max > 0 and not online and len > max then
    dropped = len - max
    redis.call('LTRIM', q, dropped, -1)
  end
  return dropped, meta[2] or 'default'
end
"""


# What the scripts' @NAME@ placeholders stand for: key names and pub/sub messages from their modules.
_SUBSTITUTIONS = {
    "@EVENTS@": f"'{keys.EVENTS}'",
    "@NODE_CHANNEL_PREFIX@": f"'{keys.NODE_CHANNEL_PREFIX}'",
    "@ID_LEN@": str(wire.DELIVERY_ID_LEN),
    "CHUNK_N": str(CHUNK),
}


def _script(body: str) -> str:
    text = wire.LUA_PRELUDE + _PRELUDE + body
    for name, value in _SUBSTITUTIONS.items():
        text = text.replace(name, value)
    assert "@" not in text, "a script placeholder without a value"
    return text


# KEYS: m s q i r. ARGV: node, clean start, client id, packed will ('' = none), will delay, expiry, zone,
# username, 1|0 (whether there is a username). The will is kept with the session so that, if this node
# dies, another node publishes it, as the zone's rules allow for that client (zone and username).
# Returns {epoch, 0|1 (new | Clean Start discarded it), discarded filters, previous owner, ended will,
# its zone, its username} or {epoch, 2, previous owner, meta, subscriptions, journal, awaiting rel}.
CLAIM = """
local existed = redis.call('EXISTS', KEYS[1]) == 1
local prev = redis.call('HMGET', KEYS[1], 'node', 'online')
local previous = ''
if prev[2] == '1' and prev[1] then previous = prev[1] end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local filters = {}
local ended = {'', false, false}
if existed and ARGV[2] == '1' then
  filters = redis.call('HKEYS', KEYS[2])
  -- Clean Start ends the stored session: a will it still had waiting goes out now [MQTT-3.1.3-9]
  if redis.call('HEXISTS', KEYS[1], 'will_at') == 1 then ended = redis.call('HMGET', KEYS[1], 'will', 'zone', 'user') end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
  redis.call('PUBLISH', @EVENTS@, session_ended(ARGV[1], ARGV[3]))
end
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'online', '1', 'expiry', ARGV[6], 'zone', ARGV[7])
if ARGV[9] == '1' then redis.call('HSET', KEYS[1], 'user', ARGV[8]) else redis.call('HDEL', KEYS[1], 'user') end
-- the reconnect cancels a will still waiting for its delay [MQTT-3.1.3-9]; the new connection brings its own
redis.call('HDEL', KEYS[1], 'will_at')
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[4], 'will_delay', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'will', 'will_delay')
end
for k = 1, 5 do redis.call('PERSIST', KEYS[k]) end
if not existed or ARGV[2] == '1' then
  return {epoch, existed and 1 or 0, filters, previous, ended[1], ended[2], ended[3]}
end
move_queue(KEYS[1], KEYS[3], KEYS[4], 0)
return {epoch, 2, previous, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
        redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5])}
"""

# KEYS: m i r q, then the meta keys of the guards' publisher sessions. ARGV: epoch, next pid, order, client
# id, n guards, the guards' epochs, n puts, (msg id, value)..., n dels, msg id..., n rel puts, (pid, ts)...,
# n rel dels, pid..., n fresh, (put number, guard number or 0)...: the fresh puts are deliveries routed into
# the session on this node since its last commit; one whose publisher was fenced meanwhile is not stored
# (Message.sender_epoch; the node takes it back from its copy). Returns 1, or {0, dropped, zone, refused,
# queued} when fenced: another node owns the session now and this node's changes to it are refused, but
# what it routed into its stale copy still belongs to the session and is queued for it, as a routing
# through the store would have been (the oldest dropped if the session is offline and its queue full).
JOURNAL = """
local ng = tonumber(ARGV[5])
local puts = 6 + ng
local dels = puts + 1 + 2 * tonumber(ARGV[puts])
local rputs = dels + 1 + tonumber(ARGV[dels])
local rdels = rputs + 1 + 2 * tonumber(ARGV[rputs])
local fresh = rdels + 1 + tonumber(ARGV[rdels])
local nf = tonumber(ARGV[fresh])
local ok = guards_ok(5, 6, ng)
local refused = {}  -- put number -> true: routed for a publisher fenced meanwhile
local nrefused = 0
for j = fresh + 1, fresh + 2 * nf, 2 do
  local g = tonumber(ARGV[j + 1])
  if g > 0 and not ok[g] then refused[tonumber(ARGV[j])] = true; nrefused = nrefused + 1 end
end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  if nf == nrefused or redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, '', nrefused, 0} end
  local items = {}
  for j = fresh + 1, fresh + 2 * nf, 2 do
    local n = tonumber(ARGV[j])
    if not refused[n] then items[#items + 1] = queued_delivery(ARGV[puts + 2 * n]) end
  end
  local dropped, zone = queue_push(KEYS[1], KEYS[4], ARGV[4], items)
  return {0, dropped, zone, nrefused, #items}
end
local order = math.max(tonumber(redis.call('HGET', KEYS[1], 'order') or '0'), tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'next_pid', ARGV[2], 'order', string.format('%d', order))
if nrefused == 0 then
  hset_pairs(KEYS[2], ARGV, puts + 1, tonumber(ARGV[puts]))
else
  local t = {}
  for n = 1, tonumber(ARGV[puts]) do
    if not refused[n] then t[#t + 1] = ARGV[puts + 2 * n - 1]; t[#t + 1] = ARGV[puts + 2 * n] end
  end
  hset_pairs(KEYS[2], t, 1, #t / 2)
end
hdel_list(KEYS[2], ARGV, dels + 1, tonumber(ARGV[dels]))
hset_pairs(KEYS[3], ARGV, rputs + 1, tonumber(ARGV[rputs]))
hdel_list(KEYS[3], ARGV, rdels + 1, tonumber(ARGV[rdels]))
return 1
"""

# KEYS: m s q i r. ARGV: epoch, ttl ms, n meta, (k, v)... The client left: the session (journaled all
# along) waits for it until the TTL ends it. Meta may carry a will waiting for its delay (will, will_at).
PARK = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('HDEL', KEYS[1], 'will', 'will_delay', 'will_at')
-- a will waiting for its delay is kept with its due time: if this node dies first, another publishes it
hset_pairs(KEYS[1], ARGV, 4, tonumber(ARGV[3]))
local ttl = tonumber(ARGV[2])
for k = 1, 5 do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[k], ttl) else redis.call('PERSIST', KEYS[k]) end
end
return 1
"""

# KEYS: m q, then the meta keys of the guards' publisher sessions. ARGV: client id, n guards, the guards'
# epochs, then (delivery, qos, guard number or 0) triples: every delivery of one batch for one session.
# Returns {dropped, zone, skipped, refused} or -1 (no such session): dropped from the full queue, QoS0
# skipped for an offline session that does not keep it, and refused because the publisher's session is
# at another epoch now (Message.sender_epoch). A session connected somewhere is woken there by the same
# script: no stale owner cache.
ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local meta = redis.call('HMGET', KEYS[1], 'qos0', 'online')
local skip_qos0 = meta[1] == '0' and meta[2] ~= '1'
local ng = tonumber(ARGV[2])
local ok = guards_ok(3, 3, ng)
local items, skipped, refused = {}, 0, 0
for j = 3 + ng, #ARGV, 3 do
  local g = tonumber(ARGV[j + 2])
  if g > 0 and not ok[g] then
    refused = refused + 1
  elseif skip_qos0 and ARGV[j + 1] == '0' then
    skipped = skipped + 1
  else
    items[#items + 1] = ARGV[j]
  end
end
local dropped, zone = queue_push(KEYS[1], KEYS[2], ARGV[1], items)
return {dropped, zone, skipped, refused}
"""

# ARGV: epoch ('' = unfenced), node, client id
DISCARD = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and ARGV[1] ~= '' and epoch ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('PUBLISH', @EVENTS@, session_ended(ARGV[2], ARGV[3]))
return 1
"""

# KEYS: m s. ARGV: epoch, filter, packed options ('' = remove), node, client id. The change is announced
# to the fleet by the script that stores it.
ROUTE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
if ARGV[3] == '' then
  redis.call('PUBLISH', @EVENTS@, route_removed(ARGV[4], ARGV[5], ARGV[2]))
  return redis.call('HDEL', KEYS[2], ARGV[2])
end
redis.call('PUBLISH', @EVENTS@, route_added(ARGV[4], ARGV[5], ARGV[2], ARGV[3]))
return redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
"""

# KEYS: m q i. ARGV: epoch, n, journaled (1/0), first order reserved by the owner. Hands up to n queued
# deliveries to the node the client is connected to; for a journaled session they move into its journal
# in the same step.
PULL = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local n = tonumber(ARGV[2])
if ARGV[3] == '1' then
  local start, items = move_queue(KEYS[1], KEYS[2], KEYS[3], n, tonumber(ARGV[4]))
  return {start, items}
end
local items = redis.call('LRANGE', KEYS[2], 0, n - 1)
if #items > 0 then redis.call('LTRIM', KEYS[2], #items, -1) end
return {-1, items}
"""

# KEYS: m. ARGV: epoch, packed will ('' = none), will delay, expiry. A new connection of a session that
# stays on this node (a takeover here) brings its own will and expiry.
WILL = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'expiry', ARGV[4])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[2], 'will_delay', ARGV[3])
else
  redis.call('HDEL', KEYS[1], 'will', 'will_delay')
end
return 1
"""

# KEYS: m. ARGV: will_at. Hands a will whose delay ran out to exactly one publisher (its node's timer,
# or the node releasing a dead node's sessions); nothing if the client came back meanwhile.
# Returns {will, zone, username} or nil.
TAKEWILL = """
if redis.call('HGET', KEYS[1], 'will_at') ~= ARGV[1] then return false end
local will = redis.call('HMGET', KEYS[1], 'will', 'zone', 'user')
redis.call('HDEL', KEYS[1], 'will', 'will_delay', 'will_at')
return will
"""

# KEYS: m s q i r. ARGV: dead node, node, client id. A session whose node died: it waits for its client
# like any other (TTL = its expiry), or ends now if it had none. Returns {will, will delay, expiry, kind,
# zone, username}: kind 0 = released, 1 = ended, 2 = parked earlier with a will still waiting (will delay
# = its will_at).
REAP = """
local m = redis.call('HMGET', KEYS[1], 'node', 'online', 'expiry', 'will', 'will_delay', 'will_at', 'zone', 'user')
if m[2] ~= '1' and m[6] then return {m[4], m[6], m[3] or '0', 2, m[7], m[8]} end
if m[1] ~= ARGV[1] or m[2] ~= '1' then return false end
local expiry = tonumber(m[3] or '0')
local will = m[4] or ''
local delay = m[5] or '0'
if expiry <= 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('PUBLISH', @EVENTS@, session_ended(ARGV[2], ARGV[3]))
  return {will, delay, '0', 1, m[7], m[8]}
end
redis.call('HSET', KEYS[1], 'online', '0', 'node', '')
redis.call('HDEL', KEYS[1], 'will', 'will_delay')
for k = 1, 5 do redis.call('PEXPIRE', KEYS[k], math.floor(expiry * 1000)) end
return {will, delay, m[3], 0, m[7], m[8]}
"""

# KEYS: m s q i r. ARGV: epoch, node, packed will ('' = none), will delay. A node back from losing Redis
# holds on to a session its client is still connected to, if nobody took it meanwhile: still its own (1),
# released by the fleet while it was away and taken back (2, with the will its connection has), or gone
# (0: ended, or claimed since at a higher epoch).
REASSERT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local m = redis.call('HMGET', KEYS[1], 'epoch', 'node', 'online')
if m[1] ~= ARGV[1] then return 0 end
if m[3] == '1' then
  if m[2] == ARGV[2] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'node', ARGV[2], 'online', '1')
redis.call('HDEL', KEYS[1], 'will_at')
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[3], 'will_delay', ARGV[4])
end
for k = 1, 5 do redis.call('PERSIST', KEYS[k]) end
return 2
"""

# KEYS: m. The node a session's client is connected to, if any.
OWNER = """
local m = redis.call('HMGET', KEYS[1], 'node', 'online')
if m[2] == '1' then return m[1] end
return false
"""


SCRIPTS = {
    "claim": CLAIM,
    "journal": JOURNAL,
    "park": PARK,
    "enqueue": ENQUEUE,
    "discard": DISCARD,
    "route": ROUTE,
    "pull": PULL,
    "owner": OWNER,
    "will": WILL,
    "reap": REAP,
    "takewill": TAKEWILL,
    "reassert": REASSERT,
}


def _stored_will(packed: bytes | None, zone: bytes | None, username: bytes | None) -> Will | None:
    """A will read back from a session's meta. A session stored before zones and usernames were kept
    with it is judged by the "default" zone's rules."""
    if not packed:
        return None
    return Will(
        unpack_message(packed),
        zone.decode() if zone else "default",
        username.decode() if username is not None else None,
    )


def raw(value: bytes | str) -> bytes:
    """A reply value as bytes (the client never decodes replies; redis-py's types allow both)."""
    return value if isinstance(value, bytes) else value.encode()


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Guards:
    """The publisher sessions whose epochs a script checks before it queues what they routed
    (Message.sender_epoch): numbered from 1 in the order first met; 0 is no guard."""

    __slots__ = ("_numbers",)

    def __init__(self) -> None:
        self._numbers: dict[tuple[str, int], int] = {}

    def of(self, d: Delivery) -> int:
        msg = d.msg
        if not msg.sender_epoch:
            return 0
        numbers = self._numbers
        return numbers.setdefault((msg.sender, msg.sender_epoch), len(numbers) + 1)

    @property
    def keys(self) -> list[str]:
        return [keys.session_keys(cid)[keys.META] for cid, _epoch in self._numbers]

    @property
    def args(self) -> list[Any]:
        return [len(self._numbers), *(str(epoch) for _cid, epoch in self._numbers)]


def _pairs(flat: list[bytes]) -> Iterable[tuple[bytes, bytes]]:
    it = iter(flat)
    return zip(it, it, strict=True)


class NotReplicated(RedisConnectionError):
    """A write ran on the primary but fewer replicas than `wait_replicas` confirmed it in time: like a
    lost reply, its outcome is unknown to the fleet (a failover may still lose it)."""


class RedisStore(SessionStore):
    durable = True

    def __init__(
        self, conns: StoreConnections, node_id: str, wait_replicas: int = 0, wait_timeout_ms: int = 1000
    ) -> None:
        self.conns = conns
        self.node_id = node_id
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.redis = conns.redis
        self._scripts = {name: _script(body) for name, body in SCRIPTS.items()}
        self._sha = {name: hashlib.sha1(body.encode()).hexdigest() for name, body in self._scripts.items()}
        self.round_trips = 0
        self.retries = 0  # operations run again on a fresh connection, or after reloading the scripts

    @classmethod
    def from_config(cls, cfg: RedisStoreConfig, node_id: str) -> RedisStore:
        conns = StoreConnections(cfg, f"fleetmq:{node_id}")
        return cls(conns, node_id, cfg.wait_replicas, cfg.wait_timeout_ms)

    @classmethod
    def from_url(cls, url: str, node_id: str, wait_replicas: int = 0) -> RedisStore:
        return cls.from_config(RedisStoreConfig(kind="redis", url=url, wait_replicas=wait_replicas), node_id)

    async def open(self) -> None:
        await self._load_scripts()

    async def _load_scripts(self) -> None:
        """Load every script once, so pipelines carry bare EVALSHAs (no SCRIPT EXISTS round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for body in self._scripts.values():
            pipe.script_load(body)
        await pipe.execute()

    def _call(self, pipe: Pipeline, script: str, keys: list[str], args: list[Any]) -> None:
        pipe.evalsha(self._sha[script], len(keys), *keys, *args)

    async def _execute(
        self,
        build: Callable[[Pipeline], Any],
        *,
        atomic: bool = False,
        may_repeat: bool = False,
        write: bool = True,
    ) -> list[Any]:
        """One round trip. After a Redis restart its script cache is empty: load them and run again (the
        scripts that failed did nothing; everything else in a batch is idempotent).

        `may_repeat`: running it twice does no harm, so a connection found dead (Redis restarted, the
        pool's connections reset) is retried once on a fresh one instead of failing the caller.

        `atomic`: the commands run as one MULTI/EXEC transaction, which Redis (its AOF, its replicas) keeps
        whole or not at all, so a write cut off halfway cannot leave half a batch behind; the replies are
        then EXEC's.

        `write`: with `wait_replicas`, a WAIT follows in the same round trip, and fewer confirmations
        than asked raise NotReplicated: a claim, a pull, a commit is relied upon only once a failover
        cannot lose it."""
        wait = self.wait_replicas if write else 0
        for attempt in (1, 2):
            pipe: Pipeline = self.redis.pipeline(transaction=False)
            if atomic:
                pipe.execute_command("MULTI")
            build(pipe)
            if atomic:
                pipe.execute_command("EXEC")
            if wait:
                pipe.wait(wait, self.wait_timeout_ms)
            try:
                replies = await pipe.execute(raise_on_error=False)
            except RedisConnectionError:
                # Redis went away (restarted? failed over?): the pool's idle connections are dead too, and
                # each would fail the next operation that picks it up. Drop them; the caller decides about
                # this one.
                await self.drop_idle_connections()
                if not may_repeat:
                    raise
                self.retries += 1
                return await self._execute(build, atomic=atomic, write=write)
            self.round_trips += 1
            if wait:
                acked = replies.pop()
                if isinstance(acked, Exception) or int(acked) < wait:
                    raise NotReplicated(f"{acked} of {wait} Redis replicas confirmed the write in time")
            if atomic:
                replies = self._exec_replies(replies)
            if attempt == 1 and any(isinstance(r, NoScriptError) for r in replies):
                log.info("Redis lost its scripts (restarted? failed over?); loading them again")
                self.retries += 1
                await self._load_scripts()
                continue
            for r in replies:
                if isinstance(r, Exception) and not isinstance(r, ResponseError):
                    raise r
            return replies
        raise AssertionError("unreachable")

    async def drop_idle_connections(self) -> None:
        """Close the pool's idle connections (after Redis was away they are dead, and the next operation to
        pick one would fail with an outcome it cannot know)."""
        await self.redis.connection_pool.disconnect(inuse_connections=False)

    @staticmethod
    def _exec_replies(replies: list[Any]) -> list[Any]:
        """The results of the commands between MULTI and EXEC."""
        executed = replies[-1]
        if isinstance(executed, Exception):
            raise executed  # EXECABORT: nothing ran
        if not isinstance(executed, list):
            raise ConnectionError(f"the transaction did not run (EXEC replied {executed!r})")
        queued = [r for r in replies[1:-1] if isinstance(r, Exception)]
        if queued:
            raise queued[0]  # refused while queueing (EXEC aborted the whole transaction)
        return executed

    async def close(self) -> None:
        await self.conns.close()

    # -- sessions --------------------------------------------------------------------------------
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
    ) -> Claimed:
        """Take ownership of a session for this node (epoch + 1); returns its stored state."""
        packed_will = pack_message(will) if will is not None else b""
        args = [
            self.node_id,
            "1" if clean_start else "0",
            client_id,
            packed_will,
            repr(will_delay),
            repr(expiry),
            zone_name,
            username or "",
            "0" if username is None else "1",
        ]

        def build(pipe: Pipeline) -> None:
            self._call(pipe, "claim", keys.session_keys(client_id), args)
            # so that, should this node die, others find it
            pipe.sadd(keys.node_sessions(self.node_id), client_id)

        # (a claim may run twice: the epoch grows once more)
        res = (await self._execute(build, atomic=True, may_repeat=True))[0]
        if isinstance(res, Exception):
            raise res
        epoch = int(res[0])
        if int(res[1]) != 2:
            discarded = [f.decode() for f in res[2]] if int(res[1]) == 1 else None
            ended_will = _stored_will(res[4], res[5], res[6])
            return Claimed(
                epoch, discarded=discarded, previous=res[3].decode() or None, ended_will=ended_will
            )
        meta = {k.decode(): v for k, v in _pairs(res[3])}
        stored = StoredSession(
            expiry_interval=float(meta.get("expiry", b"0")),
            next_pid=int(meta.get("next_pid", b"1")),
            order=int(meta.get("order", b"0")),
            subscriptions=[(f.decode(), unpack_sub(o)) for f, o in _pairs(res[4])],
            deliveries=[unpack_journal(v) for _k, v in _pairs(res[5])],
            awaiting_rel=[(int(pid), float(ts)) for pid, ts in _pairs(res[6])],
        )
        return Claimed(epoch, stored=stored, previous=res[2].decode() or None)

    async def commit(self, ops: list[Op]) -> CommitResult:
        # Deliveries for one session in this batch travel in one script call, at its first one's place.
        enqueues: dict[str, list[Enqueue]] = {}
        for op in ops:
            if isinstance(op, Enqueue):
                enqueues.setdefault(op.client_id, []).append(op)
        kinds: list[Op | list[Enqueue] | None] = []  # what each pipelined command's reply belongs to

        def build(pipe: Pipeline) -> None:
            kinds.clear()
            for op in ops:
                if isinstance(op, Enqueue):
                    group = enqueues[op.client_id]
                    if group[0] is not op:
                        continue
                    kinds.append(group)
                    guards = _Guards()
                    items: list[Any] = []
                    for e in group:
                        items += [pack_delivery(e.delivery), str(e.delivery.qos), guards.of(e.delivery)]
                    k = keys.session_keys(op.client_id)
                    self._call(
                        pipe, "enqueue", [k[0], k[2], *guards.keys], [op.client_id, *guards.args, *items]
                    )
                    continue
                kinds.append(op)
                if isinstance(op, JournalChanges):
                    k = keys.session_keys(op.client_id)
                    jkeys, args = self._journal_args(op)
                    self._call(pipe, "journal", [k[0], k[3], k[4], k[2], *jkeys], args)
                elif isinstance(op, Save):
                    self._call(pipe, "park", keys.session_keys(op.session.client_id), self._park_args(op))
                    if op.will is None:  # else this node stays responsible until the will is out
                        pipe.srem(keys.node_sessions(self.node_id), op.session.client_id)
                        kinds.append(None)
                elif isinstance(op, Discard):
                    args = [str(op.epoch) if op.epoch else "", self.node_id, op.client_id]
                    self._call(pipe, "discard", keys.session_keys(op.client_id), args)
                    pipe.srem(keys.node_sessions(self.node_id), op.client_id)
                    kinds.append(None)
                elif isinstance(op, Route):
                    packed = pack_sub(op.sub) if op.sub is not None else b""
                    args = [str(op.epoch), op.topic_filter, packed, self.node_id, op.client_id]
                    self._call(pipe, "route", keys.session_keys(op.client_id)[:2], args)
                elif isinstance(op, Retain):
                    packed = pack_message(op.msg)
                    if op.msg.payload:
                        pipe.hset(keys.RETAINED, op.msg.topic, packed)
                    else:
                        pipe.hdel(keys.RETAINED, op.msg.topic)
                    pipe.publish(keys.EVENTS, wire.retained_changed(self.node_id, packed))
                    kinds.append(None)

        replies = await self._execute(build, atomic=True)
        result = CommitResult()
        for kind, reply in zip(kinds, replies, strict=False):
            if isinstance(reply, Exception):
                raise reply
            if isinstance(kind, list):
                if reply == -1:
                    result.missing.extend(kind)
                elif isinstance(reply, list):
                    zone, cid = reply[1].decode(), kind[0].client_id
                    if int(reply[0]):
                        result.dropped.append((zone, cid, int(reply[0])))
                    if int(reply[2]):
                        result.skipped_qos0.append((zone, cid, int(reply[2])))
                    result.refused += int(reply[3])
            elif isinstance(kind, Route) and reply == -1:
                result.fenced.append(kind.client_id)
            elif isinstance(kind, JournalChanges) and reply != 1:
                result.fenced.append(kind.client_id)
                dropped, zone, refused = int(reply[1]), reply[2].decode(), int(reply[3])
                result.rerouted += int(reply[4])
                result.refused += refused
                if dropped:
                    result.dropped.append((zone, kind.client_id, dropped))
        return result

    @staticmethod
    def _journal_args(op: JournalChanges) -> tuple[list[str], list[Any]]:
        """The JOURNAL script's guard keys and arguments for one session's changes."""
        puts = [(mid, d) for mid, d in op.deliveries.items() if d is not None]
        dels = [mid for mid, d in op.deliveries.items() if d is None]
        rputs = [(pid, ts) for pid, ts in op.rel.items() if ts is not None]
        rdels = [pid for pid, ts in op.rel.items() if ts is None]
        body: list[Any] = [len(puts)]
        fresh: list[Any] = []
        guards = _Guards()
        new = set(op.fresh) if op.fresh else ()
        for n, (mid, d) in enumerate(puts, 1):
            body += [journal_field(mid), journal_value(d)]
            if mid in new and d.qos:  # (QoS 0 is best effort: not queued again)
                fresh += [n, guards.of(d)]
        body.append(len(dels))
        body += [journal_field(mid) for mid in dels]
        body.append(len(rputs))
        for pid, ts in rputs:
            body += [pid, repr(ts)]
        body.append(len(rdels))
        body += rdels
        body.append(len(fresh) // 2)
        body += fresh
        head = [str(op.epoch), op.next_pid, op.order, op.client_id, *guards.args]
        return guards.keys, head + body

    @staticmethod
    def _park_args(op: Save) -> list[Any]:
        s, z = op.session, op.session.zone
        meta = {
            "zone": s.zone_name,
            "expiry": repr(s.expiry_interval),
            "next_pid": s.next_pid,
            "order": s.order,
            "maxq": z.max_mqueue_len,
            "qos0": int(z.mqueue_store_qos0),
            "online": 0,
            "node": "",
        }
        if op.will is not None:
            meta["will"] = pack_message(op.will)
            meta["will_at"] = f"{op.will_at:.3f}"
        args: list[Any] = [str(s.epoch), int(op.ttl * 1000), len(meta)]
        for k, v in meta.items():
            args += [k, v]
        return args

    async def set_will(self, s: Session, will: Message | None, will_delay: float) -> None:
        packed = pack_message(will) if will is not None else b""
        args = [str(s.epoch), packed, repr(will_delay), repr(s.expiry_interval)]
        (reply,) = await self._execute(
            lambda pipe: self._call(pipe, "will", keys.session_keys(s.client_id)[:1], args)
        )
        if isinstance(reply, Exception):
            raise reply

    async def reap(
        self, dead: str, client_ids: list[str]
    ) -> list[tuple[str, Will | None, float, float, int]]:
        """Let go of the sessions of a dead node: (client id, will, will delay or will_at, expiry, kind)."""

        def build(pipe: Pipeline) -> None:
            for cid in client_ids:
                self._call(pipe, "reap", keys.session_keys(cid), [dead, self.node_id, cid])

        out = []
        for cid, r in zip(client_ids, await self._execute(build), strict=True):
            if isinstance(r, Exception):
                raise r
            if r:
                out.append((cid, _stored_will(r[0], r[4], r[5]), float(r[1]), float(r[2]), int(r[3])))
        return out

    async def take_will(self, client_id: str, will_at: float) -> Will | None:
        """The will due at `will_at`, if it is still due (exactly one caller gets it)."""
        at = f"{will_at:.3f}"

        def build(pipe: Pipeline) -> None:
            self._call(pipe, "takewill", keys.session_keys(client_id)[:1], [at])
            pipe.srem(keys.node_sessions(self.node_id), client_id)

        raw = (await self._execute(build, atomic=True))[0]
        if isinstance(raw, Exception):
            raise raw
        return _stored_will(*raw) if raw else None

    async def reassert(self, owned: list[tuple[str, int, Message | None, float]]) -> list[int]:
        """After losing Redis: for each session connected here ((client id, epoch, will, will delay)),
        1 still ours, 2 taken back (the fleet had released it), 0 gone (ended, or someone else's now)."""

        def build(pipe: Pipeline) -> None:
            for cid, epoch, will, delay in owned:
                packed = pack_message(will) if will is not None else b""
                args = [str(epoch), self.node_id, packed, repr(delay)]
                self._call(pipe, "reassert", keys.session_keys(cid), args)
                pipe.sadd(keys.node_sessions(self.node_id), cid)

        replies = await self._execute(build)
        out = []
        for r in replies[::2]:
            if isinstance(r, Exception):
                raise r
            out.append(int(r))
        return out

    async def owner(self, client_id: str) -> str | None:
        """The node the client is connected to, if any (from the session's meta)."""
        (node,) = await self._execute(
            lambda pipe: self._call(pipe, "owner", keys.session_keys(client_id)[:1], []),
            may_repeat=True,
            write=False,
        )
        if isinstance(node, Exception):
            raise node
        return node.decode() if node else None

    async def pull(self, targets: list[tuple[str, int, int]], n: int) -> list[Any]:
        """Queued deliveries of sessions connected here ((client id, epoch, first order reserved, or -1
        when not journaled) each): per session -1 where this node was fenced, else [first order, items]."""

        def build(pipe: Pipeline) -> None:
            for cid, epoch, first in targets:
                k = keys.session_keys(cid)
                self._call(pipe, "pull", [k[0], k[2], k[3]], [str(epoch), n, int(first >= 0), max(first, 0)])

        replies = await self._execute(build)
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return replies

    # -- fleet-wide state loaded at start -------------------------------------------------------
    async def load_routes(self) -> list[tuple[str, str, Subscription]]:
        """Every subscription of every session in Redis: the fleet's route table."""
        out = []
        async for key in self.redis.scan_iter(match=keys.SUBSCRIPTIONS_PATTERN, count=1000):
            cid = keys.client_of_subscriptions_key(text(key))
            for f, o in (await self.redis.hgetall(key)).items():
                out.append((cid, text(f), unpack_sub(raw(o))))
        return out

    async def load_retained(self) -> list[Message]:
        return [unpack_message(raw(v)) for v in (await self.redis.hgetall(keys.RETAINED)).values()]

    def offline_sessions(self) -> list[Session]:
        return []
