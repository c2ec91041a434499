"""Unit tests for the sans-I/O MQTT codec (fleetmq.broker.codec)."""

from __future__ import annotations

import random
import struct

import pytest
from fleetmq.broker.codec import (
    MQTT5,
    MQTT31,
    MQTT311,
    PINGREQ_BYTES,
    PINGRESP_BYTES,
    RC,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Parser,
    Pingreq,
    Pingresp,
    Prop,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOpts,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_ack,
    encode_properties,
    encode_publish,
    encode_varint,
    publish_parts,
)

from tests.unit.codec_support import ALLOWED, WILL, roundtrip

# ---------------------------------------------------------------------------------------------
# Helpers for hand-built packets
# ---------------------------------------------------------------------------------------------


def vbi(n: int) -> bytes:
    """Independent Variable Byte Integer encoder (spec 1.5.5 algorithm)."""
    out = bytearray()
    while True:
        d, n = n % 128, n // 128
        out.append(d | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(b0: int, body: bytes) -> bytes:
    return bytes((b0,)) + vbi(len(body)) + body


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def props(raw: bytes) -> bytes:
    return vbi(len(raw)) + raw


def connect_body(
    name: bytes = b"MQTT",
    level: int = 4,
    flags: int = 0x02,
    keepalive: int = 60,
    tail: bytes = b"",
    client_id: str = "c",
    v5props: bytes | None = None,
) -> bytes:
    vh = s(name) + bytes((level, flags)) + u16(keepalive)
    if v5props is not None:
        vh += props(v5props)
    return vh + s(client_id) + tail


def decode_one(data: bytes, version: int) -> Packet:
    out = Parser(version=version).feed(data)
    assert len(out) == 1, out
    return out[0]


def expect_error(data: bytes, version: int, reason: int) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        Parser(version=version).feed(data)
    assert info.value.reason == reason, (hex(info.value.reason), info.value.message)
    return info.value


# ---------------------------------------------------------------------------------------------
# Sample properties: one value per property (where each may appear: codec_support.ALLOWED)
# ---------------------------------------------------------------------------------------------

SAMPLE: dict[int, object] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: 1,
    Prop.MESSAGE_EXPIRY_INTERVAL: 3600,
    Prop.CONTENT_TYPE: "application/json",
    Prop.RESPONSE_TOPIC: "reply/here",
    Prop.CORRELATION_DATA: b"\x00\x01corr",
    Prop.SUBSCRIPTION_IDENTIFIER: 268_435_455,
    Prop.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF,
    Prop.ASSIGNED_CLIENT_IDENTIFIER: "auto-123",
    Prop.SERVER_KEEP_ALIVE: 30,
    Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
    Prop.AUTHENTICATION_DATA: b"\xde\xad\xbe\xef",
    Prop.REQUEST_PROBLEM_INFORMATION: 0,
    Prop.WILL_DELAY_INTERVAL: 10,
    Prop.REQUEST_RESPONSE_INFORMATION: 1,
    Prop.RESPONSE_INFORMATION: "resp/info",
    Prop.SERVER_REFERENCE: "other-server:1883",
    Prop.REASON_STRING: "because ü",
    Prop.RECEIVE_MAXIMUM: 65535,
    Prop.TOPIC_ALIAS_MAXIMUM: 10,
    Prop.TOPIC_ALIAS: 7,
    Prop.MAXIMUM_QOS: 1,
    Prop.RETAIN_AVAILABLE: 0,
    Prop.USER_PROPERTY: [("k", "v"), ("k", "v2"), ("", ""), ("ключ", "значение")],
    Prop.MAXIMUM_PACKET_SIZE: 1024,
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 0,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: 1,
}

P = Prop


def sample_props(ctx: object, only: int | None = None) -> dict[int, object]:
    out: dict[int, object] = {}
    for pid in ALLOWED[ctx]:
        if only is not None and pid != only:
            continue
        value = SAMPLE[pid]
        if pid == P.SUBSCRIPTION_IDENTIFIER and ctx == PacketType.PUBLISH:
            value = [1, 268_435_455, 1]  # may repeat in PUBLISH; a list there
        out[int(pid)] = value
    return out


def v5_packet(ptype: object, pr: dict[int, object]) -> Packet:
    """A v5 packet of the given type (or a CONNECT carrying a will for WILL) with properties `pr`."""
    if ptype == WILL:
        return Connect("cid", MQTT5, will=Will("w/t", b"gone", 2, True, pr))
    return {
        PacketType.CONNECT: lambda: Connect("cid", MQTT5, False, 0, None, "user", b"pw\x00\xff", pr),
        PacketType.CONNACK: lambda: Connack(True, 0, pr),
        PacketType.PUBLISH: lambda: Publish("a/b/c", b"\x00payload\xff", 2, True, True, 65535, pr),
        PacketType.PUBACK: lambda: Puback(1, RC.NO_MATCHING_SUBSCRIBERS, pr),
        PacketType.PUBREC: lambda: Pubrec(2, RC.SUCCESS, pr),
        PacketType.PUBREL: lambda: Pubrel(3, RC.PACKET_IDENTIFIER_NOT_FOUND, pr),
        PacketType.PUBCOMP: lambda: Pubcomp(4, 0, pr),
        PacketType.SUBSCRIBE: lambda: Subscribe(
            5, [("a/+", SubOpts(1, True, True, 2)), ("$share/g/#", SubOpts())], pr
        ),
        PacketType.SUBACK: lambda: Suback(6, [0, 1, 2, 0x80, 0x87, 0xA2], pr),
        PacketType.UNSUBSCRIBE: lambda: Unsubscribe(7, ["a/+", "b"], pr),
        PacketType.UNSUBACK: lambda: Unsuback(8, [0, 0x11], pr),
        PacketType.DISCONNECT: lambda: Disconnect(RC.DISCONNECT_WITH_WILL, pr),
        PacketType.AUTH: lambda: Auth(RC.CONTINUE_AUTHENTICATION, pr),
    }[ptype]()


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------

V311_PACKETS: list[Packet] = [
    Connect("client-1"),
    Connect("", MQTT311, False, 0),
    Connect("c", MQTT311, True, 65535, Will("will/topic", b"\x00bye", 1, True), "user", b"\x00\xffpw"),
    Connect("c", MQTT311, True, 5, Will("w", b"", 2, False), "user-only"),
    Connack(),
    Connack(True, 0),
    Connack(False, 5),
    Publish("a/b", b"hello"),
    Publish("a/b", b"", 1, True, True, 1),
    Publish("ü/€/𝄞", b"x" * 300, 2, False, False, 65535),
    Publish("t", b"y" * 20_000, 1, False, False, 9),
    Puback(1),
    Pubrec(65535),
    Pubrel(42),
    Pubcomp(7),
    Subscribe(1, [("a/b", SubOpts(0)), ("c/+/#", SubOpts(1)), ("$SYS/#", SubOpts(2))]),
    Suback(1, [0, 1, 2, 0x80]),
    Unsubscribe(3, ["a/b", "c/#"]),
    Unsuback(3),
    Pingreq(),
    Pingresp(),
    Disconnect(),
]

V5_PACKETS: list[Packet] = [
    Connect("client-5", MQTT5),
    Connect("", MQTT5, False, 10, None, None, b"password-without-username"),
    Connack(False, RC.NOT_AUTHORIZED),
    Publish("a/b", b"hello", 0, False, False, 0),
    Publish("", b"aliased", 1, False, False, 3, {Prop.TOPIC_ALIAS: 1}),
    Publish("big", b"z" * 70_000, 1, False, False, 3),
    Puback(1),
    Puback(1, RC.QUOTA_EXCEEDED),
    Pubrec(2, RC.NO_MATCHING_SUBSCRIBERS),
    Pubrel(3),
    Pubcomp(4, RC.PACKET_IDENTIFIER_NOT_FOUND),
    Subscribe(1, [("a", SubOpts(2, True, False, 1))]),
    Suback(1, [RC.GRANTED_QOS_2]),
    Unsubscribe(2, ["x/y"]),
    Unsuback(2, [RC.NO_SUBSCRIPTION_EXISTED]),
    Pingreq(),
    Pingresp(),
    Disconnect(),
    Disconnect(RC.SERVER_SHUTTING_DOWN),
    Auth(),
    Auth(RC.REAUTHENTICATE),
]


@pytest.mark.parametrize("pkt", V311_PACKETS, ids=repr)
def test_roundtrip_v311(pkt: Packet) -> None:
    assert roundtrip(pkt, MQTT311) == pkt


@pytest.mark.parametrize("pkt", V5_PACKETS, ids=repr)
def test_roundtrip_v5(pkt: Packet) -> None:
    assert roundtrip(pkt, MQTT5) == pkt


@pytest.mark.parametrize(
    "pkt",
    [
        Connect("mqttv31client", MQTT31, proto_name="MQIsdp"),
        Connect("c31", MQTT31, False, 20, Will("w", b"x", 1, True), "u", b"p"),
    ],
    ids=repr,
)
def test_roundtrip_v31_connect(pkt: Connect) -> None:
    assert roundtrip(pkt, MQTT31) == pkt
    assert encode(pkt, MQTT31)[2:10] == b"\x00\x06MQIsdp"


def test_v31_default_proto_name() -> None:
    assert Connect("x", MQTT31).proto_name == "MQIsdp"


@pytest.mark.parametrize("ctx", list(ALLOWED), ids=str)
def test_roundtrip_v5_all_allowed_properties(ctx: object) -> None:
    pkt = v5_packet(ctx, sample_props(ctx))
    assert roundtrip(pkt, MQTT5) == pkt


@pytest.mark.parametrize(
    ("ctx", "pid"), [(ctx, int(pid)) for ctx, pids in ALLOWED.items() for pid in pids], ids=str
)
def test_roundtrip_v5_each_property(ctx: object, pid: int) -> None:
    pkt = v5_packet(ctx, sample_props(ctx, only=pid))
    assert roundtrip(pkt, MQTT5) == pkt


@pytest.mark.parametrize("ctx", list(ALLOWED), ids=str)
def test_v5_disallowed_property_is_protocol_error(ctx: object) -> None:
    """Every property that the spec table does not allow in a packet type is a Protocol Error."""
    base = v5_packet(ctx, {})
    for pid in SAMPLE:
        if pid in ALLOWED[ctx]:
            continue
        bad = {int(pid): SAMPLE[pid]}
        if ctx == WILL:
            assert isinstance(base, Connect) and base.will is not None
            base.will.properties = bad
        else:
            base.properties = bad  # type: ignore[union-attr]
        data = encode(base, MQTT5)
        expect_error(data, 0 if isinstance(base, Connect) else MQTT5, RC.PROTOCOL_ERROR)


def test_v3_drops_properties_and_reason_codes() -> None:
    pkt = Publish("a", b"p", 1, False, False, 5, {Prop.MESSAGE_EXPIRY_INTERVAL: 3})
    assert roundtrip(pkt, MQTT311) == Publish("a", b"p", 1, False, False, 5)
    assert encode(Puback(5, RC.QUOTA_EXCEEDED, {Prop.REASON_STRING: "x"}), MQTT311) == b"\x40\x02\x00\x05"
    assert encode(Unsuback(5, [0x11]), MQTT311) == b"\xb0\x02\x00\x05"
    assert encode(Disconnect(RC.SERVER_SHUTTING_DOWN), MQTT311) == b"\xe0\x00"
    assert encode(Connack(True, 0, {Prop.MAXIMUM_QOS: 1}), MQTT311) == b"\x20\x02\x01\x00"
    assert (
        encode(Suback(1, [0, 1, 2, 0x80, 0x87, 0x9E]), MQTT311) == b"\x90\x08\x00\x01\x00\x01\x02\x80\x80\x80"
    )


# ---------------------------------------------------------------------------------------------
# Byte-exact encodings
# ---------------------------------------------------------------------------------------------

KNOWN: list[tuple[Packet, int, bytes]] = [
    # paho-mqtt 3.1.1 CONNECT: client id "test", clean session, keepalive 60
    (Connect("test", MQTT311, True, 60), MQTT311, b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test"),
    # paho-mqtt v5 CONNECT with an empty property block
    (Connect("test", MQTT5, True, 60), MQTT5, b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x04test"),
    (
        Connect("test", MQTT31, True, 60),
        MQTT31,
        b"\x10\x12\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x04test",
    ),
    (
        Connect("c", MQTT311, False, 10, Will("w", b"x", 1, True), "u", b"p"),
        MQTT311,
        b"\x10\x19\x00\x04MQTT\x04\xec\x00\x0a\x00\x01c\x00\x01w\x00\x01x\x00\x01u\x00\x01p",
    ),
    (Connack(False, 0), MQTT311, b"\x20\x02\x00\x00"),
    (Connack(True, 0), MQTT5, b"\x20\x03\x01\x00\x00"),
    (Publish("a/b", b"hi", 1, False, False, 10), MQTT311, b"\x32\x09\x00\x03a/b\x00\x0ahi"),
    (Publish("a/b", b"hi", 0, True), MQTT311, b"\x31\x07\x00\x03a/bhi"),
    (Publish("a/b", b"hi"), MQTT5, b"\x30\x08\x00\x03a/b\x00hi"),
    (
        Publish("a", b"", 1, False, True, 1, {Prop.MESSAGE_EXPIRY_INTERVAL: 1}),
        MQTT5,
        b"\x3a\x0b\x00\x01a\x00\x01\x05\x02\x00\x00\x00\x01",
    ),
    (Puback(1), MQTT5, b"\x40\x02\x00\x01"),
    (Puback(1), MQTT311, b"\x40\x02\x00\x01"),
    (Puback(1, RC.QUOTA_EXCEEDED), MQTT5, b"\x40\x03\x00\x01\x97"),
    (Pubrec(2), MQTT5, b"\x50\x02\x00\x02"),
    (Pubrel(3), MQTT311, b"\x62\x02\x00\x03"),
    (Pubcomp(4), MQTT5, b"\x70\x02\x00\x04"),
    (Puback(1, 0, {Prop.REASON_STRING: "r"}), MQTT5, b"\x40\x08\x00\x01\x00\x04\x1f\x00\x01r"),
    (Subscribe(1, [("a/b", SubOpts(1))]), MQTT311, b"\x82\x08\x00\x01\x00\x03a/b\x01"),
    (Subscribe(1, [("a/b", SubOpts(1, True, True, 2))]), MQTT5, b"\x82\x09\x00\x01\x00\x00\x03a/b\x2d"),
    (Suback(1, [1]), MQTT311, b"\x90\x03\x00\x01\x01"),
    (Suback(1, [0x87]), MQTT5, b"\x90\x04\x00\x01\x00\x87"),
    (Unsubscribe(2, ["a/b"]), MQTT311, b"\xa2\x07\x00\x02\x00\x03a/b"),
    (Unsuback(2), MQTT311, b"\xb0\x02\x00\x02"),
    (Unsuback(2, [0]), MQTT5, b"\xb0\x04\x00\x02\x00\x00"),
    (Pingreq(), MQTT311, PINGREQ_BYTES),
    (Pingresp(), MQTT5, PINGRESP_BYTES),
    (Disconnect(), MQTT311, b"\xe0\x00"),
    (Disconnect(), MQTT5, b"\xe0\x00"),
    (Disconnect(RC.DISCONNECT_WITH_WILL), MQTT5, b"\xe0\x01\x04"),
    (
        Disconnect(0, {Prop.SESSION_EXPIRY_INTERVAL: 0}),
        MQTT5,
        b"\xe0\x07\x00\x05\x11\x00\x00\x00\x00",
    ),
    (Auth(), MQTT5, b"\xf0\x00"),
    (Auth(RC.CONTINUE_AUTHENTICATION), MQTT5, b"\xf0\x02\x18\x00"),
]


@pytest.mark.parametrize(("pkt", "version", "wire"), KNOWN, ids=repr)
def test_known_encodings(pkt: Packet, version: int, wire: bytes) -> None:
    assert encode(pkt, version) == wire
    parser = Parser(version=0 if isinstance(pkt, Connect) else version)
    assert parser.feed(wire) == [pkt]


def test_constants() -> None:
    assert PINGREQ_BYTES == b"\xc0\x00"
    assert PINGRESP_BYTES == b"\xd0\x00"
    assert (MQTT31, MQTT311, MQTT5) == (3, 4, 5)
    assert RC.NORMAL_DISCONNECTION == RC.SUCCESS == RC.GRANTED_QOS_0 == 0
    assert PacketType.AUTH == 15


@pytest.mark.parametrize(
    ("n", "wire"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_encode_varint(n: int, wire: bytes) -> None:
    assert encode_varint(n) == wire


@pytest.mark.parametrize("n", [-1, 268_435_456])
def test_encode_varint_range(n: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(n)


@pytest.mark.parametrize("size", [0, 1, 120, 121, 122, 16_000, 16_380, 16_390, 2_100_000])
def test_remaining_length_boundaries(size: int) -> None:
    pkt = Publish("t", b"p" * size, 0)
    data = encode(pkt, MQTT311)
    assert data[1:].startswith(vbi(size + 3))
    assert roundtrip(pkt, MQTT311) == pkt


def test_encode_properties_has_no_length_prefix() -> None:
    assert encode_properties({}) == b""
    assert encode_properties({Prop.TOPIC_ALIAS: 5}) == b"\x23\x00\x05"
    assert encode_properties({Prop.SUBSCRIPTION_IDENTIFIER: [1, 200]}) == b"\x0b\x01\x0b\xc8\x01"
    assert (
        encode_properties({Prop.USER_PROPERTY: [("a", "b"), ("a", "c")]})
        == b"\x26\x00\x01a\x00\x01b\x26\x00\x01a\x00\x01c"
    )


def test_encode_rejects_non_packets() -> None:
    with pytest.raises(TypeError):
        encode("nope", MQTT311)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Hot-path helpers == encode()
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [MQTT31, MQTT311, MQTT5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("size", [0, 10, 200, 70_000])
@pytest.mark.parametrize(
    "pr", [{}, {Prop.MESSAGE_EXPIRY_INTERVAL: 9, Prop.USER_PROPERTY: [("a", "b")]}], ids=["noprops", "props"]
)
def test_encode_publish_equivalent(version: int, qos: int, size: int, pr: dict[int, object]) -> None:
    pid = 77 if qos else 0
    payload = bytes(range(256)) * (size // 256) + b"q" * (size % 256)
    pkt = Publish("top/ïc", payload, qos, True, qos > 0, pid, pr)
    want = encode(pkt, version)
    block = encode_properties(pr)
    got = encode_publish(pkt.topic.encode(), pkt.payload, qos, True, qos > 0, pid, block or None, version)
    assert got == want
    assert encode_publish(pkt.topic.encode(), pkt.payload, qos, True, qos > 0, pid, block, version) == want
    if version != MQTT5:
        pkt.properties = {}
    assert Parser(version=version).feed(got) == [pkt]
    if qos:  # the parts a message keeps for its subscribers, joined around each one's packet id
        for retain, dup in ((False, False), (True, True)):
            head, props = publish_parts(
                pkt.topic.encode(), len(payload), qos, retain, dup, block or None, version
            )
            for other in (1, 77, 0x1234, 65535):
                one = encode(Publish("top/ïc", payload, qos, retain, dup, other, pr), version)
                assert head + other.to_bytes(2, "big") + props + payload == one


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
@pytest.mark.parametrize("cls", [Puback, Pubrec, Pubrel, Pubcomp])
@pytest.mark.parametrize("reason", [0, 0x10, 0x80, 0x92])
def test_encode_ack_equivalent(version: int, cls: type, reason: int) -> None:
    ptype = {Puback: 4, Pubrec: 5, Pubrel: 6, Pubcomp: 7}[cls]
    pkt = cls(513, reason)
    data = encode_ack(ptype, 513, reason, version)
    assert data == encode(pkt, version)
    assert len(data) == (5 if version == MQTT5 and reason else 4)
    expected = pkt if version == MQTT5 else cls(513)
    assert Parser(version=version).feed(data) == [expected]


def test_encode_ack_default_version() -> None:
    assert encode_ack(PacketType.PUBACK, 1) == b"\x40\x02\x00\x01"
    assert encode_ack(PacketType.PUBREL, 1, 0x92) == b"\x62\x02\x00\x01"  # v3.1.1: reason dropped


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------


def _stream(version: int) -> tuple[bytes, list[Packet]]:
    pkts: list[Packet] = [Connect("streamer", version)]
    pkts += [p for p in (V5_PACKETS if version == MQTT5 else V311_PACKETS) if not isinstance(p, Connect)]
    return b"".join(encode(p, version) for p in pkts), pkts


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_many_packets_in_one_feed(version: int) -> None:
    data, pkts = _stream(version)
    parser = Parser()
    assert parser.feed(data) == pkts
    assert parser.version == version


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_byte_at_a_time(version: int) -> None:
    data, pkts = _stream(version)
    parser = Parser()
    out: list[Packet] = []
    for i in range(len(data)):
        got = parser.feed(data[i : i + 1])
        out += got
    assert out == pkts


@pytest.mark.parametrize("seed", range(5))
def test_random_chunks(seed: int) -> None:
    rnd = random.Random(seed)
    data, pkts = _stream(MQTT5)
    parser = Parser()
    out: list[Packet] = []
    pos = 0
    while pos < len(data):
        n = rnd.choice([1, 2, 3, 7, 100, 5000, 100_000])
        chunk = data[pos : pos + n]
        out += parser.feed(bytearray(chunk) if n == 3 else memoryview(chunk) if n == 7 else chunk)
        pos += n
    assert out == pkts


def test_partial_packet_is_buffered() -> None:
    data = encode(Publish("a/b", b"x" * 1000, 1, packet_id=1), MQTT311)
    parser = Parser(version=MQTT311)
    assert parser.feed(data[:1]) == []
    assert parser.feed(data[1:3]) == []
    assert parser.feed(data[3:500]) == []
    assert parser.feed(data[500:] + PINGREQ_BYTES[:1]) == [Publish("a/b", b"x" * 1000, 1, packet_id=1)]
    assert parser.feed(PINGREQ_BYTES[1:]) == [Pingreq()]
    assert parser.feed(b"") == []


def test_client_side_parser_with_owner_set_version() -> None:
    parser = Parser()
    parser.version = MQTT5
    assert parser.feed(b"\x20\x03\x00\x00\x00" + b"\x40\x02\x00\x01") == [Connack(), Puback(1)]


def test_connect_sets_version_then_following_packets_use_it() -> None:
    data = encode(Connect("c", MQTT5), MQTT5) + b"\x40\x03\x00\x01\x10"
    parser = Parser()
    assert parser.feed(data) == [Connect("c", MQTT5), Puback(1, RC.NO_MATCHING_SUBSCRIBERS)]
    assert parser.version == MQTT5


# ---------------------------------------------------------------------------------------------
# Size limits and error state
# ---------------------------------------------------------------------------------------------


def test_max_packet_size() -> None:
    data = encode(Publish("t", b"x" * 100), MQTT311)  # 2 + 103 bytes
    assert len(data) == 105
    assert Parser(max_packet_size=105, version=MQTT311).feed(data) == [Publish("t", b"x" * 100)]
    expect_too_large = Parser(max_packet_size=104, version=MQTT311)
    with pytest.raises(ProtocolError) as info:
        expect_too_large.feed(data)
    assert info.value.reason == RC.PACKET_TOO_LARGE


def test_max_packet_size_checked_before_body_arrives() -> None:
    parser = Parser(max_packet_size=1000, version=MQTT311)
    header = b"\x30" + vbi(10_000_000)
    with pytest.raises(ProtocolError) as info:
        parser.feed(header)
    assert info.value.reason == RC.PACKET_TOO_LARGE


def test_max_packet_size_can_change_after_construction() -> None:
    parser = Parser(version=MQTT311)
    assert parser.feed(PINGREQ_BYTES) == [Pingreq()]
    parser.max_packet_size = 10
    with pytest.raises(ProtocolError) as info:
        parser.feed(encode(Publish("t", b"x" * 100), MQTT311))
    assert info.value.reason == RC.PACKET_TOO_LARGE


def test_parser_unusable_after_error_and_keeps_good_packets() -> None:
    parser = Parser(version=MQTT311)
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"\x40\x02\x00\x01" + b"\xc1\x00")
    assert info.value.reason == RC.MALFORMED_PACKET
    assert info.value.packets == [Puback(1)]
    with pytest.raises(ProtocolError):
        parser.feed(PINGREQ_BYTES)


def test_protocol_error_attributes() -> None:
    err = ProtocolError(RC.BANNED, "go away")
    assert err.reason == 0x8A
    assert err.message == "go away"
    assert "go away" in str(err)


# ---------------------------------------------------------------------------------------------
# Malformed input: exact reason codes
# ---------------------------------------------------------------------------------------------

M = RC.MALFORMED_PACKET
PE = RC.PROTOCOL_ERROR
V4, V5 = MQTT311, MQTT5


def pub5(topic: bytes, prop_raw: bytes, qos: int = 0, pid: int = 1, payload: bytes = b"") -> bytes:
    body = s(topic) + (u16(pid) if qos else b"") + props(prop_raw) + payload
    return frame(0x30 | (qos << 1), body)


def sub(version: int, entries: list[tuple[bytes, int]], pid: int = 1, prop_raw: bytes = b"") -> bytes:
    body = u16(pid) + (props(prop_raw) if version == MQTT5 else b"")
    for topic, opt in entries:
        body += s(topic) + bytes((opt,))
    return frame(0x82, body)


def conn5(prop_raw: bytes = b"", flags: int = 0x02, tail: bytes = b"") -> bytes:
    return frame(0x10, connect_body(level=5, flags=flags, v5props=prop_raw, tail=tail))


MALFORMED: list[tuple[str, int, bytes, int]] = [
    # fixed header
    ("type 0", V4, b"\x00\x00", M),
    ("pingreq flags", V4, b"\xc1\x00", M),
    ("puback flags", V4, b"\x41\x02\x00\x01", M),
    ("pubrel flags 0", V4, b"\x60\x02\x00\x01", M),
    ("subscribe flags 0", V4, b"\x80\x06\x00\x01\x00\x01a\x00", M),
    ("unsubscribe flags 0", V4, b"\xa0\x05\x00\x01\x00\x01a", M),
    ("connect flags", 0, b"\x11" + frame(0x10, connect_body())[1:], M),
    ("auth in v3.1.1", V4, b"\xf0\x00", M),
    ("auth flags", V5, b"\xf1\x00", M),
    ("remaining length 5 bytes", V4, b"\x30\xff\xff\xff\xff\x01", M),
    ("remaining length 5 bytes, partial", V4, b"\x30\x80\x80\x80\x80", M),
    # body length
    ("pingreq trailing", V4, b"\xc0\x01\x00", M),
    ("pingresp trailing", V4, b"\xd0\x01\x00", M),
    ("puback v3 trailing", V4, b"\x40\x03\x00\x01\x00", M),
    ("puback short", V4, b"\x40\x01\x00", M),
    ("unsuback v3 trailing", V4, b"\xb0\x03\x00\x01\x00", M),
    ("disconnect v3 trailing", V4, b"\xe0\x01\x00", M),
    ("connack v3 trailing", V4, b"\x20\x03\x00\x00\x00", M),
    ("connack reserved flags", V4, b"\x20\x02\x02\x00", M),
    ("connack v3 bad return code", V4, b"\x20\x02\x00\x06", M),
    ("suback v3 bad return code", V4, b"\x90\x03\x00\x01\x03", M),
    ("string past end", V4, b"\x30\x04\x00\x0aab", M),
    ("publish no topic length", V4, b"\x30\x01\x00", M),
    ("publish qos1 missing pid", V4, b"\x32\x03\x00\x01a", M),
    ("publish v5 missing props", V5, b"\x30\x03\x00\x01a", M),
    # PUBLISH
    ("publish qos 3", V4, b"\x36\x05\x00\x01a\x00\x01", M),
    ("publish dup qos0", V4, b"\x38\x03\x00\x01a", M),
    ("publish pid 0", V4, b"\x32\x05\x00\x01a\x00\x00", M),
    ("publish pid 0 v5", V5, pub5(b"a", b"", qos=2, pid=0), M),
    ("publish + topic", V4, b"\x30\x05\x00\x03a/+", RC.TOPIC_NAME_INVALID),
    ("publish # topic", V5, pub5(b"a/#", b""), RC.TOPIC_NAME_INVALID),
    ("publish empty topic v3", V4, b"\x30\x02\x00\x00", M),
    ("publish empty topic v5 no alias", V5, pub5(b"", b""), PE),
    ("publish topic alias 0", V5, pub5(b"a", b"\x23\x00\x00"), RC.TOPIC_ALIAS_INVALID),
    ("publish invalid utf8", V4, b"\x30\x03\x00\x01\xff", M),
    ("publish surrogate", V4, b"\x30\x05\x00\x03\xed\xa0\x80", M),
    ("publish overlong utf8", V4, b"\x30\x04\x00\x02\xc0\xaf", M),
    ("publish NUL", V4, b"\x30\x05\x00\x03a\x00b", M),
    # CONNECT
    ("connect level 6", 0, frame(0x10, connect_body(level=6)), RC.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect MQTT level 3", 0, frame(0x10, connect_body(level=3)), RC.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect MQIsdp level 4", 0, frame(0x10, connect_body(b"MQIsdp", 4)), RC.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect unknown name", 0, frame(0x10, connect_body(b"MQTX", 4)), RC.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect reserved flag", 0, frame(0x10, connect_body(flags=0x03)), M),
    ("connect will qos 3", 0, frame(0x10, connect_body(flags=0x1E, tail=s("w") + s("x"))), M),
    ("connect will qos w/o flag", 0, frame(0x10, connect_body(flags=0x0A)), M),
    ("connect will retain w/o flag", 0, frame(0x10, connect_body(flags=0x22)), M),
    ("connect password w/o user v4", 0, frame(0x10, connect_body(flags=0x42, tail=s("p"))), M),
    ("connect password w/o user v3", 0, frame(0x10, connect_body(b"MQIsdp", 3, 0x42, tail=s("p"))), M),
    ("connect missing password", 0, frame(0x10, connect_body(flags=0xC2, tail=s("u"))), M),
    ("connect trailing", 0, frame(0x10, connect_body(tail=b"\x00")), M),
    ("connect client id NUL", 0, frame(0x10, connect_body(client_id="a\x00")), M),
    ("connect will topic wildcard", 0, frame(0x10, connect_body(flags=0x06, tail=s("w/#") + s("x"))), 0x90),
    ("connect truncated", 0, frame(0x10, s("MQTT") + b"\x04\x02"), M),
    ("connect v5 missing props", 0, frame(0x10, connect_body(level=5)), M),
    # not CONNECT first
    ("first packet not connect", 0, PINGREQ_BYTES, PE),
    ("first packet publish", 0, b"\x30\x03\x00\x01a", PE),
    # SUBSCRIBE
    ("subscribe no filters v4", V4, sub(V4, []), PE),
    ("subscribe no filters v5", V5, sub(V5, []), PE),
    ("subscribe qos 3", V4, sub(V4, [(b"a", 3)]), M),
    ("subscribe v3 reserved bits", V4, sub(V4, [(b"a", 0x04)]), M),
    ("subscribe v3 high bits", V4, sub(V4, [(b"a", 0x80)]), M),
    ("subscribe v5 reserved bits", V5, sub(V5, [(b"a", 0x40)]), M),
    ("subscribe v5 retain handling 3", V5, sub(V5, [(b"a", 0x30)]), M),
    ("subscribe pid 0", V4, sub(V4, [(b"a", 0)], pid=0), M),
    ("subscribe missing options", V4, frame(0x82, u16(1) + s("a")), M),
    ("subscribe v5 sub id twice", V5, sub(V5, [(b"a", 0)], prop_raw=b"\x0b\x01\x0b\x02"), PE),
    ("subscribe v5 sub id 0", V5, sub(V5, [(b"a", 0)], prop_raw=b"\x0b\x00"), PE),
    # UNSUBSCRIBE
    ("unsubscribe no filters", V4, frame(0xA2, u16(1)), PE),
    ("unsubscribe no filters v5", V5, frame(0xA2, u16(1) + b"\x00"), PE),
    ("unsubscribe pid 0", V4, frame(0xA2, u16(0) + s("a")), M),
    ("unsubscribe string past end", V4, frame(0xA2, u16(1) + b"\x00\x05ab"), M),
    # acks
    ("puback pid 0", V4, b"\x40\x02\x00\x00", M),
    ("pubrel pid 0 v5", V5, b"\x62\x03\x00\x00\x00", M),
    ("suback pid 0", V4, b"\x90\x03\x00\x00\x00", M),
    ("puback v5 bad prop", V5, frame(0x40, u16(1) + b"\x00" + props(b"\x23\x00\x01")), PE),
    ("puback v5 trailing after props", V5, frame(0x40, u16(1) + b"\x00" + props(b"") + b"\x00"), M),
    ("suback v5 missing props", V5, b"\x90\x02\x00\x01", M),
    ("unsuback v5 missing props", V5, b"\xb0\x02\x00\x01", M),
    # properties
    ("unknown property", V5, pub5(b"a", b"\x05\x00"), M),
    ("property id >= 0x80", V5, pub5(b"a", b"\x81\x01\x00"), M),
    ("property not allowed", V5, pub5(b"a", b"\x11\x00\x00\x00\x01"), PE),
    ("duplicate property", V5, pub5(b"a", b"\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02"), PE),
    ("duplicate string property", V5, pub5(b"a", b"\x03\x00\x01x\x03\x00\x01y"), PE),
    ("publish sub id 0", V5, pub5(b"a", b"\x0b\x00"), PE),
    ("payload format 2", V5, pub5(b"a", b"\x01\x02"), PE),
    ("receive maximum 0", 0, conn5(b"\x21\x00\x00"), PE),
    ("maximum packet size 0", 0, conn5(b"\x27\x00\x00\x00\x00"), PE),
    ("request problem info 2", 0, conn5(b"\x17\x02"), PE),
    ("request response info 2", 0, conn5(b"\x19\x02"), PE),
    ("maximum qos 2 in connack", V5, frame(0x20, b"\x00\x00" + props(b"\x24\x02")), PE),
    ("will property in connect props", 0, conn5(b"\x18\x00\x00\x00\x01"), PE),
    (
        "connect prop in will props",
        0,
        conn5(flags=0x06, tail=props(b"\x11\x00\x00\x00\x01") + s("w") + s("x")),
        PE,
    ),
    ("property length past packet", V5, frame(0x30, s("a") + b"\x0a\x01\x01"), M),
    ("property value past block", V5, frame(0x30, s("a") + b"\x02\x02\x00\x00\x00\x00\x00"), M),
    ("property string past block", V5, frame(0x30, s("a") + b"\x03\x03\x00\x05ab"), M),
    ("property bad utf8", V5, pub5(b"a", b"\x03\x00\x01\xff"), M),
    ("user property NUL", V5, pub5(b"a", b"\x26\x00\x01\x00\x00\x01v"), M),
    ("property varint too long", V5, pub5(b"a", b"\x0b\xff\xff\xff\xff\x01"), M),
    ("property length varint truncated", V5, frame(0x30, s("a") + b"\x80"), M),
    ("disconnect v5 bad prop", V5, frame(0xE0, b"\x00" + props(b"\x23\x00\x01")), PE),
    ("auth v5 bad prop", V5, frame(0xF0, b"\x18" + props(b"\x11\x00\x00\x00\x01")), PE),
]


@pytest.mark.parametrize(
    ("version", "data", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed(version: int, data: bytes, reason: int) -> None:
    expect_error(data, version, reason)


@pytest.mark.parametrize(
    ("version", "data", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_byte_at_a_time(version: int, data: bytes, reason: int) -> None:
    parser = Parser(version=version)
    with pytest.raises(ProtocolError) as info:
        for i in range(len(data)):
            parser.feed(data[i : i + 1])
    assert info.value.reason == reason


def test_valid_edge_cases() -> None:
    # empty topic + topic alias (v5) is fine; alias resolution is the channel's job
    assert decode_one(pub5(b"", b"\x23\x00\x01"), V5) == Publish("", b"", properties={Prop.TOPIC_ALIAS: 1})
    # subscription identifier may repeat in PUBLISH; user properties may repeat anywhere
    got = decode_one(pub5(b"a", b"\x0b\x01\x0b\x02\x26\x00\x01k\x00\x01v\x26\x00\x01k\x00\x01v"), V5)
    assert got == Publish(
        "a", properties={Prop.SUBSCRIPTION_IDENTIFIER: [1, 2], Prop.USER_PROPERTY: [("k", "v")] * 2}
    )
    # password without user name is legal in v5
    got = decode_one(conn5(flags=0x42, tail=s("pw")), 0)
    assert isinstance(got, Connect) and got.password == b"pw" and got.username is None
    # subscription identifier is a plain int in SUBSCRIBE
    got = decode_one(sub(V5, [(b"a", 0)], prop_raw=b"\x0b\x05"), V5)
    assert got == Subscribe(1, [("a", SubOpts())], {Prop.SUBSCRIPTION_IDENTIFIER: 5})
    # filters are not syntax-checked by the codec
    got = decode_one(sub(V4, [(b"a/#/b", 1), (b"", 0)]), V4)
    assert got == Subscribe(1, [("a/#/b", SubOpts(1)), ("", SubOpts(0))])
    # v5 acks with reason code but no property length, and DISCONNECT with reason only
    assert decode_one(b"\x50\x03\x00\x09\x80", V5) == Pubrec(9, 0x80)
    assert decode_one(b"\xe0\x01\x8e", V5) == Disconnect(RC.SESSION_TAKEN_OVER)
    # v3.1 CONNACK
    assert decode_one(b"\x20\x02\x00\x02", MQTT31) == Connack(False, 2)
    # non-BMP and multi-byte UTF-8 survive
    assert decode_one(b"\x30\x06\x00\x04\xf0\x9d\x84\x9e", V4) == Publish("𝄞")
