"""How the nodes of a fleet talk through Redis: packed values and pub/sub messages.

Values (messages, deliveries, subscriptions, journal entries) are packed here and nowhere else, whether a
script stores them or another node reads them. Pub/sub messages are ``<kind>\\0<field>\\0...``; some are
published by the store's Lua scripts in the same step that stores what they announce (a route is never
announced unstored), so each kind has its Python parser and, where Lua produces it, the Lua function
that builds it, generated here from the same kind letter (``LUA_PRELUDE``, which every script starts with).

Fleet events go to every node (keys.Channels) and carry the node they come from, which ignores its own;
node messages go to one node.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..codec import decode_properties, encode_properties
from ..message import Delivery, Message
from ..router import Subscription

Z = b"\0"  # field separator (MQTT strings never contain U+0000)

# -- values ------------------------------------------------------------------------------------------
_MSG = struct.Struct(">BBdQHHI")  # format, flags, ts, msg id, topic len, sender len, props len
_EXP = struct.Struct(">d")
_DLV = struct.Struct(">QBBHBB")  # msg id (first: the journal's field), qos, retain, packet id, stage, #ids
_SUB = struct.Struct(">BBBBI")
_FORMAT = 1


_RCPT = struct.Struct(">QH")  # receipt number, incarnation length (then the incarnation)


def pack_message(m: Message) -> bytes:
    topic = m.topic_b
    sender = m.sender.encode()
    props = encode_properties(m.props) if m.props else b""
    flags = m.qos | (m.retain << 2) | ((m.expires_at is not None) << 3) | ((m.receipt is not None) << 4)
    head = _MSG.pack(_FORMAT, flags, m.ts, m.msg_id, len(topic), len(sender), len(props))
    exp = _EXP.pack(m.expires_at) if m.expires_at is not None else b""
    if m.receipt is not None:
        inc = m.receipt[0].encode()
        exp += _RCPT.pack(m.receipt[1], len(inc)) + inc
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
    receipt = None
    if flags & 16:
        number, n = _RCPT.unpack_from(b, pos)
        pos += _RCPT.size
        receipt = (bytes(b[pos : pos + n]).decode(), number)
        pos += n
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
    m.receipt = receipt
    return m


#: bytes of a packed delivery that hold its message id: the scripts use them as the journal's field
DELIVERY_ID_LEN = 8


def pack_delivery(d: Delivery) -> bytes:
    ids = d.sub_ids or ()
    head = _DLV.pack(d.msg.msg_id, d.qos, d.retain, d.packet_id, d.stage, len(ids))
    return head + b"".join(struct.pack(">I", i) for i in ids) + pack_message(d.msg)


def unpack_delivery(b: bytes) -> Delivery:
    _msg_id, qos, retain, pid, stage, n = _DLV.unpack_from(b, 0)
    pos = _DLV.size
    ids = struct.unpack_from(f">{n}I", b, pos) if n else None
    pos += 4 * n
    d = Delivery(unpack_message(b, pos), qos, bool(retain), ids)
    d.packet_id, d.stage = pid, stage
    return d


def journal_field(msg_id: int) -> bytes:
    return struct.pack(">Q", msg_id)


def unpack_id(field: bytes) -> int:
    """The message id of a journal field (journal_field)."""
    return int.from_bytes(field, "big")


def journal_value(d: Delivery) -> bytes:
    """A journal entry: the delivery's position in its session's order, then the packed delivery."""
    return b"%d:" % d.order + pack_delivery(d)


def unpack_journal(value: bytes) -> Delivery:
    order, _, packed = value.partition(b":")
    d = unpack_delivery(packed)
    d.order = int(order)
    return d


def pack_sub(s: Subscription) -> bytes:
    return _SUB.pack(s.qos, s.no_local, s.retain_as_published, s.retain_handling, s.sub_id or 0)


def unpack_sub(b: bytes) -> Subscription:
    qos, nl, rap, rh, sid = _SUB.unpack(b)
    return Subscription(qos, bool(nl), bool(rap), rh, sid or None)


# -- fleet events (keys.Channels.events) -------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class RouteAdded:
    origin: str
    client_id: str
    topic_filter: str
    sub: Subscription


@dataclass(slots=True, frozen=True)
class RouteRemoved:
    origin: str
    client_id: str
    topic_filter: str


@dataclass(slots=True, frozen=True)
class SessionEnded:
    """A session was deleted (ended, discarded by Clean Start, or its node died without expiry)."""

    origin: str
    client_id: str


@dataclass(slots=True, frozen=True)
class RetainedChanged:
    origin: str
    msg: Message  # an empty payload clears the topic


FleetEvent = RouteAdded | RouteRemoved | SessionEnded | RetainedChanged


def retained_changed(origin: str, packed_msg: bytes) -> bytes:
    return Z.join([b"t", origin.encode(), packed_msg])


def parse_fleet_event(data: bytes) -> FleetEvent:
    kind, origin_b, rest = data.split(Z, 2)
    origin = origin_b.decode()
    if kind == b"r":
        cid, topic_filter, packed = rest.split(Z, 2)
        return RouteAdded(origin, cid.decode(), topic_filter.decode(), unpack_sub(packed))
    if kind == b"u":
        cid, topic_filter = rest.split(Z, 1)
        return RouteRemoved(origin, cid.decode(), topic_filter.decode())
    if kind == b"d":
        return SessionEnded(origin, rest.decode())
    if kind == b"t":
        return RetainedChanged(origin, unpack_message(rest))
    raise ValueError(f"unknown fleet event kind {kind!r}")


# -- node messages (keys.Channels.node) -------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Wake:
    """Deliveries were queued for a session connected to the receiving node: pull them."""

    client_id: str


@dataclass(slots=True, frozen=True)
class Handover:
    """The requester got a CONNECT for a client connected to the receiving node: hand the session over."""

    client_id: str
    clean_start: bool
    requester: str
    request: str


@dataclass(slots=True, frozen=True)
class HandedOver:
    request: str


@dataclass(slots=True, frozen=True)
class Kick:
    """The session is owned at `epoch` elsewhere now: a connection of it with an older epoch must go."""

    client_id: str
    epoch: int


@dataclass(slots=True, frozen=True)
class Ask:
    """The management API of `requester` asks the receiving node what only it knows (its connections) or
    to act on one of them; `body` is the API's JSON, answered with an Answer of the same `request`."""

    requester: str
    request: str
    body: bytes


@dataclass(slots=True, frozen=True)
class Answer:
    request: str
    body: bytes


NodeMessage = Wake | Handover | HandedOver | Kick | Ask | Answer


def handover(client_id: str, clean_start: bool, requester: str, request: str) -> bytes:
    return Z.join(
        [b"h", client_id.encode(), b"1" if clean_start else b"0", requester.encode(), request.encode()]
    )


def handed_over(request: str) -> bytes:
    return Z.join([b"H", request.encode()])


def kick(client_id: str, epoch: int) -> bytes:
    return Z.join([b"k", client_id.encode(), str(epoch).encode()])


def ask(requester: str, request: str, body: bytes) -> bytes:
    return Z.join([b"a", requester.encode(), request.encode(), body])


def answer(request: str, body: bytes) -> bytes:
    return Z.join([b"A", request.encode(), body])


def parse_node_message(data: bytes) -> NodeMessage:
    kind, _, rest = data.partition(Z)
    if kind == b"w":
        return Wake(rest.decode())
    if kind == b"h":
        cid, clean, requester, request = rest.split(Z, 3)
        return Handover(cid.decode(), clean == b"1", requester.decode(), request.decode())
    if kind == b"H":
        return HandedOver(rest.decode())
    if kind == b"k":
        cid, epoch = rest.split(Z, 1)
        return Kick(cid.decode(), int(epoch))
    if kind == b"a":
        requester, request, body = rest.split(Z, 2)
        return Ask(requester.decode(), request.decode(), body)
    if kind == b"A":
        request, body = rest.split(Z, 1)
        return Answer(request.decode(), body)
    raise ValueError(f"unknown node message kind {kind!r}")


# -- the Lua side ------------------------------------------------------------------------------------------
def _lua_function(name: str, kind: str, *params: str) -> str:
    body = " .. Z .. ".join([f"'{kind}'", *params])
    return f"local function {name}({', '.join(params)}) return {body} end\n"


_PID_AT = struct.calcsize(">QBB")  # a packed delivery's packet id starts here; its stage follows it

#: Lua functions that build the messages scripts publish (with the same kind letters the parsers read), and
#: `queued_delivery`, which turns a journal entry into a queue item: the same delivery, not sent yet (no
#: packet id, stage 0), for whichever node owns the session to place and number
LUA_PRELUDE = (
    "local Z = string.char(0)\n"
    + _lua_function("route_added", "r", "origin", "client_id", "topic_filter", "packed_sub")
    + _lua_function("route_removed", "u", "origin", "client_id", "topic_filter")
    + _lua_function("session_ended", "d", "origin", "client_id")
    + _lua_function("wake", "w", "client_id")
    + "local function queued_delivery(journal_value)\n"
    + "  local packed = string.sub(journal_value, string.find(journal_value, ':', 1, true) + 1)\n"
    + f"  return string.sub(packed, 1, {_PID_AT}) .. string.rep(Z, 3) .. string.sub(packed, {_PID_AT + 4})\n"
    + "end\n"
)
