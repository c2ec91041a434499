"""Property-based tests for the MQTT codec: robustness against arbitrary input and round trips."""

from __future__ import annotations

import itertools
from typing import Any

from fleetmq.broker.codec import (
    MQTT5,
    MQTT31,
    MQTT311,
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
    encode_varint,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.codec_support import ALLOWED, WILL, roundtrip

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at `cuts` (in order; those past its end left out)."""
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def feed_all(version: int, data: bytes, cuts: list[int] | None = None) -> list[Packet]:
    """Feed `data` (whole, or in pieces cut at `cuts`); only ProtocolError may escape."""
    parser = Parser(version=version)
    out: list[Packet] = []
    try:
        for piece in [data] if cuts is None else pieces(data, cuts):
            out += parser.feed(piece)
    except ProtocolError as exc:
        assert 0x80 <= exc.reason <= 0xA2
    return out


# ---------------------------------------------------------------------------------------------
# (1) arbitrary bytes
# ---------------------------------------------------------------------------------------------

versions = st.sampled_from([0, MQTT31, MQTT311, MQTT5])

# Arbitrary bytes rarely get past the fixed header; also frame random bodies behind a plausible
# first byte with a correct remaining length so the body decoders get exercised.
first_bytes = st.integers(0, 255) | st.sampled_from(
    [
        0x10,
        0x20,
        0x30,
        0x32,
        0x34,
        0x3B,
        0x40,
        0x50,
        0x62,
        0x70,
        0x82,
        0x90,
        0xA2,
        0xB0,
        0xC0,
        0xD0,
        0xE0,
        0xF0,
    ]
)


@st.composite
def framed_garbage(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        body = draw(st.binary(max_size=200))
        parts.append(bytes((draw(first_bytes),)) + encode_varint(len(body)) + body)
    return b"".join(parts)


garbage = st.binary(max_size=600) | framed_garbage()


@FUZZ
@given(version=versions, data=garbage)
def test_arbitrary_bytes_whole(version: int, data: bytes) -> None:
    feed_all(version, data)


@FUZZ
@given(version=versions, data=garbage, cuts=st.lists(st.integers(0, 600), max_size=8))
def test_arbitrary_bytes_chunked(version: int, data: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(data)]
    whole = Parser(version=version)
    try:
        expected: list[Packet] | None = whole.feed(data)
    except ProtocolError:
        expected = None
    got = feed_all(version, data, cuts)
    if expected is not None:
        assert got == expected  # chunking never changes what a valid stream decodes to


# ---------------------------------------------------------------------------------------------
# (2) valid packets round-trip
# ---------------------------------------------------------------------------------------------

_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
text = st.text(_chars, max_size=12)
topic_names = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00+#"), min_size=1, max_size=30
)
blob = st.binary(max_size=64)
u8 = st.integers(0, 255)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
pid = st.integers(1, 0xFFFF)
bit = st.integers(0, 1)
varint = st.integers(1, 268_435_455)
user_props = st.lists(st.tuples(text, text), min_size=1, max_size=3)

PROP_VALUES: dict[int, st.SearchStrategy[Any]] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: bit,
    Prop.MESSAGE_EXPIRY_INTERVAL: u32,
    Prop.CONTENT_TYPE: text,
    Prop.RESPONSE_TOPIC: topic_names,
    Prop.CORRELATION_DATA: blob,
    Prop.SUBSCRIPTION_IDENTIFIER: varint,
    Prop.SESSION_EXPIRY_INTERVAL: u32,
    Prop.ASSIGNED_CLIENT_IDENTIFIER: text,
    Prop.SERVER_KEEP_ALIVE: u16,
    Prop.AUTHENTICATION_METHOD: text,
    Prop.AUTHENTICATION_DATA: blob,
    Prop.REQUEST_PROBLEM_INFORMATION: bit,
    Prop.WILL_DELAY_INTERVAL: u32,
    Prop.REQUEST_RESPONSE_INFORMATION: bit,
    Prop.RESPONSE_INFORMATION: text,
    Prop.SERVER_REFERENCE: text,
    Prop.REASON_STRING: text,
    Prop.RECEIVE_MAXIMUM: st.integers(1, 0xFFFF),
    Prop.TOPIC_ALIAS_MAXIMUM: u16,
    Prop.TOPIC_ALIAS: st.integers(1, 0xFFFF),
    Prop.MAXIMUM_QOS: bit,
    Prop.RETAIN_AVAILABLE: bit,
    Prop.USER_PROPERTY: user_props,
    Prop.MAXIMUM_PACKET_SIZE: st.integers(1, 0xFFFFFFFF),
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: bit,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: bit,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: bit,
}


def props_for(*pids: int) -> st.SearchStrategy[dict[int, Any]]:
    return st.fixed_dictionaries({}, optional={int(p): PROP_VALUES[p] for p in pids})


def props_of(ctx: object) -> st.SearchStrategy[dict[int, Any]]:
    """Any of the properties the spec allows in `ctx` (a packet type, or WILL), with values."""
    return props_for(*ALLOWED[ctx])


P = Prop
WILL_PROPS = props_of(WILL)
CONNECT_PROPS = props_of(PacketType.CONNECT)
CONNACK_PROPS = props_of(PacketType.CONNACK)
ACK_PROPS = props_of(PacketType.PUBACK)  # the same for every ack, SUBACK and UNSUBACK too
DISCONNECT_PROPS = props_of(PacketType.DISCONNECT)
AUTH_PROPS = props_of(PacketType.AUTH)


@st.composite
def publish_props(draw: st.DrawFn) -> dict[int, Any]:
    # subscription identifiers apart: in a PUBLISH they are a list (they may repeat)
    pr = draw(props_for(*(p for p in ALLOWED[PacketType.PUBLISH] if p != P.SUBSCRIPTION_IDENTIFIER)))
    ids = draw(st.lists(varint, max_size=3))
    if ids:
        pr[int(P.SUBSCRIPTION_IDENTIFIER)] = ids
    return pr


def reason() -> st.SearchStrategy[int]:
    return u8


def connects(version: int) -> st.SearchStrategy[Connect]:
    v5 = version == MQTT5

    def pr(strategy: st.SearchStrategy[dict[int, Any]]) -> st.SearchStrategy[dict[int, Any]]:
        return strategy if v5 else st.just({})

    wills = st.builds(Will, topic_names, blob, st.integers(0, 2), st.booleans(), pr(WILL_PROPS))

    @st.composite
    def connect(draw: st.DrawFn) -> Connect:
        username = draw(st.none() | text)
        # v3.x forbids a password without a user name
        password = draw(st.none() | blob) if v5 or username is not None else None
        return Connect(
            draw(text),
            version,
            draw(st.booleans()),
            draw(u16),
            draw(st.none() | wills),
            username,
            password,
            draw(pr(CONNECT_PROPS)),
        )

    return connect()


def packets(version: int) -> st.SearchStrategy[Packet]:
    v5 = version == MQTT5

    def pr(strategy: st.SearchStrategy[dict[int, Any]]) -> st.SearchStrategy[dict[int, Any]]:
        return strategy if v5 else st.just({})

    @st.composite
    def publish(draw: st.DrawFn) -> Publish:
        qos = draw(st.integers(0, 2))
        properties = draw(pr(publish_props()))
        topic = draw(topic_names | st.just("")) if int(P.TOPIC_ALIAS) in properties else draw(topic_names)
        return Publish(
            topic,
            draw(st.binary(max_size=100)),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(pid) if qos else 0,
            properties,
        )

    connect = connects(version)
    acks = [
        st.builds(cls, pid, reason() if v5 else st.just(0), pr(ACK_PROPS))
        for cls in (Puback, Pubrec, Pubrel, Pubcomp)
    ]
    opts = (
        st.builds(SubOpts, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2))
        if v5
        else st.builds(SubOpts, st.integers(0, 2))
    )
    v3_codes = st.sampled_from([0, 1, 2, 0x80])
    strategies: list[st.SearchStrategy[Any]] = [
        connect,
        st.builds(Connack, st.booleans(), reason() if v5 else st.integers(0, 5), pr(CONNACK_PROPS)),
        publish(),
        *acks,
        st.builds(
            Subscribe,
            pid,
            st.lists(st.tuples(text, opts), min_size=1, max_size=4),
            pr(props_of(PacketType.SUBSCRIBE)),
        ),
        st.builds(
            Suback,
            pid,
            st.lists(reason() if v5 else v3_codes, min_size=1, max_size=5),
            pr(ACK_PROPS),
        ),
        st.builds(
            Unsubscribe, pid, st.lists(text, min_size=1, max_size=4), pr(props_of(PacketType.UNSUBSCRIBE))
        ),
        st.builds(Unsuback, pid, st.lists(reason(), max_size=4) if v5 else st.just([]), pr(ACK_PROPS)),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(Disconnect, reason() if v5 else st.just(0), pr(DISCONNECT_PROPS)),
    ]
    if v5:
        strategies.append(st.builds(Auth, reason(), AUTH_PROPS))
    return st.one_of(strategies)


def roundtrip_stream(version: int, pkts: list[Packet], cuts: list[int]) -> None:
    data = b"".join(encode(p, version) for p in pkts)
    parser = Parser(version=version)
    assert parser.feed(data) == pkts
    chunked = Parser(version=version)
    assert [p for piece in pieces(data, cuts) for p in chunked.feed(piece)] == pkts


cut_lists = st.lists(st.integers(0, 2000), max_size=6)


@FUZZ
@given(pkts=st.lists(packets(MQTT311), min_size=1, max_size=5), cuts=cut_lists)
def test_roundtrip_v311(pkts: list[Packet], cuts: list[int]) -> None:
    roundtrip_stream(MQTT311, pkts, cuts)


@FUZZ
@given(pkts=st.lists(packets(MQTT5), min_size=1, max_size=5), cuts=cut_lists)
def test_roundtrip_v5(pkts: list[Packet], cuts: list[int]) -> None:
    roundtrip_stream(MQTT5, pkts, cuts)


@FEW
@given(pkt=packets(MQTT311))
def test_roundtrip_v31(pkt: Packet) -> None:
    if isinstance(pkt, Connect):
        pkt.proto_level, pkt.proto_name = MQTT31, "MQIsdp"
    if isinstance(pkt, Connack):
        pkt.session_present = False  # v3.1 has no session-present flag
    assert Parser(version=MQTT31).feed(encode(pkt, MQTT31)) == [pkt]


@FEW
@given(version=st.sampled_from([MQTT311, MQTT5]), data=st.data())
def test_connect_first_sets_version(version: int, data: st.DataObject) -> None:
    pkt = data.draw(connects(version))
    assert roundtrip(pkt, version) == pkt  # by a parser that learns the version from the CONNECT


# ---------------------------------------------------------------------------------------------
# (3) mutated valid encodings
# ---------------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, bytes]:
    version = draw(st.sampled_from([MQTT311, MQTT5]))
    pkts = draw(st.lists(packets(version), min_size=1, max_size=2))
    data = bytearray(b"".join(encode(p, version) for p in pkts))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(u8)
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 4))]
        else:
            del data[i:]
    return version, bytes(data)


@FEW
@given(case=mutated(), parser_version=st.sampled_from([None, 0]), cuts=cut_lists)
def test_mutated_encodings(case: tuple[int, bytes], parser_version: int | None, cuts: list[int]) -> None:
    version, data = case
    pv = version if parser_version is None else parser_version
    feed_all(pv, data)
    feed_all(pv, data, [c for c in cuts if c <= len(data)])
