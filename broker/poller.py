"""fleetmq's own transport for plain TCP connections: one epoll set for every socket of a node.

An event loop's transport is most of what an idle connection costs: uvloop's holds about 1.2 KB of memory
per connection (a TCPTransport, its libuv handle and their bookkeeping; `python -m bench.connmem floor`),
asyncio's own 1.6 KB. A node that keeps tens of thousands of mostly idle clients pays that for each. Here
a connection is one small object and its socket's descriptor: the loop watches one file descriptor, the
epoll set's, and `Poller` reads the sockets it says are ready, about 0.2 KB per connection in all.

`Stream` has what fleetmq's protocols use of an asyncio.Transport, with asyncio's semantics: writes go
to the socket at once and what it does not take waits in a buffer; past the high-water mark the
protocol is told to pause writing, and to resume once it is all out; `close` lets the buffer drain first,
`abort` does not; `connection_lost` comes in a later callback, after which the socket is closed. The
epoll set is level-triggered: a socket that is not read (paused, or past a turn's events) stays ready
for the next turn. TLS is not here: tls and wss listeners keep the loop's transports.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

log = logging.getLogger("fleetmq.poller")

#: whether this platform has epoll (Linux): elsewhere every listener uses the loop's transports
AVAILABLE: Final = hasattr(select, "epoll")
#: ready sockets handled in one loop turn; the others wait for the next (level-triggered)
MAX_EVENTS: Final = 1024
#: bytes read from a socket at a time
READ_SIZE: Final = 64 * 1024
#: connections accepted in one loop turn from one listening socket
ACCEPTS_PER_TURN: Final = 128
#: how long a listener stops accepting after running out of file descriptors
ACCEPT_PAUSE_S: Final = 0.5
DEFAULT_HIGH: Final = 64 * 1024

_IN: Final = select.EPOLLIN if AVAILABLE else 1
_OUT: Final = select.EPOLLOUT if AVAILABLE else 4
_GONE: Final = select.EPOLLHUP | select.EPOLLERR if AVAILABLE else 24
_TRY_AGAIN: Final[tuple[type[OSError], ...]] = (BlockingIOError, InterruptedError)


class Poller:
    """The epoll set of one node's streams, watched by its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        self._streams: dict[int, Stream] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def __len__(self) -> int:
        return len(self._streams)

    def _ready(self) -> None:
        streams = self._streams
        for fd, events in self._epoll.poll(0, MAX_EVENTS):
            stream = streams.get(fd)
            if stream is None:
                continue
            # (hung up or in error is reported whatever was asked: the write or read that fails says so)
            if events & (_OUT | _GONE):
                stream._writable()
            if events & (_IN | _GONE):
                stream._readable()

    def add(self, fd: int, protocol: asyncio.BaseProtocol) -> Stream:
        """A stream on the accepted, non-blocking socket `fd` (its own from now on), its protocol told it
        is made."""
        stream = Stream(self, fd, protocol)
        self._streams[fd] = stream
        self._epoll.register(fd, _IN)
        try:
            protocol.connection_made(cast(asyncio.BaseTransport, stream))  # (what it uses of one)
        except Exception:
            log.exception("internal error in connection_made")
            stream.abort()
        return stream

    def _watch(self, stream: Stream, old: int, new: int) -> None:
        fd = stream._fd
        if not new:
            self._epoll.unregister(fd)
        elif not old:
            self._epoll.register(fd, new)
        else:
            self._epoll.modify(fd, new)

    def _forget(self, stream: Stream) -> None:
        fd = stream._fd
        if self._streams.get(fd) is stream:
            del self._streams[fd]

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()


#: Stream._state bits
_READING: Final = 1  # the protocol wants the socket read
_CLOSING: Final = 2  # close() or abort() called: nothing more is read or accepted for writing
_LOST: Final = 4  # connection_lost scheduled
_PAUSED: Final = 8  # the protocol was told to pause writing
_FLAGS: Final = 0xF
#: the bits above: what the epoll set watches the socket for (EPOLLIN 1, EPOLLOUT 4), so that a state
#: stays below 256, an int CPython does not allocate
_WATCHED: Final = 4


class Stream:
    """One connection's socket, as an asyncio.Transport to its protocol (the subset fleetmq uses).

    It keeps the socket's file descriptor, not a socket object (88 bytes more per connection): reads and
    writes are the read(2) and write(2) of a connected socket."""

    __slots__ = ("_buffer", "_fd", "_high", "_poller", "_protocol", "_state")

    def __init__(self, poller: Poller, fd: int, protocol: asyncio.BaseProtocol) -> None:
        self._poller = poller
        self._fd = fd
        self._protocol: Any = protocol
        self._buffer: bytearray | None = None  # what the socket did not take yet
        self._state = _READING | _IN << _WATCHED  # (Poller.add registers it for reading)
        self._high = DEFAULT_HIGH

    # -- what the epoll set reports --------------------------------------------------------------
    def _readable(self) -> None:
        if not self._state & _READING:
            return
        try:
            data = os.read(self._fd, READ_SIZE)
        except _TRY_AGAIN:
            return
        except OSError as e:
            self._fatal(e)
            return
        try:
            if data:
                self._protocol.data_received(data)
            elif not self._protocol.eof_received():
                self.close()
            else:  # (half closed: the protocol writes on; nothing more comes)
                self._state &= ~_READING
                self._rewatch()
        except Exception as e:
            log.exception("internal error in a protocol")
            self._fatal(e)

    def _writable(self) -> None:
        buffer = self._buffer
        if buffer is None:
            return
        try:
            sent = os.write(self._fd, buffer)
        except _TRY_AGAIN:
            return
        except OSError as e:
            self._fatal(e)
            return
        del buffer[:sent]
        if buffer:
            return
        self._buffer = None
        self._rewatch()
        if self._state & _PAUSED:
            self._resume_protocol()
        if self._state & _CLOSING:
            self._lose(None)

    # -- asyncio.WriteTransport --------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._state & _CLOSING or not data:
            return
        buffer = self._buffer
        if buffer is None:
            try:
                sent = os.write(self._fd, data)
            except _TRY_AGAIN:
                sent = 0
            except OSError as e:
                self._fatal(e)
                return
            if sent == len(data):
                return
            self._buffer = bytearray(memoryview(data)[sent:])
            self._rewatch()
        else:
            buffer += data
        if self.get_write_buffer_size() > self._high and not self._state & _PAUSED:
            self._state |= _PAUSED
            self._call("pause_writing")

    def writelines(self, chunks: Sequence[bytes]) -> None:
        self.write(b"".join(chunks))

    def get_write_buffer_size(self) -> int:
        return 0 if self._buffer is None else len(self._buffer)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """asyncio's: the low mark is high / 4 unless given (only high is kept: the low one is derived)."""
        self._high = DEFAULT_HIGH if high is None else high
        if self.get_write_buffer_size() > self._high and not self._state & _PAUSED:
            self._state |= _PAUSED
            self._call("pause_writing")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._high // 4, self._high

    def _resume_protocol(self) -> None:
        if self.get_write_buffer_size() <= self._high // 4:
            self._state &= ~_PAUSED
            self._call("resume_writing")

    def can_write_eof(self) -> bool:
        return False

    # -- asyncio.ReadTransport ---------------------------------------------------------------------
    def is_reading(self) -> bool:
        return self._state & (_READING | _CLOSING) == _READING

    def pause_reading(self) -> None:
        if self.is_reading():
            self._state &= ~_READING
            self._rewatch()

    def resume_reading(self) -> None:
        if not self._state & (_READING | _CLOSING):
            self._state |= _READING
            self._rewatch()

    # -- asyncio.BaseTransport ---------------------------------------------------------------------
    def is_closing(self) -> bool:
        return bool(self._state & _CLOSING)

    def close(self) -> None:
        """Stop reading; the connection is lost once what waits to be written is out."""
        if self._state & _CLOSING:
            return
        self._state = (self._state | _CLOSING) & ~_READING
        self._rewatch()
        if self._buffer is None:
            self._lose(None)

    def abort(self) -> None:
        self._fatal(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[no-any-return]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """peername and sockname (read from the socket when asked; there is no socket object to give)."""
        if name not in ("peername", "sockname") or self._state & _LOST:
            return default
        sock = socket.socket(fileno=self._fd)
        try:
            return sock.getpeername() if name == "peername" else sock.getsockname()
        except OSError:
            return default
        finally:
            sock.detach()

    # -- inside ------------------------------------------------------------------------------------
    def _rewatch(self) -> None:
        """Have the epoll set watch what the state asks: reading, and writing while bytes wait."""
        state = self._state
        want = 0
        if not state & _LOST:
            want = (_IN if state & _READING else 0) | (_OUT if self._buffer is not None else 0)
        had = state >> _WATCHED
        if want != had:
            self._poller._watch(self, had, want)
            self._state = (state & _FLAGS) | (want << _WATCHED)

    def _fatal(self, exc: Exception | None) -> None:
        """Drop what waits to be written and lose the connection now."""
        if isinstance(exc, OSError) and exc.errno not in _QUIET:
            log.debug("connection failed: %s", exc)
        self._buffer = None
        self._state = (self._state | _CLOSING) & ~_READING
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._state & _LOST:
            return
        self._state |= _LOST
        self._rewatch()  # (the epoll set lets go of the socket)
        self._poller._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        self._poller._forget(self)
        try:
            self._protocol.connection_lost(exc)
        except Exception:
            log.exception("internal error in connection_lost")
        finally:
            os.close(self._fd)
            self._protocol = None  # (it holds this stream: without the cycle both go by refcount, at once)

    def _call(self, method: str) -> None:
        try:
            getattr(self._protocol, method)()
        except Exception:
            log.exception("internal error in %s", method)


_QUIET: Final = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT})


class PolledServer:
    """A listener whose connections are `Poller` streams. What Server uses of an asyncio.Server: sockets,
    close() and wait_closed()."""

    def __init__(
        self, poller: Poller, sockets: list[socket.socket], factory: Callable[[], asyncio.BaseProtocol]
    ) -> None:
        self.sockets = sockets
        self._poller = poller
        self._factory = factory
        self._loop = poller._loop
        for sock in sockets:
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _ = listening.accept()
            except _TRY_AGAIN:
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:  # out of file descriptors, say: stop a while rather than spin
                log.warning("accept failed: %s (accepting again in %gs)", e, ACCEPT_PAUSE_S)
                self._loop.remove_reader(listening.fileno())
                self._loop.call_later(ACCEPT_PAUSE_S, self._listen_again, listening)
                return
            sock.setblocking(False)  # (TCP_NODELAY comes from the listening socket, on Linux)
            self._poller.add(sock.detach(), self._factory())

    def _listen_again(self, listening: socket.socket) -> None:
        if listening.fileno() >= 0:
            self._loop.add_reader(listening.fileno(), self._accept, listening)

    def close(self) -> None:
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()

    async def wait_closed(self) -> None:
        return None


def listening_sockets(host: str, port: int, backlog: int, reuse_port: bool) -> list[socket.socket]:
    """Bound, listening sockets for HOST:PORT as asyncio's create_server makes them: one per address the
    host resolves to (every interface, IPv4 and IPv6, for an empty host), SO_REUSEADDR, IPv6 ones v6-only."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
            (i[0], i[1], i[2], i[3], i[4]) for i in infos if i[0] in (socket.AF_INET, socket.AF_INET6)
        ):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (the accepted sockets inherit it)
            sock.bind(address)
            sock.listen(backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
