"""Socket I/O for one client: an asyncio Protocol feeding its Channel and batching its writes.

Everything written to a connection during one event-loop turn (acks, deliveries from many publishers) is
joined and handed to the transport at the end of the turn: one syscall instead of one per packet.
WsConnection carries the same byte stream in WebSocket frames (ws and wss listeners).

What a node holds for clients that read slower than it writes is bounded twice (`write_buffers` in the
config): per connection by its transport's high-water mark, past which the channel stops adding to it
(Channel.congested), and for the node by a WriteBudget. A connection whose transport still held bytes at
its last flush (a client slower than the node) has its writes counted and handed over past FLUSH_AT, so
its transport says it is full while the turn still runs; one that keeps up is written to uncounted, at
no cost, and holds at most what one loop turn routes to it (reads are bounded per turn: READ_TURN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, ClassVar, cast

from . import proxyproto
from .channel import Channel, ChannelIO
from .codec import RC
from .websocket import WebSocket

log = logging.getLogger("fleetmq.connection")

#: Bytes buffered for a client beyond which it counts as congested (see Channel.deliver), unless the
#: config's write_buffers.connection says otherwise.
WRITE_HIGH_WATER = 4 * 1024 * 1024
#: Bytes written to a slow client in one loop turn past which they go to its transport at once.
FLUSH_AT = 64 * 1024
#: Bytes read from one client after which it waits a loop turn: the transport would otherwise read a fast
#: sender's socket over and over in one turn (libuv: up to 32 reads), and everyone else would wait for it.
READ_TURN = 64 * 1024

#: makes the channel of a new connection: (its IO, peer address, listener name) -> channel
NewChannel = Callable[[ChannelIO, str, str], Channel]


def common_name(cert: dict[str, Any] | None) -> str | None:
    """The common name of a verified peer certificate (ssl's getpeercert()); None without one."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    return None


class WriteBudget:
    """The bytes a node's transports hold for their clients, all connections together.

    A connection reports what its transport still holds whenever it hands it bytes (and when the transport
    drains below its low-water mark); those that hold bytes are looked at again every TICK, so bytes that
    drained unnoticed leave the total. Past `limit`, a connection that holds bytes counts as congested, as
    if its own socket were full, until the total is back under 3/4 of the limit or its transport is empty:
    slow readers are held back, clients that keep up are not.
    """

    TICK: ClassVar[float] = 0.1

    __slots__ = ("_holders", "_throttled", "_timer", "connection_limit", "limit", "used")

    def __init__(self, limit: int, connection_limit: int = WRITE_HIGH_WATER) -> None:
        self.limit = limit
        self.connection_limit = connection_limit
        self.used = 0
        self._holders: set[Connection] = set()
        self._throttled: set[Connection] = set()
        self._timer: asyncio.TimerHandle | None = None

    def update(self, conn: Connection, held: int) -> None:
        """What `conn`'s transport holds now."""
        self.used += held - conn.held
        conn.held = held
        if not held:
            self._holders.discard(conn)
            return
        self._holders.add(conn)
        if self.used > self.limit and conn not in self._throttled:
            self._throttled.add(conn)
            conn.throttle(True)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.TICK, self._tick)

    def forget(self, conn: Connection) -> None:
        """A closed connection holds nothing any more."""
        self.used -= conn.held
        conn.held = 0
        self._holders.discard(conn)
        self._throttled.discard(conn)

    def _tick(self) -> None:
        self._timer = None
        for conn in list(self._holders):
            t = conn.transport
            held = t.get_write_buffer_size() if t is not None and not t.is_closing() else 0
            self.used += held - conn.held
            conn.held = held
            if not held:
                self._holders.discard(conn)
        under = self.used <= self.limit * 3 // 4
        for conn in [c for c in self._throttled if under or not c.held]:
            self._throttled.discard(conn)
            conn.throttle(False)
        if self._holders or self._throttled:
            self._timer = asyncio.get_running_loop().call_later(self.TICK, self._tick)


#: a connection made without a node's budget (tests, tools): bounded per connection only
UNLIMITED = WriteBudget(1 << 62)


class Site:
    """What the connections of one listener share, made once for it: each connection holds this in one
    slot instead of six (most connections of a fleet are idle, and each slot is 8 bytes of every one)."""

    __slots__ = ("budget", "connections", "listener", "loop", "new_channel", "peer_cert_as_username")

    def __init__(
        self,
        new_channel: NewChannel,
        listener: str,
        connections: set[Connection],
        peer_cert_as_username: bool = False,
        budget: WriteBudget = UNLIMITED,
    ) -> None:
        self.new_channel = new_channel
        self.listener = listener
        self.connections = connections  # the node's, while they are open
        self.peer_cert_as_username = peer_cert_as_username
        self.budget = budget
        self.loop = asyncio.get_running_loop()


class Connection(asyncio.Protocol):
    __slots__ = (
        "_buf",
        "_careful",
        "_closing",
        "_held_back",
        "_paused",
        "_pending",
        "_read",
        "_scheduled",
        "_site",
        "_throttled",
        "_yielding",
        "channel",
        "held",
        "proxied",
        "transport",
    )

    def __init__(self, site: Site) -> None:
        self._site = site
        self._buf: list[bytes] = []
        self._pending = 0  # bytes in _buf, while counted (_careful)
        self._scheduled = False
        self._closing = False
        self._careful = False  # closing, or the transport holds bytes: writes are counted (_write_counted)
        self.held = 0  # bytes the transport held when last looked at (WriteBudget)
        self._paused = False  # the transport is past its high-water mark
        self._throttled = False  # the node's write budget is spent and this connection holds bytes
        self._read = 0  # bytes read since this connection last let a loop turn go by
        self._yielding = False  # reading paused until the next loop turn (READ_TURN)
        self._held_back = False  # reading paused by the channel (publish rate)
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        #: the client's address from a PROXY header read before TLS started (ProxiedTlsListener)
        self.proxied: tuple[str, int] | None = None

    @property
    def listener(self) -> str:
        return self._site.listener

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport, peer: tuple[str, int] | None = None) -> None:
        """`peer`: the client's address when the socket's is a load balancer's (a PROXY header)."""
        t = self.transport = cast(asyncio.Transport, transport)  # a stream (uvloop's are not subclasses)
        site = self._site
        t.set_write_buffer_limits(high=site.budget.connection_limit)
        site.connections.add(self)
        peer = peer or self.proxied or transport.get_extra_info("peername")
        self.channel = site.new_channel(self, f"{peer[0]}:{peer[1]}" if peer else "?", site.listener)
        if site.peer_cert_as_username:
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
        self._read += len(data)
        if self._read >= READ_TURN:
            self._yield_turn()

    def _yield_turn(self) -> None:
        """Read no more from this client before the loop has served the others once."""
        self._read = 0
        t = self.transport
        if t is not None and not self._closing and not self._yielding and t.is_reading():
            t.pause_reading()
            self._yielding = True
            self._site.loop.call_soon(self._read_again)

    def _read_again(self) -> None:
        self._yielding = False
        if not self._held_back:
            self._resume()

    def pause_writing(self) -> None:
        self._paused = True
        self._congestion()

    def resume_writing(self) -> None:
        self._paused = False
        t = self.transport
        self._site.budget.update(self, t.get_write_buffer_size() if t is not None else 0)
        self._congestion()

    def throttle(self, on: bool) -> None:
        """The node's write budget holds this connection back (on) or lets it go (WriteBudget)."""
        self._throttled = on
        self._congestion()

    def _congestion(self) -> None:
        """Tell the channel whether it may add to what waits for the socket; count writes while anything
        waits there."""
        careful = self._closing or self._paused or self._throttled or self.held > 0
        if careful and not self._careful:
            self._pending = sum(map(len, self._buf))
        self._careful = careful
        channel = self.channel
        congested = self._paused or self._throttled
        if channel is not None and channel.congested != congested and not self._closing:
            channel.set_congested(congested)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._site.connections.discard(self)
        self._buf.clear()
        self._pending = 0
        self._site.budget.forget(self)
        channel = self.channel
        if channel is not None:
            # (the channel holds this connection as its io: without the cycle, a closed connection goes
            # when its last reference does, not at the next full collection, which is rare here)
            self.channel = None
            try:
                channel.connection_lost()
            except Exception:
                log.exception("internal error closing %s", channel.client_id or channel.peer)

    # -- ChannelIO ---------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._careful:  # (closing, or a client slower than the node)
            self._write_counted(data)
            return
        self._buf.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._site.loop.call_soon(self._flush)

    def _write_counted(self, data: bytes) -> None:
        """A write to a connection whose transport holds bytes: past FLUSH_AT bytes this turn they go to
        the transport at once, which says it is full (pause_writing) while the turn still runs."""
        if self._closing:
            return
        self._buf.append(data)
        pending = self._pending = self._pending + len(data)
        if pending >= FLUSH_AT:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            self._site.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        t = self.transport
        if not buf or t is None:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._pending = 0
        self._send(data)
        held = t.get_write_buffer_size()
        if held or self.held:  # (a client that keeps up costs one call here)
            self._site.budget.update(self, held)
            self._congestion()

    def _send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self._closing or self.transport is None:
            return
        self._flush()  # a DISCONNECT / CONNACK written just before closing still goes out
        self._closing = self._careful = True
        self.transport.close()

    def pause_reading(self) -> None:
        self._held_back = True
        t = self.transport
        if t is not None and not self._closing and t.is_reading():
            t.pause_reading()

    def resume_reading(self) -> None:
        self._held_back = False
        if not self._yielding:
            self._resume()

    def _resume(self) -> None:
        t = self.transport
        if t is not None and not self._closing and not t.is_closing() and not t.is_reading():
            t.resume_reading()


class WsConnection(Connection):
    """MQTT over WebSocket: the channel sees the plain MQTT stream; one loop turn's writes make one frame."""

    __slots__ = ("ws",)

    def __init__(self, site: Site, path: str) -> None:
        super().__init__(site)
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

    def _send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(self.ws.frame(data))

    def close(self) -> None:
        if self._closing or self.transport is None:
            return
        self._flush()
        self._closing = self._careful = True
        self.transport.write(self.ws.close())
        self.transport.close()


class ProxyGate(asyncio.Protocol):
    """A connection on a listener with proxy_protocol until its PROXY header is in: then the connection is
    its protocol's (`make`), from the address the header names, and the bytes after the header are its
    first. A header that is not one, or that does not come within `timeout`, closes the connection."""

    __slots__ = ("_buf", "_make", "_refused", "_timeout", "_timer", "transport")

    def __init__(
        self, make: Callable[[], Connection], timeout: float, refused: Callable[[str], None]
    ) -> None:
        self._make = make
        self._timeout = timeout
        self._refused = refused
        self._buf = b""
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            got = proxyproto.parse(self._buf)
        except proxyproto.ProxyError as e:
            return self._refuse(str(e))
        if got is None:
            return
        header, used = got
        if self._timer is not None:
            self._timer.cancel()
        rest, self._buf = self._buf[used:], b""
        transport, conn = self.transport, self._make()
        assert transport is not None
        transport.set_protocol(conn)
        conn.connection_made(transport, header.source)
        if rest:
            conn.data_received(rest)

    def _expired(self) -> None:
        self._refuse(f"no PROXY header within {self._timeout:g}s")

    def _refuse(self, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        self._refused(f"{peer[0]}:{peer[1]}: {why}" if peer else why)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class ProxiedTlsListener:
    """A tls or wss listener behind a load balancer that sends a PROXY header before the TLS handshake.

    asyncio starts TLS on a socket as soon as it accepts it, and a ProxyGate would read the start of the
    handshake along with the header. So this listener accepts its sockets itself: it peeks at their first
    bytes until the header is whole, takes exactly the header's bytes off the socket and starts TLS on
    what follows (connect_accepted_socket), the connection knowing the address the header names. It has
    what Server uses of an asyncio.Server: sockets, close() and wait_closed()."""

    def __init__(
        self,
        sock: socket.socket,
        make: Callable[[], Connection],
        tls: ssl.SSLContext,
        timeout: float,
        refused: Callable[[str], None],
    ) -> None:
        self.sockets = [sock]
        self._make = make
        self._tls = tls
        self._timeout = timeout
        self._refused = refused
        self._admitting: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sockets[0])
            except OSError as e:  # (out of file descriptors, say: the next accept may work)
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._admit(conn))
            self._admitting.add(task)
            task.add_done_callback(self._admitting.discard)

    async def _admit(self, conn: socket.socket) -> None:
        try:
            header = await asyncio.wait_for(_read_header(conn), self._timeout)
        except (proxyproto.ProxyError, TimeoutError, OSError) as e:
            why = f"no PROXY header within {self._timeout:g}s" if isinstance(e, TimeoutError) else str(e)
            try:
                peer = conn.getpeername()
                self._refused(f"{peer[0]}:{peer[1]}: {why}")
            except OSError:
                self._refused(why)
            conn.close()
            return
        if header is None:
            conn.close()
            return
        connection = self._make()
        connection.proxied = header.source
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: connection, conn, ssl=self._tls)
        except (OSError, ssl.SSLError, TimeoutError) as e:  # a failed handshake: that client's alone
            log.debug("TLS handshake after a PROXY header failed: %s", e)
            conn.close()

    def close(self) -> None:
        self._accepting.cancel()
        for task in self._admitting:
            task.cancel()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting


async def _read_header(conn: socket.socket) -> proxyproto.ProxyHeader | None:
    """The PROXY header at the start of `conn`, its bytes (and only those) taken off the socket; None
    when the connection closed first."""
    loop = asyncio.get_running_loop()
    while True:
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(conn.fileno(), _set_once, readable)
        try:
            await readable
        finally:
            loop.remove_reader(conn.fileno())
        data = conn.recv(proxyproto.HEADER_MAX, socket.MSG_PEEK)
        if not data:
            return None  # (a balancer's health check, say: as with ProxyGate, not a refusal)
        got = proxyproto.parse(data)
        if got is not None:
            header, used = got
            conn.recv(used)  # (there: it was just peeked at)
            return header
        # The rest of the header is on its way. A peek leaves what it saw, so the socket stays readable:
        # wait a moment rather than spin.
        await asyncio.sleep(0.005)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
