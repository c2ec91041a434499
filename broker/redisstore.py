"""The Redis session store: sessions a fleet of nodes shares, so a client resumes on any node.

Layout: every key of one session carries the hash tag ``{client_id}`` (one Redis Cluster slot):
``fmq:{cid}:m`` meta hash (epoch, node, zone, limits), ``:s`` subscriptions (filter -> options; the
fleet's route table), ``:q`` the Message Queue, ``:i`` the Inflight Window (packet id -> entry),
``:r`` incoming QoS2 packet ids awaiting PUBREL. Fleet-wide: ``fmq:retained`` and ``fmq:owners``.

Multi-key changes of a session are Lua scripts, fenced by the session's epoch: a node whose epoch is
stale (the session was taken over meanwhile) cannot write. Sessions that wait for their client carry a
TTL of their expiry interval, so Redis deletes them when they expire, whichever node is alive. Every
write of one event-loop turn goes to Redis as one pipeline (group commit).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from .codec import decode_properties, encode_properties
from .message import Delivery, Message
from .router import Subscription
from .session import Session
from .store import Claimed, CommitResult, Discard, Enqueue, Op, Retain, Route, Save, SessionStore
from .zones import ZoneSettings

log = logging.getLogger("fleetmq.redis")

PREFIX = "fmq"
RETAINED = f"{PREFIX}:retained"
OWNERS = f"{PREFIX}:owners"
EVENTS = f"{PREFIX}:events"
Z = b"\0"  # field separator of cluster messages (MQTT strings never contain U+0000)
CHUNK = 512  # values per RPUSH/HSET call inside scripts (Lua's unpack() has a limit)

# -- packing ---------------------------------------------------------------------------------------
_MSG = struct.Struct(">BBdQHHI")  # format, flags, ts, msg id, topic len, sender len, props len
_EXP = struct.Struct(">d")
_DLV = struct.Struct(">BBHBQdB")  # qos, retain, packet id, stage, seq, sent_at, number of sub ids
_SUB = struct.Struct(">BBBBI")
_FORMAT = 1


def pack_message(m: Message) -> bytes:
    topic = m.topic_b
    sender = m.sender.encode()
    props = encode_properties(m.props) if m.props else b""
    flags = m.qos | (m.retain << 2) | ((m.expires_at is not None) << 3)
    head = _MSG.pack(_FORMAT, flags, m.ts, m.msg_id, len(topic), len(sender), len(props))
    exp = _EXP.pack(m.expires_at) if m.expires_at is not None else b""
    return b"".join((head, exp, topic, sender, props, m.payload))


def unpack_message(b: bytes, pos: int = 0) -> Message:
    fmt, flags, ts, msg_id, tl, sl, pl = _MSG.unpack_from(b, pos)
    if fmt != _FORMAT:
        raise ValueError(f"unknown stored message format {fmt}")
    pos += _MSG.size
    expires_at = None
    if flags & 8:
        (expires_at,) = _EXP.unpack_from(b, pos)
        pos += _EXP.size
    topic_b = bytes(b[pos : pos + tl])
    pos += tl
    sender = bytes(b[pos : pos + sl]).decode()
    pos += sl
    props = decode_properties(bytes(b[pos : pos + pl])) if pl else None
    pos += pl
    m = Message(
        topic_b.decode(), bytes(b[pos:]), flags & 3, bool(flags & 4), props, sender, None, ts, msg_id, topic_b
    )
    m.expires_at = expires_at
    return m


def pack_delivery(d: Delivery, seq: int = 0) -> bytes:
    ids = d.sub_ids or ()
    head = _DLV.pack(d.qos, d.retain, d.packet_id, d.stage, seq, d.sent_at, len(ids))
    return head + b"".join(struct.pack(">I", i) for i in ids) + pack_message(d.msg)


def unpack_delivery(b: bytes) -> tuple[Delivery, int]:
    qos, retain, pid, stage, seq, sent_at, n = _DLV.unpack_from(b, 0)
    pos = _DLV.size
    ids = struct.unpack_from(f">{n}I", b, pos) if n else None
    pos += 4 * n
    d = Delivery(unpack_message(b, pos), qos, bool(retain), ids)
    d.packet_id, d.stage, d.sent_at = pid, stage, sent_at
    return d, seq


def pack_sub(s: Subscription) -> bytes:
    return _SUB.pack(s.qos, s.no_local, s.retain_as_published, s.retain_handling, s.sub_id or 0)


def unpack_sub(b: bytes) -> Subscription:
    qos, nl, rap, rh, sid = _SUB.unpack(b)
    return Subscription(qos, bool(nl), bool(rap), rh, sid or None)


def keys(cid: str) -> list[str]:
    tag = f"{PREFIX}:{{{cid}}}"
    return [f"{tag}:m", f"{tag}:s", f"{tag}:q", f"{tag}:i", f"{tag}:r"]


# -- scripts ---------------------------------------------------------------------------------------
_PRELUDE = "local Z = string.char(0)\n"


def _script(body: str) -> str:
    return (_PRELUDE + body).replace("EVENTS_CH", EVENTS).replace("NODE_CH", f"{PREFIX}:node:")


# KEYS: m s q i r. Every script that writes an owned session checks its epoch first (fencing).

CLAIM = """
local existed = redis.call('EXISTS', KEYS[1]) == 1
local prev = redis.call('HMGET', KEYS[1], 'node', 'online')
local previous = ''
if prev[2] == '1' and prev[1] then previous = prev[1] end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local filters = {}
if existed and ARGV[2] == '1' then
  filters = redis.call('HKEYS', KEYS[2])
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
  redis.call('PUBLISH', 'EVENTS_CH', 'd' .. Z .. ARGV[1] .. Z .. ARGV[3])
end
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'online', '1')
for k = 1, 5 do redis.call('PERSIST', KEYS[k]) end
if not existed or ARGV[2] == '1' then
  return {epoch, existed and 1 or 0, filters, previous}
end
local q = redis.call('LRANGE', KEYS[3], 0, -1)
redis.call('DEL', KEYS[3])
return {epoch, 2, previous, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), q,
        redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5])}
"""

# ARGV: epoch, ttl_ms (0 = keep forever), meta n, k/v..., subs n, f/o..., queue n, items..., inflight n,
# pid/entry..., rel n, pid/ts...
SAVE = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and epoch ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[2], KEYS[4], KEYS[5])
local i = 3
local function pairs_into(key, cmd)
  local n = tonumber(ARGV[i]); i = i + 1
  local t = {}
  for j = 1, n do
    t[#t + 1] = ARGV[i]; t[#t + 1] = ARGV[i + 1]; i = i + 2
    if #t >= CHUNK_N then redis.call(cmd, key, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call(cmd, key, unpack(t)) end
end
pairs_into(KEYS[1], 'HSET')
pairs_into(KEYS[2], 'HSET')
-- the session's own queue goes before whatever was queued for it in Redis since it was claimed
local n = tonumber(ARGV[i]); i = i + 1
local t = {}
for j = i + n - 1, i, -1 do
  t[#t + 1] = ARGV[j]
  if #t >= CHUNK_N then redis.call('LPUSH', KEYS[3], unpack(t)); t = {} end
end
if #t > 0 then redis.call('LPUSH', KEYS[3], unpack(t)) end
i = i + n
pairs_into(KEYS[4], 'HSET')
pairs_into(KEYS[5], 'HSET')
local dropped = 0
local max = tonumber(redis.call('HGET', KEYS[1], 'maxq') or '0')
if max > 0 then
  local len = redis.call('LLEN', KEYS[3])
  if len > max then dropped = len - max; redis.call('LTRIM', KEYS[3], dropped, -1) end
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  for k = 1, 5 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return dropped
""".replace("CHUNK_N", str(CHUNK))

# KEYS: m q. ARGV: delivery, qos, client id. Returns {dropped, zone}, or -1 (no such session), -2 (QoS0
# not kept). A session connected somewhere is woken there, by the same script: no stale owner cache.
ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local meta = redis.call('HMGET', KEYS[1], 'qos0', 'maxq', 'zone', 'online', 'node')
if ARGV[2] == '0' and meta[1] == '0' and meta[4] ~= '1' then return -2 end
redis.call('RPUSH', KEYS[2], ARGV[1])
if meta[4] == '1' and meta[5] then
  redis.call('PUBLISH', 'NODE_CH' .. meta[5], 'w' .. Z .. ARGV[3])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
local dropped = 0
local max = tonumber(meta[2] or '0')
if max > 0 then
  local len = redis.call('LLEN', KEYS[2])
  if len > max then dropped = len - max; redis.call('LTRIM', KEYS[2], dropped, -1) end
end
return {dropped, meta[3] or 'default'}
"""

# ARGV: epoch ('' = unfenced), node, client id
DISCARD = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and ARGV[1] ~= '' and epoch ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('PUBLISH', 'EVENTS_CH', 'd' .. Z .. ARGV[2] .. Z .. ARGV[3])
return 1
"""

# KEYS: m s. ARGV: epoch, filter, packed options ('' = remove), node, client id. The change is announced
# to the fleet by the script that stores it.
ROUTE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
if ARGV[3] == '' then
  redis.call('PUBLISH', 'EVENTS_CH', 'u' .. Z .. ARGV[4] .. Z .. ARGV[5] .. Z .. ARGV[2])
  return redis.call('HDEL', KEYS[2], ARGV[2])
end
redis.call('PUBLISH', 'EVENTS_CH', 'r' .. Z .. ARGV[4] .. Z .. ARGV[5] .. Z .. ARGV[2] .. Z .. ARGV[3])
return redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
"""

# KEYS: m q. ARGV: epoch, n. Moves up to n queued deliveries to the owner that is connected to the client.
PULL = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local n = tonumber(ARGV[2])
local items = redis.call('LRANGE', KEYS[2], 0, n - 1)
if #items > 0 then redis.call('LTRIM', KEYS[2], #items, -1) end
return items
"""

# KEYS: m. The node a session's client is connected to, if any.
OWNER = """
local m = redis.call('HMGET', KEYS[1], 'node', 'online')
if m[2] == '1' then return m[1] end
return false
"""


def _pairs(flat: list[bytes]) -> Iterable[tuple[bytes, bytes]]:
    it = iter(flat)
    return zip(it, it, strict=True)


class RedisStore(SessionStore):
    durable = True

    def __init__(self, url: str, node_id: str, wait_replicas: int = 0, wait_timeout_ms: int = 1000) -> None:
        self.url = url
        self.node_id = node_id
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.redis = aioredis.from_url(
            url,
            decode_responses=False,
            health_check_interval=5,
            socket_connect_timeout=2,
            socket_timeout=5,
            retry_on_timeout=False,
        )
        self._claim = self.redis.register_script(_script(CLAIM))
        self._save = self.redis.register_script(_script(SAVE))
        self._enqueue = self.redis.register_script(_script(ENQUEUE))
        self._discard = self.redis.register_script(_script(DISCARD))
        self._route = self.redis.register_script(_script(ROUTE))
        self._pull = self.redis.register_script(_script(PULL))
        self._owner = self.redis.register_script(_script(OWNER))
        self.round_trips = 0

    async def open(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()

    # -- sessions --------------------------------------------------------------------------------
    async def claim(self, client_id: str, zone: ZoneSettings, zone_name: str, clean_start: bool) -> Claimed:
        """Take ownership of a session for this node (epoch + 1); returns its stored state."""
        self.round_trips += 1
        res = await self._claim(
            keys=keys(client_id), args=[self.node_id, "1" if clean_start else "0", client_id]
        )
        epoch = int(res[0])
        if int(res[1]) != 2:
            discarded = [f.decode() for f in res[2]] if int(res[1]) == 1 else None
            return Claimed(epoch, None, discarded, res[3].decode() or None)
        previous = res[2].decode() or None
        res = res[1:]
        meta = {k.decode(): v for k, v in _pairs(res[2])}
        s = Session(client_id, zone, zone_name)
        s.epoch = epoch
        s.expiry_interval = float(meta.get("expiry", b"0"))
        s._next_pid = int(meta.get("next_pid", b"1"))
        for f, o in _pairs(res[3]):
            s.subscriptions[f.decode()] = unpack_sub(o)
        for item in res[4]:
            s.mqueue.push(unpack_delivery(item)[0])
        entries = sorted((unpack_delivery(e) for _pid, e in _pairs(res[5])), key=lambda x: x[1])
        for d, _seq in entries:
            s.inflight.insert(d)
        for pid, ts in _pairs(res[6]):
            s.awaiting_rel[int(pid)] = float(ts)
        return Claimed(epoch, s, None, previous)

    async def commit(self, ops: list[Op]) -> CommitResult:
        result = CommitResult([], [])
        pipe: Pipeline = self.redis.pipeline(transaction=False)
        kinds: list[Op | None] = []
        for op in ops:
            if isinstance(op, Enqueue):
                d = op.delivery
                await self._enqueue(
                    keys=keys(op.client_id)[0:3:2],
                    args=[pack_delivery(d), str(d.qos), op.client_id],
                    client=pipe,
                )
                kinds.append(op)
            elif isinstance(op, Save):
                await self._save(
                    keys=keys(op.session.client_id), args=self._save_args(op.session, op.ttl), client=pipe
                )
                kinds.append(op)
            elif isinstance(op, Discard):
                epoch = str(op.epoch) if op.epoch else ""
                await self._discard(
                    keys=keys(op.client_id), args=[epoch, self.node_id, op.client_id], client=pipe
                )
                kinds.append(None)
            elif isinstance(op, Route):
                k = keys(op.client_id)
                packed = pack_sub(op.sub) if op.sub is not None else b""
                await self._route(
                    keys=k[:2],
                    args=[str(op.epoch), op.topic_filter, packed, self.node_id, op.client_id],
                    client=pipe,
                )
                kinds.append(op)
            elif isinstance(op, Retain):
                packed = pack_message(op.msg)
                if op.msg.payload:
                    pipe.hset(RETAINED, op.msg.topic, packed)
                else:
                    pipe.hdel(RETAINED, op.msg.topic)
                pipe.publish(EVENTS, Z.join([b"t", self.node_id.encode(), packed]))
                kinds.extend((None, None))
        if self.wait_replicas:
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
        t0 = time.perf_counter()
        replies = await pipe.execute(raise_on_error=False)
        self.round_trips += 1
        result.duration = time.perf_counter() - t0
        for op, reply in zip(kinds, replies, strict=False):
            if isinstance(reply, Exception):
                raise reply
            if isinstance(op, Enqueue):
                if reply == -1:
                    result.missing.append(op)
                elif isinstance(reply, list) and int(reply[0]):
                    result.dropped.append((reply[1].decode(), int(reply[0])))
            elif isinstance(op, Route) and reply == -1:
                result.fenced.append(op.client_id)
            elif isinstance(op, Save):
                if reply == -1:
                    result.fenced.append(op.session.client_id)
                elif int(reply):
                    result.dropped.append((op.session.zone_name, int(reply)))
        if self.wait_replicas:
            acked = replies[-1]
            if int(acked) < self.wait_replicas:
                raise ConnectionError(f"only {acked} of {self.wait_replicas} Redis replicas acknowledged")
        return result

    def _save_args(self, s: Session, ttl: float) -> list[Any]:
        z = s.zone
        meta = {
            "zone": s.zone_name,
            "expiry": repr(s.expiry_interval),
            "next_pid": s._next_pid,
            "maxq": z.max_mqueue_len,
            "qos0": int(z.mqueue_store_qos0),
            "online": 0,
            "node": "",
        }
        args: list[Any] = [str(s.epoch), int(ttl * 1000), len(meta)]
        for k, v in meta.items():
            args += [k, v]
        args.append(len(s.subscriptions))
        for f, sub in s.subscriptions.items():
            args += [f, pack_sub(sub)]
        args.append(len(s.mqueue))
        args += [pack_delivery(d) for d in s.mqueue]
        args.append(len(s.inflight))
        for seq, d in enumerate(s.inflight):
            args += [d.packet_id, pack_delivery(d, seq)]
        args.append(len(s.awaiting_rel))
        for pid, ts in s.awaiting_rel.items():
            args += [pid, repr(ts)]
        return args

    async def owner(self, client_id: str) -> str | None:
        """The node the client is connected to, if any (from the session's meta)."""
        node = await self._owner(keys=keys(client_id)[:1])
        return node.decode() if node else None

    async def pull(self, targets: list[tuple[str, int]], n: int) -> list[Any]:
        """For sessions owned here (client id, epoch): their queued deliveries, or -1 where fenced."""
        pipe: Pipeline = self.redis.pipeline(transaction=False)
        for cid, epoch in targets:
            await self._pull(keys=keys(cid)[0:3:2], args=[str(epoch), n], client=pipe)
        self.round_trips += 1
        return await pipe.execute()

    # -- fleet-wide state loaded at start -------------------------------------------------------
    async def load_routes(self) -> list[tuple[str, str, Subscription]]:
        """Every subscription of every session in Redis: the fleet's route table."""
        out = []
        async for key in self.redis.scan_iter(match=f"{PREFIX}:{{*}}:s", count=1000):
            k = key.decode()
            cid = k[len(PREFIX) + 2 : k.rindex("}:s")]
            for f, o in (await self.redis.hgetall(key)).items():
                out.append((cid, f.decode(), unpack_sub(o)))
        return out

    async def load_retained(self) -> list[Message]:
        return [unpack_message(v) for v in (await self.redis.hgetall(RETAINED)).values()]

    def offline_sessions(self) -> list[Session]:
        return []
