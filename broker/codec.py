"""Sans-I/O MQTT 3.1 / 3.1.1 / 5.0 codec.

The codec never touches sockets or the event loop: :class:`Parser` is fed bytes and returns
packet dataclasses, :func:`encode` turns a packet back into bytes.  Keeping it pure makes it
trivially testable (and fuzzable) and lets the channel layer own all I/O and flow control.

PUBLISH and the 4-byte acks are the broker's hot path, so their decode is inlined in
:meth:`Parser.feed` and :func:`encode_publish` / :func:`encode_ack` bypass the generic encoder.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "MQTT5",
    "MQTT31",
    "MQTT311",
    "PINGREQ_BYTES",
    "PINGRESP_BYTES",
    "RC",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "Packet",
    "PacketType",
    "Parser",
    "Pingreq",
    "Pingresp",
    "Prop",
    "Properties",
    "ProtocolError",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "SubOpts",
    "Suback",
    "Subscribe",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "encode",
    "encode_ack",
    "encode_properties",
    "encode_publish",
    "encode_varint",
    "publish_parts",
]

MQTT31, MQTT311, MQTT5 = 3, 4, 5

PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"

#: Largest value a four-byte Variable Byte Integer can hold (MQTT 5 section 1.5.5).
MAX_VARINT = 268_435_455


class PacketType(enum.IntEnum):
    """Control packet types (upper nibble of the first fixed-header byte)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class RC(enum.IntEnum):
    """MQTT 5 reason codes (spec section 2.4); aliases share a value."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class Prop(enum.IntEnum):
    """MQTT 5 property identifiers (spec section 2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


#: Property id -> value.  ints for numeric props, str for UTF-8 strings, bytes for binary data,
#: USER_PROPERTY -> list[tuple[str, str]], SUBSCRIPTION_IDENTIFIER -> list[int] in PUBLISH and a
#: plain int in SUBSCRIBE.  ``{}`` means "no properties" (always the case for v3.x packets).
Properties = dict[int, Any]


class ProtocolError(Exception):
    """Malformed input or protocol violation; `reason` is the MQTT 5 reason code the broker should use.

    ``packets`` holds the packets that were decoded successfully from the same ``feed()`` call before
    the bad one, so the owner may still act on them before closing the connection.
    """

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message
        self.packets: list[Packet] = []

    def __str__(self) -> str:
        return f"{self.message} (reason 0x{self.reason:02X})"


# ----------------------------------------------------------------------------------------------
# Packet dataclasses
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Will:
    """Last-will message carried in CONNECT."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    """CONNECT; ``proto_name``/``proto_level`` are written verbatim by :func:`encode`."""

    client_id: str
    proto_level: int = MQTT311
    clean_start: bool = True
    keepalive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)
    proto_name: str = "MQTT"

    def __post_init__(self) -> None:
        # MQTT 3.1 uses a different protocol name; fix the default so Connect(proto_level=3) is valid.
        if self.proto_level == MQTT31 and self.proto_name == "MQTT":
            self.proto_name = "MQIsdp"


@dataclass(slots=True)
class Connack:
    """CONNACK; for v3.x ``reason_code`` holds the v3 return code (0..5) as-is."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


# The packets of the per-message path write their own __init__ (init=False): compiled, a dataclass's
# generated one is still interpreted Python, and one runs for every PUBLISH and every acknowledgement.


@dataclass(slots=True, init=False)
class Publish:
    """PUBLISH; an empty ``topic`` is legal only for v5 together with a TOPIC_ALIAS property."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int
    properties: Properties

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int = 0,
        properties: Properties | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class _Ack:
    """What PUBACK, PUBREC, PUBREL and PUBCOMP carry: each is its own class (the channel dispatches on
    the type), with this one constructor."""

    packet_id: int
    reason_code: int
    properties: Properties

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Puback(_Ack):
    """QoS 1 acknowledgement."""


@dataclass(slots=True, init=False)
class Pubrec(_Ack):
    """QoS 2 delivery part 1."""


@dataclass(slots=True, init=False)
class Pubrel(_Ack):
    """QoS 2 delivery part 2."""


@dataclass(slots=True, init=False)
class Pubcomp(_Ack):
    """QoS 2 delivery part 3."""


@dataclass(slots=True)
class SubOpts:
    """Subscription options byte; v3.x only carries ``qos``."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE; filters are not syntax-checked here (the router does that)."""

    packet_id: int
    subscriptions: list[tuple[str, SubOpts]]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    """SUBACK; v3 return codes are 0, 1, 2 or 0x80."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE."""

    packet_id: int
    topics: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    """UNSUBACK; v3 has no reason codes on the wire (always ``[]`` after a v3 decode)."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    """PINGREQ."""


@dataclass(slots=True)
class Pingresp:
    """PINGRESP."""


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT; v3 ignores reason code and properties."""

    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """AUTH (v5 only): enhanced authentication exchange."""

    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)

# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_ACK = struct.Struct(">BBH")  # first byte, remaining length 2, packet id
_ACK_RC = struct.Struct(">BBHB")  # first byte, remaining length 3, packet id, reason code
_B_U16 = struct.Struct(">BH")  # property id + two-byte integer
_B_U32 = struct.Struct(">BI")  # property id + four-byte integer
_PUB_HDR = struct.Struct(">BBH")  # first byte, one-byte remaining length, topic length
_u16_unpack_from = _U16.unpack_from
_u32_unpack_from = _U32.unpack_from
_u16_pack = _U16.pack

_MALFORMED = RC.MALFORMED_PACKET.value
_PROTOCOL = RC.PROTOCOL_ERROR.value

_WILL = 0  # pseudo packet type used as the property context of will properties

# Property value kinds.
_K_BYTE, _K_U16, _K_U32, _K_VARINT, _K_STR, _K_BIN, _K_PAIR = range(7)

_P = PacketType
_ACKS = frozenset({_P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP})
#: Property id -> (value kind, packet types that may carry it), from the table in spec 2.2.2.2.
_PROP_SPEC_ENUM: dict[Prop, tuple[int, frozenset[int]]] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: (_K_BYTE, frozenset({_P.PUBLISH, _WILL})),
    Prop.MESSAGE_EXPIRY_INTERVAL: (_K_U32, frozenset({_P.PUBLISH, _WILL})),
    Prop.CONTENT_TYPE: (_K_STR, frozenset({_P.PUBLISH, _WILL})),
    Prop.RESPONSE_TOPIC: (_K_STR, frozenset({_P.PUBLISH, _WILL})),
    Prop.CORRELATION_DATA: (_K_BIN, frozenset({_P.PUBLISH, _WILL})),
    Prop.SUBSCRIPTION_IDENTIFIER: (_K_VARINT, frozenset({_P.PUBLISH, _P.SUBSCRIBE})),
    Prop.SESSION_EXPIRY_INTERVAL: (_K_U32, frozenset({_P.CONNECT, _P.CONNACK, _P.DISCONNECT})),
    Prop.ASSIGNED_CLIENT_IDENTIFIER: (_K_STR, frozenset({_P.CONNACK})),
    Prop.SERVER_KEEP_ALIVE: (_K_U16, frozenset({_P.CONNACK})),
    Prop.AUTHENTICATION_METHOD: (_K_STR, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    Prop.AUTHENTICATION_DATA: (_K_BIN, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    Prop.REQUEST_PROBLEM_INFORMATION: (_K_BYTE, frozenset({_P.CONNECT})),
    Prop.WILL_DELAY_INTERVAL: (_K_U32, frozenset({_WILL})),
    Prop.REQUEST_RESPONSE_INFORMATION: (_K_BYTE, frozenset({_P.CONNECT})),
    Prop.RESPONSE_INFORMATION: (_K_STR, frozenset({_P.CONNACK})),
    Prop.SERVER_REFERENCE: (_K_STR, frozenset({_P.CONNACK, _P.DISCONNECT})),
    Prop.REASON_STRING: (
        _K_STR,
        frozenset({_P.CONNACK, *_ACKS, _P.SUBACK, _P.UNSUBACK, _P.DISCONNECT, _P.AUTH}),
    ),
    Prop.RECEIVE_MAXIMUM: (_K_U16, frozenset({_P.CONNECT, _P.CONNACK})),
    Prop.TOPIC_ALIAS_MAXIMUM: (_K_U16, frozenset({_P.CONNECT, _P.CONNACK})),
    Prop.TOPIC_ALIAS: (_K_U16, frozenset({_P.PUBLISH})),
    Prop.MAXIMUM_QOS: (_K_BYTE, frozenset({_P.CONNACK})),
    Prop.RETAIN_AVAILABLE: (_K_BYTE, frozenset({_P.CONNACK})),
    Prop.USER_PROPERTY: (
        _K_PAIR,
        frozenset(
            {
                _P.CONNECT,
                _P.CONNACK,
                _P.PUBLISH,
                _WILL,
                *_ACKS,
                _P.SUBSCRIBE,
                _P.SUBACK,
                _P.UNSUBSCRIBE,
                _P.UNSUBACK,
                _P.DISCONNECT,
                _P.AUTH,
            }
        ),
    ),
    Prop.MAXIMUM_PACKET_SIZE: (_K_U32, frozenset({_P.CONNECT, _P.CONNACK})),
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: (_K_BYTE, frozenset({_P.CONNACK})),
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_K_BYTE, frozenset({_P.CONNACK})),
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: (_K_BYTE, frozenset({_P.CONNACK})),
}
# Plain-int keys make the per-property dict lookups on the decode path hash-cheap.
_PROP_SPEC: dict[int, tuple[int, frozenset[int]]] = {
    int(k): (kind, frozenset(int(t) for t in types)) for k, (kind, types) in _PROP_SPEC_ENUM.items()
}

#: Byte properties whose only legal values are 0 and 1 (anything else is a Protocol Error).
_BOOL_PROPS = frozenset(
    {
        Prop.PAYLOAD_FORMAT_INDICATOR.value,
        Prop.REQUEST_PROBLEM_INFORMATION.value,
        Prop.REQUEST_RESPONSE_INFORMATION.value,
        Prop.MAXIMUM_QOS.value,
        Prop.RETAIN_AVAILABLE.value,
        Prop.WILDCARD_SUBSCRIPTION_AVAILABLE.value,
        Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE.value,
        Prop.SHARED_SUBSCRIPTION_AVAILABLE.value,
    }
)
#: Numeric properties for which 0 is a Protocol Error.
_NONZERO_PROPS = frozenset(
    {
        Prop.RECEIVE_MAXIMUM.value,
        Prop.MAXIMUM_PACKET_SIZE.value,
        Prop.SUBSCRIPTION_IDENTIFIER.value,
    }
)
_USER_PROPERTY = Prop.USER_PROPERTY.value
_SUB_ID = Prop.SUBSCRIPTION_IDENTIFIER.value
_TOPIC_ALIAS = Prop.TOPIC_ALIAS.value


def _valid_first_byte(b0: int) -> bool:
    """Fixed-header first byte check: reserved flag bits, PUBLISH QoS 3, DUP on QoS 0, type 0."""
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 0:
        return False
    if ptype == _P.PUBLISH:
        qos = (flags >> 1) & 3
        return qos != 3 and not (qos == 0 and flags & 8)
    if ptype in (_P.PUBREL, _P.SUBSCRIBE, _P.UNSUBSCRIBE):
        return flags == 0b0010
    return flags == 0


#: Indexed by the first byte: 1 if the fixed-header flags are legal for that packet type.
_B0_OK = bytes(int(_valid_first_byte(b)) for b in range(256))
_VARINT1 = [bytes((i,)) for i in range(128)]
_ACK_CLASSES: dict[
    int, type[Puback | Pubrec | Pubrel | Pubcomp]
] = {}  # filled after the class definitions below

#: Validated PUBLISH topic bytes -> str, shared by all parsers: brokers see the same topics over
#: and over, and a dict hit is cheaper than UTF-8 decoding plus the wildcard/NUL scans. Topics longer
#: than _TOPIC_CACHE_MAX_LEN bytes are decoded each time (as topic.CACHED_TOPIC_MAX for the other caches):
#: the cache holds at most 4096 x 256 bytes of topics (with their str, about 3 MiB), whatever clients send.
_TOPIC_CACHE: dict[bytes, str] = {}
_TOPIC_CACHE_SIZE = 4096
_TOPIC_CACHE_MAX_LEN = 256

# ----------------------------------------------------------------------------------------------
# Decoding helpers.  All take (buffer, position, end) and bound-check against `end` because the
# buffer may hold following packets: running past `end` must be Malformed, not silently succeed.
# ----------------------------------------------------------------------------------------------


def _malformed(message: str) -> ProtocolError:
    return ProtocolError(_MALFORMED, message)


def _read_u16(b: bytes, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise _malformed("two-byte integer runs past the end of the packet")
    return (b[pos] << 8) | b[pos + 1]


def _read_varint(b: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, end)):
        byte = b[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise _malformed("variable byte integer is truncated or longer than 4 bytes")


def _read_bin(b: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise _malformed("binary data length runs past the end of the packet")
    stop = pos + 2 + ((b[pos] << 8) | b[pos + 1])
    if stop > end:
        raise _malformed("binary data runs past the end of the packet")
    return b[pos + 2 : stop], stop


def _read_str(b: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise _malformed("string length runs past the end of the packet")
    stop = pos + 2 + ((b[pos] << 8) | b[pos + 1])
    if stop > end:
        raise _malformed("string runs past the end of the packet")
    s = b[pos + 2 : stop].decode()  # strict: invalid UTF-8 and encoded surrogates raise
    if "\x00" in s:
        raise _malformed("UTF-8 string contains U+0000")
    return s, stop


def _read_props(b: bytes, pos: int, end: int, ctx: int) -> tuple[Properties, int]:
    """Decode a property block (with its length prefix) allowed for packet type `ctx`."""
    plen, pos = _read_varint(b, pos, end)
    pend = pos + plen
    if pend > end:
        raise _malformed("property length runs past the end of the packet")
    props: Properties = {}
    spec_get = _PROP_SPEC.get
    while pos < pend:
        pid = b[pos]
        pos += 1
        spec = spec_get(pid)
        if spec is None:
            raise _malformed(f"unknown property id 0x{pid:02X}")
        kind, allowed = spec
        if ctx not in allowed:
            raise ProtocolError(_PROTOCOL, f"property 0x{pid:02X} is not allowed in this packet")
        value: Any
        if kind == _K_BYTE:
            if pos >= pend:
                raise _malformed("property value runs past the property block")
            value = b[pos]
            pos += 1
            if pid in _BOOL_PROPS and value > 1:
                raise ProtocolError(_PROTOCOL, f"property 0x{pid:02X} must be 0 or 1")
        elif kind == _K_U16:
            value = _read_u16(b, pos, pend)
            pos += 2
        elif kind == _K_U32:
            if pos + 4 > pend:
                raise _malformed("property value runs past the property block")
            value = _u32_unpack_from(b, pos)[0]
            pos += 4
        elif kind == _K_VARINT:
            value, pos = _read_varint(b, pos, pend)
        elif kind == _K_STR:
            value, pos = _read_str(b, pos, pend)
        elif kind == _K_BIN:
            value, pos = _read_bin(b, pos, pend)
        else:  # _K_PAIR: only USER_PROPERTY, which may repeat and keeps order
            key, pos = _read_str(b, pos, pend)
            val, pos = _read_str(b, pos, pend)
            lst = props.get(pid)
            if lst is None:
                props[pid] = [(key, val)]
            else:
                lst.append((key, val))
            continue
        if value == 0:
            if pid in _NONZERO_PROPS:
                raise ProtocolError(_PROTOCOL, f"property 0x{pid:02X} must not be 0")
            if pid == _TOPIC_ALIAS:
                raise ProtocolError(RC.TOPIC_ALIAS_INVALID, "topic alias 0 is not allowed")
        if pid == _SUB_ID and ctx == _P.PUBLISH:
            ids = props.get(pid)
            if ids is None:
                props[pid] = [value]
            else:
                ids.append(value)
        elif pid in props:
            raise ProtocolError(_PROTOCOL, f"property 0x{pid:02X} appears more than once")
        else:
            props[pid] = value
    return props, pend


def _check_end(pos: int, end: int) -> None:
    if pos != end:
        raise _malformed("packet has trailing bytes")


def _read_packet_id(b: bytes, pos: int, end: int) -> int:
    pid = _read_u16(b, pos, end)
    if pid == 0:
        raise _malformed("packet identifier must not be 0")
    return pid


# ----------------------------------------------------------------------------------------------
# Per-type body decoders: (buffer, first byte, body start, body end, version) -> packet.
# PUBLISH and the short acks never get here (inlined in Parser.feed).
# ----------------------------------------------------------------------------------------------


def _d_connect(b: bytes, b0: int, pos: int, end: int, version: int) -> Connect:
    name, pos = _read_str(b, pos, end)
    if pos >= end:
        raise _malformed("CONNECT truncated before protocol level")
    level = b[pos]
    pos += 1
    if name == "MQTT":
        if level not in (MQTT311, MQTT5):
            raise ProtocolError(RC.UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol level {level}")
    elif name == "MQIsdp":
        if level != MQTT31:
            raise ProtocolError(RC.UNSUPPORTED_PROTOCOL_VERSION, f"unsupported MQIsdp level {level}")
    else:
        raise ProtocolError(RC.UNSUPPORTED_PROTOCOL_VERSION, f"unknown protocol name {name!r}")
    if pos + 3 > end:
        raise _malformed("CONNECT truncated in the variable header")
    flags = b[pos]
    keepalive = (b[pos + 1] << 8) | b[pos + 2]
    pos += 3
    if flags & 0x01:
        raise _malformed("reserved CONNECT flag is set")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if will_qos == 3:
        raise _malformed("will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise _malformed("will QoS/retain set without the will flag")
    has_user = flags & 0x80
    has_password = flags & 0x40
    if has_password and not has_user and level < MQTT5:
        raise _malformed("password flag set without user name flag")
    props: Properties = {}
    if level == MQTT5:
        props, pos = _read_props(b, pos, end, _P.CONNECT)
    client_id, pos = _read_str(b, pos, end)
    will = None
    if will_flag:
        will_props: Properties = {}
        if level == MQTT5:
            will_props, pos = _read_props(b, pos, end, _WILL)
        will_topic, pos = _read_str(b, pos, end)
        if not will_topic or "+" in will_topic or "#" in will_topic:
            raise ProtocolError(RC.TOPIC_NAME_INVALID, "invalid will topic")
        will_payload, pos = _read_bin(b, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_user:
        username, pos = _read_str(b, pos, end)
    if has_password:
        password, pos = _read_bin(b, pos, end)
    _check_end(pos, end)
    return Connect(client_id, level, bool(flags & 0x02), keepalive, will, username, password, props, name)


def _d_connack(b: bytes, b0: int, pos: int, end: int, version: int) -> Connack:
    if pos + 2 > end:
        raise _malformed("CONNACK too short")
    flags = b[pos]
    code = b[pos + 1]
    if flags & 0xFE:
        raise _malformed("reserved CONNACK flags set")
    props: Properties = {}
    if version == MQTT5:
        props, pos = _read_props(b, pos + 2, end, _P.CONNACK)
    else:
        pos += 2
        if code > 5:
            raise _malformed(f"invalid v3 CONNACK return code {code}")
    _check_end(pos, end)
    return Connack(bool(flags), code, props)


def _d_ack(b: bytes, b0: int, pos: int, end: int, version: int) -> Puback | Pubrec | Pubrel | Pubcomp:
    cls = _ACK_CLASSES[b0 >> 4]
    pid = _read_packet_id(b, pos, end)
    pos += 2
    if version != MQTT5 or pos == end:
        _check_end(pos, end)
        return cls(pid)
    code = b[pos]
    pos += 1
    if pos == end:
        return cls(pid, code)
    props, pos = _read_props(b, pos, end, b0 >> 4)
    _check_end(pos, end)
    return cls(pid, code, props)


def _d_subscribe(b: bytes, b0: int, pos: int, end: int, version: int) -> Subscribe:
    pid = _read_packet_id(b, pos, end)
    pos += 2
    props: Properties = {}
    v5 = version == MQTT5
    if v5:
        props, pos = _read_props(b, pos, end, _P.SUBSCRIBE)
    subs: list[tuple[str, SubOpts]] = []
    reserved = 0xC0 if v5 else 0xFC
    while pos < end:
        topic, pos = _read_str(b, pos, end)
        if pos >= end:
            raise _malformed("SUBSCRIBE filter without options byte")
        opts = b[pos]
        pos += 1
        if opts & reserved:
            raise _malformed("reserved subscription option bits set")
        qos = opts & 3
        if qos == 3:
            raise _malformed("subscription QoS 3")
        rh = (opts >> 4) & 3
        if rh == 3:
            raise _malformed("retain handling 3")
        subs.append((topic, SubOpts(qos, bool(opts & 4), bool(opts & 8), rh)))
    if not subs:
        raise ProtocolError(_PROTOCOL, "SUBSCRIBE without topic filters")
    return Subscribe(pid, subs, props)


def _d_suback(b: bytes, b0: int, pos: int, end: int, version: int) -> Suback:
    pid = _read_packet_id(b, pos, end)
    pos += 2
    props: Properties = {}
    if version == MQTT5:
        props, pos = _read_props(b, pos, end, _P.SUBACK)
    codes = list(b[pos:end])
    if version != MQTT5:
        for c in codes:
            if c > 2 and c != 0x80:
                raise _malformed(f"invalid v3 SUBACK return code {c}")
    return Suback(pid, codes, props)


def _d_unsubscribe(b: bytes, b0: int, pos: int, end: int, version: int) -> Unsubscribe:
    pid = _read_packet_id(b, pos, end)
    pos += 2
    props: Properties = {}
    if version == MQTT5:
        props, pos = _read_props(b, pos, end, _P.UNSUBSCRIBE)
    topics: list[str] = []
    while pos < end:
        topic, pos = _read_str(b, pos, end)
        topics.append(topic)
    if not topics:
        raise ProtocolError(_PROTOCOL, "UNSUBSCRIBE without topic filters")
    return Unsubscribe(pid, topics, props)


def _d_unsuback(b: bytes, b0: int, pos: int, end: int, version: int) -> Unsuback:
    pid = _read_packet_id(b, pos, end)
    pos += 2
    if version != MQTT5:
        _check_end(pos, end)
        return Unsuback(pid)
    props, pos = _read_props(b, pos, end, _P.UNSUBACK)
    return Unsuback(pid, list(b[pos:end]), props)


def _d_pingreq(b: bytes, b0: int, pos: int, end: int, version: int) -> Pingreq:
    _check_end(pos, end)
    return Pingreq()


def _d_pingresp(b: bytes, b0: int, pos: int, end: int, version: int) -> Pingresp:
    _check_end(pos, end)
    return Pingresp()


def _d_reason_props(b: bytes, pos: int, end: int, ptype: int, version: int) -> tuple[int, Properties]:
    """DISCONNECT/AUTH body: reason code and properties may both be omitted (v5)."""
    if version != MQTT5 or pos == end:
        _check_end(pos, end)
        return 0, {}
    code = b[pos]
    pos += 1
    if pos == end:
        return code, {}
    props, pos = _read_props(b, pos, end, ptype)
    _check_end(pos, end)
    return code, props


def _d_disconnect(b: bytes, b0: int, pos: int, end: int, version: int) -> Disconnect:
    code, props = _d_reason_props(b, pos, end, _P.DISCONNECT, version)
    return Disconnect(code, props)


def _d_auth(b: bytes, b0: int, pos: int, end: int, version: int) -> Auth:
    if version != MQTT5:
        raise _malformed("AUTH is only valid in MQTT 5")
    code, props = _d_reason_props(b, pos, end, _P.AUTH, version)
    return Auth(code, props)


def _d_invalid(b: bytes, b0: int, pos: int, end: int, version: int) -> Packet:
    raise _malformed("invalid packet type")  # unreachable: the first-byte table rejects these


_ACK_CLASSES.update({4: Puback, 5: Pubrec, 6: Pubrel, 7: Pubcomp})
_DECODERS: tuple[Callable[[bytes, int, int, int, int], Packet], ...] = (
    _d_invalid,
    _d_connect,
    _d_connack,
    _d_invalid,  # PUBLISH is inlined in Parser.feed
    _d_ack,
    _d_ack,
    _d_ack,
    _d_ack,
    _d_subscribe,
    _d_suback,
    _d_unsubscribe,
    _d_unsuback,
    _d_pingreq,
    _d_pingresp,
    _d_disconnect,
    _d_auth,
)


class Parser:
    """Incremental decoder for one connection (either direction: decodes every packet type).

    Bytes are accumulated in a bytearray only while a packet is incomplete; complete data is parsed
    from an immutable ``bytes`` object with an offset, because slicing ``bytes`` is the cheapest way
    to produce the payload/topic objects.  The unconsumed tail is saved once per ``feed()`` call.
    """

    __slots__ = ("_buf", "_error", "_need", "dollar", "max_packet_size", "version")

    def __init__(self, max_packet_size: int = 0, version: int = 0) -> None:
        self.max_packet_size = max_packet_size  # 0 = unlimited
        self.version = version  # 0 = unknown until a CONNECT is decoded
        #: whether a PUBLISH on a topic starting with '$' (the server's, MQTT 4.7.2) was decoded; such topics
        #: are never cached, so telling costs nothing on the cached path
        self.dollar = False
        #: a partial packet's bytes; none while there is none (most connections, most of the time: 56
        #: bytes each for an empty bytearray)
        self._buf: bytearray | None = None
        self._need = 0  # bytes the buffered partial packet needs before a parse can make progress
        self._error: ProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Append `data` and return every complete packet, in order; partial packets stay buffered."""
        if self._error is not None:
            raise ProtocolError(self._error.reason, f"parser already failed: {self._error.message}")
        buf = self._buf
        if buf is not None:
            buf += data
            if len(buf) < self._need:
                return []  # a large packet is still arriving: don't rescan or copy
            work = bytes(buf)
            self._buf = None
        else:
            work = data if type(data) is bytes else bytes(data)
        out: list[Packet] = []
        try:
            pos = self._parse(work, out)
        except ProtocolError as exc:
            exc.packets = out
            self._error = exc
            raise
        except (IndexError, ValueError, struct.error) as bad:  # UnicodeDecodeError is a ValueError
            err = ProtocolError(_MALFORMED, f"malformed packet: {bad}")
            err.packets = out
            self._error = err
            raise err from bad
        if pos < len(work):
            self._buf = bytearray(memoryview(work)[pos:])
        return out

    def _parse(self, b: bytes, out: list[Packet]) -> int:
        """Decode complete packets from `b` into `out`; return the offset of the unconsumed tail."""
        end = len(b)
        pos = 0
        version = self.version
        maxsize = self.max_packet_size
        append = out.append
        b0_ok = _B0_OK
        decoders = _DECODERS
        topic_cache = _TOPIC_CACHE
        topic_cache_get = topic_cache.get
        self._need = 0
        while end - pos >= 2:
            b0 = b[pos]
            if not b0_ok[b0]:
                raise _malformed(f"invalid fixed header byte 0x{b0:02X}")
            ptype = b0 >> 4
            if version == 0 and ptype != 1:
                raise ProtocolError(_PROTOCOL, "first packet must be CONNECT")
            rl = b[pos + 1]
            if rl < 0x80:
                hdr = 2
            else:  # multi-byte remaining length (at most 4 bytes)
                rl &= 0x7F
                i = pos + 2
                shift = 7
                while True:
                    if i >= end:
                        return pos  # header itself is incomplete
                    byte = b[i]
                    i += 1
                    rl |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    if i - pos >= 5:
                        raise _malformed("remaining length longer than 4 bytes")
                    shift += 7
                hdr = i - pos
            total = hdr + rl
            if maxsize and total > maxsize:
                raise ProtocolError(RC.PACKET_TOO_LARGE, f"packet of {total} bytes exceeds {maxsize}")
            stop = pos + total
            if stop > end:
                self._need = total
                return pos
            start = pos + hdr
            if ptype == 3:
                # ---- PUBLISH fast path ----
                if start + 2 > stop:
                    raise _malformed("PUBLISH truncated before topic")
                p = start + 2 + ((b[start] << 8) | b[start + 1])
                if p > stop:
                    raise _malformed("PUBLISH topic runs past the end of the packet")
                raw = b[start + 2 : p]
                topic = topic_cache_get(raw)
                if topic is None:
                    topic = raw.decode()
                    if "+" in topic or "#" in topic:
                        raise ProtocolError(RC.TOPIC_NAME_INVALID, "wildcard in PUBLISH topic")
                    if "\x00" in topic:
                        raise _malformed("UTF-8 string contains U+0000")
                    if topic and topic[0] == "$":
                        self.dollar = True
                    elif topic and len(raw) <= _TOPIC_CACHE_MAX_LEN:  # validated, non-empty, short
                        if len(topic_cache) >= _TOPIC_CACHE_SIZE:
                            topic_cache.clear()
                        topic_cache[raw] = topic
                qos = (b0 >> 1) & 3
                if qos:
                    if p + 2 > stop:
                        raise _malformed("PUBLISH truncated before packet identifier")
                    pid = (b[p] << 8) | b[p + 1]
                    if not pid:
                        raise _malformed("packet identifier must not be 0")
                    p += 2
                else:
                    pid = 0
                if version == 5:
                    if p >= stop:
                        raise _malformed("PUBLISH truncated before properties")
                    if b[p] == 0:
                        props: Properties = {}
                        p += 1
                    else:
                        props, p = _read_props(b, p, stop, 3)
                    if not topic and _TOPIC_ALIAS not in props:
                        raise ProtocolError(_PROTOCOL, "empty topic without a topic alias")
                else:
                    props = {}
                    if not topic:
                        raise _malformed("empty PUBLISH topic")
                append(Publish(topic, b[p:stop], qos, bool(b0 & 1), bool(b0 & 8), pid, props))
            elif rl == 2 and 4 <= ptype <= 7:
                # ---- short ack fast path (v3 acks, v5 success acks) ----
                pid = (b[start] << 8) | b[start + 1]
                if not pid:
                    raise _malformed("packet identifier must not be 0")
                append(_ACK_CLASSES[ptype](pid))
            else:
                packet = decoders[ptype](b, b0, start, stop, version)
                append(packet)
                if ptype == 1 and version == 0 and isinstance(packet, Connect):
                    version = self.version = packet.proto_level
            pos = stop
        return pos


# ----------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Encode a Variable Byte Integer (1-4 bytes)."""
    if n < 0x80:
        if n < 0:
            raise ValueError(f"varint out of range: {n}")
        return _VARINT1[n]
    if n > MAX_VARINT:
        raise ValueError(f"varint out of range: {n}")
    out = bytearray()
    while True:
        digit = n & 0x7F
        n >>= 7
        if n:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def _e_str(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return _u16_pack(len(raw)) + raw


def _e_bin(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return _u16_pack(len(data)) + bytes(data)


def encode_properties(props: Properties) -> bytes:
    """Encode a property block WITHOUT its length prefix (so callers can cache it per message)."""
    if not props:
        return b""
    parts: list[bytes] = []
    add = parts.append
    for pid, value in props.items():
        spec = _PROP_SPEC.get(pid)
        if spec is None:
            raise ValueError(f"unknown property id {pid!r}")
        kind = spec[0]
        if kind == _K_BYTE:
            add(bytes((pid, value)))
        elif kind == _K_U16:
            add(_B_U16.pack(pid, value))
        elif kind == _K_U32:
            add(_B_U32.pack(pid, value))
        elif kind == _K_VARINT:
            for v in value if isinstance(value, list | tuple) else (value,):
                add(_VARINT1[pid] + encode_varint(v))
        elif kind == _K_STR:
            add(_VARINT1[pid] + _e_str(value))
        elif kind == _K_BIN:
            add(_VARINT1[pid] + _e_bin(value))
        else:
            for k, v in value:
                add(_VARINT1[pid] + _e_str(k) + _e_str(v))
    return b"".join(parts)


def decode_properties(block: bytes, ptype: int = PacketType.PUBLISH) -> Properties:
    """Decode a property block as `encode_properties` writes it (no length prefix), for stored messages."""
    data = encode_varint(len(block)) + block
    props, _ = _read_props(data, 0, len(data), ptype)
    return props


def _e_props_block(props: Properties) -> bytes:
    """Property block WITH its length prefix (v5 variable headers)."""
    if not props:
        return b"\x00"
    raw = encode_properties(props)
    return encode_varint(len(raw)) + raw


def _frame(b0: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((b0, n)) + body
    return b"".join((bytes((b0,)), encode_varint(n), body))


def encode_publish(
    topic: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int,
    props: bytes | None,
    version: int,
) -> bytes:
    """Hot-path PUBLISH encoder: pre-encoded topic and (v5) property block without length prefix."""
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    tlen = len(topic)
    if version == 5:
        pblock = encode_varint(len(props)) + props if props else b"\x00"
        rl = 2 + tlen + len(pblock) + len(payload)
    else:
        pblock = b""
        rl = 2 + tlen + len(payload)
    if qos:
        rl += 2
        if rl < 0x80:
            return b"".join((_PUB_HDR.pack(b0, rl, tlen), topic, _u16_pack(packet_id), pblock, payload))
        return b"".join(
            (bytes((b0,)), encode_varint(rl), _u16_pack(tlen), topic, _u16_pack(packet_id), pblock, payload)
        )
    if rl < 0x80:
        return b"".join((_PUB_HDR.pack(b0, rl, tlen), topic, pblock, payload))
    return b"".join((bytes((b0,)), encode_varint(rl), _u16_pack(tlen), topic, pblock, payload))


def publish_parts(
    topic: bytes, payload_len: int, qos: int, retain: bool, dup: bool, props: bytes | None, version: int
) -> tuple[bytes, bytes]:
    """A QoS 1/2 PUBLISH split around its packet id: ``head + id + block + payload`` is encode_publish's
    packet (`block`: v5's property block, empty before v5).

    A message delivered to many subscribers differs between them only in the id: the parts are made once
    per message and variant, and each delivery joins them around its own two bytes. The payload is not in
    them: a message waiting in queues keeps one copy of it."""
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    tlen = len(topic)
    block = b""
    if version == 5:
        block = encode_varint(len(props)) + props if props else b"\x00"
    rl = 4 + tlen + len(block) + payload_len
    if rl < 0x80:
        return _PUB_HDR.pack(b0, rl, tlen) + topic, block
    return bytes((b0,)) + encode_varint(rl) + _u16_pack(tlen) + topic, block


_ACK_B0 = {4: 0x40, 5: 0x50, 6: 0x62, 7: 0x70}
_ack_pack = _ACK.pack
#: the fixed header of a 4-byte PUBACK/PUBREC/PUBREL/PUBCOMP, by packet type
_ACK_HEAD: Final[tuple[bytes, ...]] = (b"", b"", b"", b"", b"\x40\x02", b"\x50\x02", b"\x62\x02", b"\x70\x02")
_ack_rc_pack = _ACK_RC.pack


def encode_ack(ptype: int, packet_id: int, reason_code: int = 0, version: int = MQTT311) -> bytes:
    """Hot-path PUBACK/PUBREC/PUBREL/PUBCOMP encoder without properties (4 bytes, or 5 with a v5 reason)."""
    if reason_code and version == 5:
        return _ack_rc_pack(_ACK_B0[ptype], 3, packet_id, reason_code)
    return _ACK_HEAD[ptype] + packet_id.to_bytes(2, "big")


def _e_connect(p: Connect, version: int) -> bytes:
    v5 = version == MQTT5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        flags |= 0x40
    parts = [_e_str(p.proto_name), bytes((p.proto_level, flags)), _u16_pack(p.keepalive)]
    if v5:
        parts.append(_e_props_block(p.properties))
    parts.append(_e_str(p.client_id))
    if will is not None:
        if v5:
            parts.append(_e_props_block(will.properties))
        parts.append(_e_str(will.topic))
        parts.append(_e_bin(will.payload))
    if p.username is not None:
        parts.append(_e_str(p.username))
    if p.password is not None:
        parts.append(_e_bin(p.password))
    return _frame(0x10, b"".join(parts))


def _e_connack(p: Connack, version: int) -> bytes:
    flags = 1 if p.session_present and version != MQTT31 else 0
    body = bytes((flags, p.reason_code))
    if version == MQTT5:
        body += _e_props_block(p.properties)
    return _frame(0x20, body)


def _e_publish(p: Publish, version: int) -> bytes:
    props = encode_properties(p.properties) if version == MQTT5 else None
    return encode_publish(
        p.topic.encode(), bytes(p.payload), p.qos, p.retain, p.dup, p.packet_id, props, version
    )


def _e_ack(p: Puback | Pubrec | Pubrel | Pubcomp, version: int) -> bytes:
    ptype = _ACK_TYPES[type(p)]
    if version != MQTT5 or not p.properties:
        return encode_ack(ptype, p.packet_id, p.reason_code, version)
    body = _u16_pack(p.packet_id) + bytes((p.reason_code,)) + _e_props_block(p.properties)
    return _frame(_ACK_B0[ptype], body)


def _e_subscribe(p: Subscribe, version: int) -> bytes:
    v5 = version == MQTT5
    parts = [_u16_pack(p.packet_id)]
    if v5:
        parts.append(_e_props_block(p.properties))
    for topic, o in p.subscriptions:
        opts = o.qos
        if v5:
            opts |= (4 if o.no_local else 0) | (8 if o.retain_as_published else 0) | (o.retain_handling << 4)
        parts.append(_e_str(topic) + bytes((opts,)))
    return _frame(0x82, b"".join(parts))


def _e_suback(p: Suback, version: int) -> bytes:
    if version == MQTT5:
        body = _u16_pack(p.packet_id) + _e_props_block(p.properties) + bytes(p.reason_codes)
    else:
        codes = bytes(c if c <= 2 else 0x80 for c in p.reason_codes)
        body = _u16_pack(p.packet_id) + codes
    return _frame(0x90, body)


def _e_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    parts = [_u16_pack(p.packet_id)]
    if version == MQTT5:
        parts.append(_e_props_block(p.properties))
    parts.extend(_e_str(t) for t in p.topics)
    return _frame(0xA2, b"".join(parts))


def _e_unsuback(p: Unsuback, version: int) -> bytes:
    if version != MQTT5:
        return _ack_pack(0xB0, 2, p.packet_id)
    body = _u16_pack(p.packet_id) + _e_props_block(p.properties) + bytes(p.reason_codes)
    return _frame(0xB0, body)


def _e_pingreq(p: Pingreq, version: int) -> bytes:
    return PINGREQ_BYTES


def _e_pingresp(p: Pingresp, version: int) -> bytes:
    return PINGRESP_BYTES


def _e_disconnect(p: Disconnect, version: int) -> bytes:
    if version != MQTT5 or (not p.reason_code and not p.properties):
        return b"\xe0\x00"
    if not p.properties:
        return bytes((0xE0, 1, p.reason_code))
    return _frame(0xE0, bytes((p.reason_code,)) + _e_props_block(p.properties))


def _e_auth(p: Auth, version: int) -> bytes:
    if version != MQTT5:
        raise ValueError("AUTH exists only in MQTT 5")
    if not p.reason_code and not p.properties:
        return b"\xf0\x00"
    return _frame(0xF0, bytes((p.reason_code,)) + _e_props_block(p.properties))


_ACK_TYPES: dict[type, int] = {Puback: 4, Pubrec: 5, Pubrel: 6, Pubcomp: 7}
_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _e_connect,
    Connack: _e_connack,
    Publish: _e_publish,
    Puback: _e_ack,
    Pubrec: _e_ack,
    Pubrel: _e_ack,
    Pubcomp: _e_ack,
    Subscribe: _e_subscribe,
    Suback: _e_suback,
    Unsubscribe: _e_unsubscribe,
    Unsuback: _e_unsuback,
    Pingreq: _e_pingreq,
    Pingresp: _e_pingresp,
    Disconnect: _e_disconnect,
    Auth: _e_auth,
}


def encode(packet: Packet, version: int) -> bytes:
    """Encode any packet for protocol level `version` (v3.x drops properties and ack reason codes)."""
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return encoder(packet, version)
