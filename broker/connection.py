"""Socket I/O for one client: an asyncio Protocol feeding its Channel and batching its writes.

Everything written to a connection during one event-loop turn (acks, deliveries from many publishers) is
joined and handed to the transport once, at the end of the turn: one syscall instead of one per packet.
WsConnection carries the same byte stream in WebSocket frames (ws and wss listeners).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from .channel import Channel, ChannelIO
from .codec import RC
from .websocket import WebSocket

log = logging.getLogger("fleetmq.connection")

#: Bytes buffered for a client beyond which it counts as congested (see Channel.deliver).
WRITE_HIGH_WATER = 4 * 1024 * 1024

#: makes the channel of a new connection: (its IO, peer address, listener name) -> channel
NewChannel = Callable[[ChannelIO, str, str], Channel]


def common_name(cert: dict[str, Any] | None) -> str | None:
    """The common name of a verified peer certificate (ssl's getpeercert()); None without one."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    return None


class Connection(asyncio.Protocol):
    __slots__ = (
        "_buf",
        "_closing",
        "_loop",
        "_new_channel",
        "_peer_cert",
        "_registry",
        "_scheduled",
        "channel",
        "listener",
        "transport",
    )

    def __init__(
        self,
        new_channel: NewChannel,
        listener: str,
        connections: set[Connection],
        peer_cert_as_username: bool = False,
    ) -> None:
        self._new_channel = new_channel
        self._peer_cert = peer_cert_as_username
        self.listener = listener
        self._loop = asyncio.get_running_loop()
        self._buf: list[bytes] = []
        self._scheduled = False
        self._closing = False
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        self._registry = connections

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = self.transport = cast(asyncio.Transport, transport)  # a stream (uvloop's are not subclasses)
        t.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._registry.add(self)
        peer = transport.get_extra_info("peername")
        self.channel = self._new_channel(self, f"{peer[0]}:{peer[1]}" if peer else "?", self.listener)
        if self._peer_cert:
            self.channel.cert_name = common_name(transport.get_extra_info("peercert"))

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None:
            return
        try:
            channel.data_received(data)
        except Exception:  # a bug in one channel must not take the node down with it
            log.exception("internal error handling data from %s", channel.client_id or channel.peer)
            channel.telemetry.counters.disconnects["internal_error"] += 1
            self.close()

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.set_congested(True)

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.set_congested(False)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        self._buf.clear()
        channel = self.channel
        if channel is not None:
            try:
                channel.connection_lost()
            except Exception:
                log.exception("internal error closing %s", channel.client_id or channel.peer)

    # -- ChannelIO ---------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._buf.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        if not buf or self.transport is None:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self.transport.write(data)

    def close(self) -> None:
        if self._closing or self.transport is None:
            return
        self._flush()  # a DISCONNECT / CONNACK written just before closing still goes out
        self._closing = True
        self.transport.close()

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._loop.call_later(delay, callback)

    def time(self) -> float:
        return self._loop.time()

    def pause_reading(self) -> None:
        t = self.transport
        if t is not None and not self._closing and t.is_reading():
            t.pause_reading()

    def resume_reading(self) -> None:
        t = self.transport
        if t is not None and not self._closing and not t.is_closing() and not t.is_reading():
            t.resume_reading()


class WsConnection(Connection):
    """MQTT over WebSocket: the channel sees the plain MQTT stream; one loop turn's writes make one frame."""

    __slots__ = ("ws",)

    def __init__(
        self,
        new_channel: NewChannel,
        listener: str,
        connections: set[Connection],
        path: str,
        peer_cert_as_username: bool = False,
    ) -> None:
        super().__init__(new_channel, listener, connections, peer_cert_as_username)
        self.ws = WebSocket(path)

    def data_received(self, data: bytes) -> None:
        self._from_socket(data)

    def eof_received(self) -> bool:
        self._from_socket(None)
        return False

    def _from_socket(self, data: bytes | None) -> None:
        ws = self.ws
        mqtt, out = ws.receive(data)
        if out and self.transport is not None and not self._closing:
            self.transport.write(out)
        if mqtt:
            super().data_received(mqtt)
        if ws.closed:
            if ws.error is not None and self.channel is not None:
                log.info("websocket from %s closed: %s", self.channel.peer, ws.error)
                self.channel.kick(RC.PROTOCOL_ERROR, "bad_websocket")
            self.close()

    def _flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        if not buf or self.transport is None:
            return
        data = b"".join(buf)
        buf.clear()
        self.transport.write(self.ws.frame(data))

    def close(self) -> None:
        if self._closing or self.transport is None:
            return
        self._flush()
        self._closing = True
        self.transport.write(self.ws.close())
        self.transport.close()
