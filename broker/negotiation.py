"""CONNECT negotiation: a pure function of a CONNECT packet and its zone's settings.

It decides everything the packet and the settings alone decide: the client id (assigned when the client
sent none and may get one), the keep alive in force, the session expiry granted, the limits announced in
a v5 CONNACK, the will as a message. What needs more than that (credentials, connection limits, the
will's authorization, the session in the store) is the channel manager's, after this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .codec import MQTT5, MQTT31, RC, Connect, Prop
from .keepalive import KeepAlive, effective_keepalive, shared_keepalive
from .message import Message
from .topic import valid_topic
from .zones import ZoneSettings

NEVER_EXPIRE = 0xFFFFFFFF

# v3 CONNACK return codes for the v5 reasons a CONNECT can be refused with.
V3_CONNACK: dict[int, int] = {
    RC.UNSUPPORTED_PROTOCOL_VERSION: 1,
    RC.CLIENT_IDENTIFIER_NOT_VALID: 2,
    RC.SERVER_UNAVAILABLE: 3,
    RC.SERVER_BUSY: 3,
    RC.QUOTA_EXCEEDED: 3,
    RC.BAD_USER_NAME_OR_PASSWORD: 4,
    RC.NOT_AUTHORIZED: 5,
    RC.BANNED: 5,
}


@dataclass(slots=True, frozen=True)
class Refusal:
    """A CONNECT (or PUBLISH) turned down: the v5 reason code, the name counted in metrics and logs, and an
    optional reason string for the client."""

    reason: int
    why: str
    reason_string: str | None = None


@dataclass(slots=True)
class Negotiated:
    """An accepted CONNECT: what the session is opened with and the CONNACK says."""

    client_id: str
    version: int
    clean_start: bool
    expiry: float  # granted session expiry (seconds; NEVER_EXPIRE for v3 persistent before the zone cap)
    receive_maximum: int  # the client's (MQTT 5), 0 = not announced
    keepalive: KeepAlive
    username: str | None
    password: bytes | None
    will: Message | None
    will_delay: float
    client_max_packet: int  # the client's Maximum Packet Size (0 = none)
    client_alias_max: int  # the client's Topic Alias Maximum
    retry: bool  # resend unacknowledged deliveries on a timer (v3; v5 only if the zone opts in)
    connack_props: dict[int, Any] = field(default_factory=dict)
    certified: bool = False  # the username comes from a verified client certificate: no password check


#: The listener name of the broker's own in-process connections (a bridge's session, bridge.link), the only
#: ones whose client ids may start with '$'.
INTERNAL = "$internal"


def negotiate(
    p: Connect,
    zone: ZoneSettings,
    new_client_id: Callable[[], str],
    now: float,
    internal: bool = False,
    cert_name: str | None = None,
) -> Negotiated | Refusal:
    """Accept or refuse a CONNECT received at wall-clock time `now` (its will's timestamp). `cert_name`:
    the common name of the client's verified certificate on a listener with peer_cert_as_username; the
    client is then that user (the zone's cert_users map it)."""
    version = p.proto_level
    props = p.properties
    client_id = p.client_id
    assigned = False
    if not client_id:
        if version >= MQTT5 or (p.clean_start and version > MQTT31):
            client_id = new_client_id()
            assigned = version >= MQTT5
        else:
            return Refusal(RC.CLIENT_IDENTIFIER_NOT_VALID, "client_id_invalid")
    if len(client_id) > zone.max_clientid_len or (client_id.startswith("$") and not internal):
        # ('$' ids are the broker's own sessions, such as a bridge's "$bridge:<name>")
        return Refusal(RC.CLIENT_IDENTIFIER_NOT_VALID, "client_id_invalid")
    if props.get(Prop.AUTHENTICATION_METHOD) is not None:
        return Refusal(RC.BAD_AUTHENTICATION_METHOD, "bad_authentication_method")
    username, password = p.username, p.password
    if cert_name is not None:
        username, password = zone.cert_users.get(cert_name, cert_name), None
    if username is None and not zone.allow_anonymous:
        return Refusal(RC.NOT_AUTHORIZED, "not_authorized")
    will = None
    will_delay = 0.0
    if p.will is not None:
        if not valid_topic(p.will.topic):
            return Refusal(RC.TOPIC_NAME_INVALID, "will_topic_invalid")
        w = p.will
        will = Message.from_publish(w.topic, w.payload, w.qos, w.retain, w.properties, client_id, now)
        will_delay = float(w.properties.get(Prop.WILL_DELAY_INTERVAL, 0))
    if version >= MQTT5:
        requested = props.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
        client_max_packet = props.get(Prop.MAXIMUM_PACKET_SIZE, 0)
        client_alias_max = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0)
        receive_max = props.get(Prop.RECEIVE_MAXIMUM, 65535)
        retry = zone.retry_v5
    else:
        requested = 0 if p.clean_start else NEVER_EXPIRE
        client_max_packet = client_alias_max = receive_max = 0
        retry = True
    expiry = requested
    if requested and zone.session_expiry_interval < requested:
        expiry = int(zone.session_expiry_interval)
    ka, overridden = effective_keepalive(p.keepalive, zone.server_keepalive)
    connack_props: dict[int, Any] = {}
    if version >= MQTT5:
        if assigned:
            connack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        if overridden:
            connack_props[Prop.SERVER_KEEP_ALIVE] = ka
        if expiry != requested:
            connack_props[Prop.SESSION_EXPIRY_INTERVAL] = expiry
        if zone.receive_maximum != 65535:
            connack_props[Prop.RECEIVE_MAXIMUM] = zone.receive_maximum
        connack_props[Prop.MAXIMUM_PACKET_SIZE] = zone.max_packet_size
        if zone.max_topic_alias:
            connack_props[Prop.TOPIC_ALIAS_MAXIMUM] = zone.max_topic_alias
    return Negotiated(
        client_id=client_id,
        version=version,
        clean_start=p.clean_start,
        expiry=float(expiry) if expiry else 0.0,  # (0.0: the constant, not a float per session)
        receive_maximum=receive_max,
        keepalive=shared_keepalive(ka, zone.keepalive_backoff),
        username=username,
        password=password,
        will=will,
        will_delay=will_delay,
        client_max_packet=client_max_packet,
        client_alias_max=client_alias_max,
        retry=retry,
        connack_props=connack_props,
        certified=cert_name is not None,
    )
