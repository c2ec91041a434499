"""MQTT over WebSocket: ws and wss listeners with real paho clients (websockets transport), and the
handshake rules checked with a raw WebSocket client (path, `mqtt` subprotocol, binary frames only)."""

from __future__ import annotations

import queue
import socket
import ssl
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    RejectConnection,
    Request,
)

from . import mqttraw
from .harness import HOST, MOSQUITTO, uid

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


def ws_broker(start_broker, pki=None, **ws):
    listeners = [
        {"name": "mqtt", "zone": "default", "bind": f"{HOST}:0", "protocol": "tcp"},
        {"name": "ws", "zone": "default", "bind": f"{HOST}:0", "protocol": "ws", "path": "/mqtt", **ws},
    ]
    if pki is not None:
        cert, key = pki["server"]
        listeners.append({"name": "wss", "zone": "default", "bind": f"{HOST}:0", "protocol": "wss",
                          "path": "/mqtt", "certfile": cert, "keyfile": key})  # fmt: skip
    return start_broker({"listeners": listeners})


def paho_ws(port: int, version: int, *, path: str = "/mqtt", ca: str | None = None):
    got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=uid("ws"), protocol=version, transport="websockets"
    )
    c.ws_set_options(path=path)
    if ca is not None:
        c.tls_set(ca_certs=ca, tls_version=ssl.PROTOCOL_TLS_CLIENT)
    connected: queue.Queue[int] = queue.Queue()
    c.on_connect = lambda _c, _u, _f, rc, _p: connected.put(rc.value)
    c.on_message = lambda _c, _u, m: got.put(m)
    c.connect(HOST, port)
    c.loop_start()
    assert connected.get(timeout=5) == 0
    return c, got


def round_trip(c, got, topic: str, payload: bytes) -> None:
    c.publish(topic, payload, qos=1).wait_for_publish(5)
    m = got.get(timeout=10)
    assert (m.topic, m.payload, m.qos) == (topic, payload, 1)


@pytest.mark.parametrize("version", [mqtt.MQTTv31, mqtt.MQTTv311, mqtt.MQTTv5])
def test_ws_round_trip_and_bridging_to_tcp(start_broker, raw_clients, version):
    bp = ws_broker(start_broker)
    c, got = paho_ws(bp.ports["ws"], version)
    try:
        topic = uid("ws/")
        c.subscribe(topic, 1)
        time.sleep(0.3)
        round_trip(c, got, topic, b"over websocket")
        round_trip(c, got, topic, bytes(range(256)) * 1200)  # ~300 KB: many frames, one MQTT packet
        tcp = raw_clients(bp, 5)  # a tcp publisher reaches the ws subscriber (one broker, two listeners)
        tcp.connect(uid("tcp"))
        tcp.publish(topic, b"from tcp", qos=1)
        assert got.get(timeout=5).payload == b"from tcp"
    finally:
        c.disconnect()
        c.loop_stop()


def test_wss_round_trip(start_broker, pki):
    bp = ws_broker(start_broker, pki)
    c, got = paho_ws(bp.ports["wss"], mqtt.MQTTv5, ca=pki["ca"])
    try:
        topic = uid("wss/")
        c.subscribe(topic, 1)
        time.sleep(0.3)
        round_trip(c, got, topic, b"over tls websocket")
    finally:
        c.disconnect()
        c.loop_stop()


class RawWs:
    """A WebSocket client on wsproto, to send what paho never would."""

    def __init__(self, port: int, path: str = "/mqtt", subprotocols=("mqtt",)) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=5)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=HOST, target=path, subprotocols=list(subprotocols))))

    def events(self, until, timeout: float = 5.0) -> list:
        seen: list = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            self.ws.receive_data(data or None)
            seen.extend(self.ws.events())
            if not data or any(isinstance(e, until) for e in seen):
                break
        return seen

    def send(self, event) -> None:
        self.sock.sendall(self.ws.send(event))


def test_ws_handshake_needs_path_and_mqtt_subprotocol(start_broker):
    bp = ws_broker(start_broker)
    port = bp.ports["ws"]
    for path, protocols, status in (("/other", ("mqtt",), 404), ("/mqtt", ("chat",), 400)):
        events = RawWs(port, path, protocols).events(RejectConnection)
        assert [e.status_code for e in events if isinstance(e, RejectConnection)] == [status], (
            path,
            protocols,
        )
    with socket.create_connection((HOST, port), timeout=5) as s:  # plain HTTP, no upgrade
        s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert bp.metric("fleetmq_disconnects_total", reason="bad_websocket") >= 3
    accepted = RawWs(port, "/mqtt?token=1", ("mqttv3.1", "mqtt")).events(AcceptConnection)
    assert [e.subprotocol for e in accepted if isinstance(e, AcceptConnection)] == ["mqttv3.1"]


def test_ws_ping_text_frames_and_close(start_broker):
    bp = ws_broker(start_broker)
    c = RawWs(bp.ports["ws"])
    assert any(isinstance(e, AcceptConnection) for e in c.events(AcceptConnection))
    connect = mqttraw.connect(uid("raw"))
    c.send(Message(data=connect[:5]))  # one CONNECT split over two frames
    c.send(Message(data=connect[5:]))
    data = b"".join(bytes(e.data) for e in c.events(BytesMessage) if isinstance(e, BytesMessage))
    assert data == b"\x20\x02\x00\x00"  # CONNACK, accepted
    c.send(Ping(payload=b"hi"))
    assert [e.payload for e in c.events(Pong) if isinstance(e, Pong)] == [b"hi"]
    c.send(Message(data="text is not MQTT"))
    closes = [e for e in c.events(CloseConnection) if isinstance(e, CloseConnection)]
    assert [e.code for e in closes] == [1003]
