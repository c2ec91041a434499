"""What the codec tests share: the spec's table of where each MQTT 5 property may appear (written out
independently of the codec's own table), and an encode-decode round trip."""

from __future__ import annotations

from fleetmq.broker.codec import Connect, Packet, PacketType, Parser, Prop, encode

#: ALLOWED's key for a will's properties (they stand in the CONNECT, apart from the CONNECT's own)
WILL = "will"

P = Prop
#: MQTT 5 section 2.2.2.2: the properties each packet type (and a will) may carry
ALLOWED: dict[object, list[int]] = {
    PacketType.CONNECT: [
        P.SESSION_EXPIRY_INTERVAL,
        P.AUTHENTICATION_METHOD,
        P.AUTHENTICATION_DATA,
        P.REQUEST_PROBLEM_INFORMATION,
        P.REQUEST_RESPONSE_INFORMATION,
        P.RECEIVE_MAXIMUM,
        P.TOPIC_ALIAS_MAXIMUM,
        P.USER_PROPERTY,
        P.MAXIMUM_PACKET_SIZE,
    ],
    WILL: [
        P.PAYLOAD_FORMAT_INDICATOR,
        P.MESSAGE_EXPIRY_INTERVAL,
        P.CONTENT_TYPE,
        P.RESPONSE_TOPIC,
        P.CORRELATION_DATA,
        P.WILL_DELAY_INTERVAL,
        P.USER_PROPERTY,
    ],
    PacketType.CONNACK: [
        P.SESSION_EXPIRY_INTERVAL,
        P.ASSIGNED_CLIENT_IDENTIFIER,
        P.SERVER_KEEP_ALIVE,
        P.AUTHENTICATION_METHOD,
        P.AUTHENTICATION_DATA,
        P.RESPONSE_INFORMATION,
        P.SERVER_REFERENCE,
        P.REASON_STRING,
        P.RECEIVE_MAXIMUM,
        P.TOPIC_ALIAS_MAXIMUM,
        P.MAXIMUM_QOS,
        P.RETAIN_AVAILABLE,
        P.USER_PROPERTY,
        P.MAXIMUM_PACKET_SIZE,
        P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        P.SHARED_SUBSCRIPTION_AVAILABLE,
    ],
    PacketType.PUBLISH: [
        P.PAYLOAD_FORMAT_INDICATOR,
        P.MESSAGE_EXPIRY_INTERVAL,
        P.CONTENT_TYPE,
        P.RESPONSE_TOPIC,
        P.CORRELATION_DATA,
        P.SUBSCRIPTION_IDENTIFIER,
        P.TOPIC_ALIAS,
        P.USER_PROPERTY,
    ],
    PacketType.PUBACK: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.PUBREC: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.PUBREL: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.PUBCOMP: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.SUBSCRIBE: [P.SUBSCRIPTION_IDENTIFIER, P.USER_PROPERTY],
    PacketType.SUBACK: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.UNSUBSCRIBE: [P.USER_PROPERTY],
    PacketType.UNSUBACK: [P.REASON_STRING, P.USER_PROPERTY],
    PacketType.DISCONNECT: [P.SESSION_EXPIRY_INTERVAL, P.SERVER_REFERENCE, P.REASON_STRING, P.USER_PROPERTY],
    PacketType.AUTH: [P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA, P.REASON_STRING, P.USER_PROPERTY],
}


def roundtrip(pkt: Packet, version: int) -> Packet:
    """`pkt` encoded for `version` and decoded again: by a parser of that version, or for a CONNECT by one
    that learns the version from it."""
    data = encode(pkt, version)
    parser = Parser(version=0 if isinstance(pkt, Connect) else version)
    out = parser.feed(data)
    assert len(out) == 1
    assert parser.version == version
    return out[0]
