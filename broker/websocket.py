"""MQTT over WebSocket (MQTT 5.0 section 6, RFC 6455), sans-I/O on top of wsproto.

The MQTT byte stream travels in binary frames; frame boundaries mean nothing to MQTT, so payloads are
handed to the channel's parser as they arrive and everything a channel writes in one loop turn leaves as
one frame. The handshake is accepted only at the listener's path and only for the `mqtt` subprotocol
family (what EMQX, mosquitto and every browser client speak).
"""

from __future__ import annotations

from wsproto import WSConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

#: Subprotocols accepted, the first one the client offers wins ("mqttv3.1" is paho's name for MQTT 3.1).
SUBPROTOCOLS = ("mqtt", "mqttv3.1", "mqtt-v3", "mqtt-v3.1.1", "mqtt-v5")

# close codes (RFC 6455 7.4.1)
NORMAL = 1000
UNSUPPORTED_DATA = 1003


class WebSocket:
    """One server-side WebSocket: ``receive`` bytes from the socket, get MQTT bytes and bytes to send."""

    __slots__ = ("_ws", "closed", "error", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._ws = WSConnection(ConnectionType.SERVER)
        self.closed = False  # the socket should be closed once `out` is written
        self.error: str | None = None  # why the peer was refused, for the log and metrics

    @property
    def open(self) -> bool:
        return self._ws.state is ConnectionState.OPEN

    def receive(self, data: bytes | None) -> tuple[bytes, bytes]:
        """Feed socket bytes (None at EOF); returns (MQTT bytes for the parser, bytes for the socket)."""
        mqtt: list[bytes] = []
        out: list[bytes] = []
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                self._handle(event, mqtt, out)
        except RemoteProtocolError as e:
            self.error = f"bad websocket: {e}"
            if isinstance(e.event_hint, RejectConnection) and self._ws.state is ConnectionState.CONNECTING:
                out.append(self._send(RejectConnection(status_code=400, has_body=False)))
            self.closed = True
        if data is None:
            self.closed = True
        return b"".join(mqtt), b"".join(out)

    def _handle(self, event: Event, mqtt: list[bytes], out: list[bytes]) -> None:
        if isinstance(event, BytesMessage):
            mqtt.append(bytes(event.data))
        elif isinstance(event, Request):
            out.append(self._handshake(event))
        elif isinstance(event, Ping):
            out.append(self._send(event.response()))
        elif isinstance(event, CloseConnection):
            out.append(self._send(event.response()))
            self.closed = True
        elif isinstance(event, TextMessage):  # MQTT is binary only [MQTT-6.0.0-1]
            self.error = "text frame (MQTT over WebSocket is binary only)"
            out.append(self.close(UNSUPPORTED_DATA))

    def _handshake(self, request: Request) -> bytes:
        target = request.target.split("?", 1)[0]
        subprotocol = next((p for p in request.subprotocols if p in SUBPROTOCOLS), None)
        if target != self.path:
            self.error = f"websocket path {target!r} is not {self.path!r}"
            status = 404
        elif subprotocol is None:
            self.error = f"websocket subprotocols {request.subprotocols} offer none of {list(SUBPROTOCOLS)}"
            status = 400
        else:
            return self._send(AcceptConnection(subprotocol=subprotocol))
        self.closed = True
        return self._send(RejectConnection(status_code=status, has_body=False))

    def frame(self, data: bytes) -> bytes:
        """MQTT bytes as one binary frame (nothing once the WebSocket is no longer open)."""
        return self._send(Message(data=data)) if self.open else b""

    def close(self, code: int = NORMAL) -> bytes:
        """A close frame, if the handshake got that far; the caller closes the socket after it."""
        self.closed = True
        return self._send(CloseConnection(code=code)) if self.open else b""

    def _send(self, event: Event) -> bytes:
        try:
            return self._ws.send(event)
        except LocalProtocolError:  # the peer closed first: nothing more to say
            return b""


class ClientWebSocket(WebSocket):
    """The client side (a bridge's ws/wss remote): `handshake` first; MQTT bytes go out with `frame`
    once `open`, and `receive` gives what the remote sent."""

    __slots__ = ("host",)

    def __init__(self, host: str, path: str) -> None:
        super().__init__(path)
        self.host = host
        self._ws = WSConnection(ConnectionType.CLIENT)

    def handshake(self) -> bytes:
        return self._send(Request(host=self.host, target=self.path, subprotocols=["mqtt"]))

    def _handle(self, event: Event, mqtt: list[bytes], out: list[bytes]) -> None:
        if isinstance(event, RejectConnection):
            self.error = f"the remote refused the websocket (HTTP {event.status_code})"
            self.closed = True
        elif not isinstance(event, AcceptConnection):
            super()._handle(event, mqtt, out)
