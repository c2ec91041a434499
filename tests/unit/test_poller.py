"""fleetmq's own epoll transport (fleetmq.broker.poller) on real loopback sockets, under asyncio's loop and
uvloop's: what a protocol sees of it must be what it sees of an asyncio transport."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop
from fleetmq.broker import poller
from fleetmq.broker.poller import PolledServer, Poller, Stream, listening_sockets

pytestmark = pytest.mark.skipif(not poller.AVAILABLE, reason="no epoll on this platform")

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


class Recorder(asyncio.Protocol):
    """What a protocol is told, in order."""

    def __init__(self, echo: bool = False, keep_open: bool = False) -> None:
        self.echo = echo
        self.keep_open = keep_open
        self.events: list[str] = []
        self.data = bytearray()
        self.transport: Any = None
        self.lost: list[Exception | None] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.echo:
            self.transport.write(data)

    def eof_received(self) -> bool:
        self.events.append("eof")
        return self.keep_open

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.append(exc)


@pytest.fixture(params=list(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


class Served:
    """A PolledServer on a free loopback port, and the protocols it made."""

    def __init__(self, loop: asyncio.AbstractEventLoop, make: Callable[[], Recorder] = Recorder) -> None:
        self.loop = loop
        self.poller = Poller(loop)
        self.protocols: list[Recorder] = []

        def factory() -> Recorder:
            self.protocols.append(make())
            return self.protocols[-1]

        self.server = PolledServer(self.poller, listening_sockets("127.0.0.1", 0, 1024, False), factory)
        self.port = self.server.sockets[0].getsockname()[1]

    def client(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setblocking(False)
        self.until(lambda: len(self.protocols) >= 1)
        return sock

    def until(self, done: Callable[[], object], timeout: float = 5.0) -> None:
        async def wait() -> None:
            deadline = self.loop.time() + timeout
            while not done():
                assert self.loop.time() < deadline, "timed out"
                await asyncio.sleep(0.002)

        self.loop.run_until_complete(wait())

    def close(self) -> None:
        self.server.close()
        self.poller.close()


@pytest.fixture
def served(loop: asyncio.AbstractEventLoop) -> Iterator[Served]:
    s = Served(loop)
    yield s
    s.close()


@pytest.fixture
def echoed(loop: asyncio.AbstractEventLoop) -> Iterator[Served]:
    s = Served(loop, lambda: Recorder(echo=True))
    yield s
    s.close()


def receive(served: Served, sock: socket.socket, n: int | None = None) -> bytes:
    """`n` bytes from `sock` (all of them to its end when None), the loop running meanwhile."""
    got = bytearray()

    def more() -> bool:
        while n is None or len(got) < n:
            try:
                chunk = sock.recv(1 << 20)
            except BlockingIOError:
                return False
            if not chunk:
                return True
            got.extend(chunk)
        return True

    served.until(more)
    return bytes(got)


def test_bytes_go_both_ways_in_order(echoed: Served):
    served = echoed
    sock = served.client()
    p = served.protocols[0]
    assert p.events == ["made"]
    assert isinstance(p.transport, Stream)
    assert p.transport.get_extra_info("peername") == sock.getsockname()
    assert p.transport.get_extra_info("sockname") == ("127.0.0.1", served.port)
    assert p.transport.get_extra_info("socket") is None
    accepted = socket.socket(fileno=p.transport._fd)
    try:  # (Nagle off: inherited from the listening socket)
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        accepted.detach()
    payload = bytes(range(256)) * 4096  # 1 MB: more than one read, and more than one write
    sock.setblocking(True)
    sock.sendall(payload)
    sock.setblocking(False)
    assert receive(served, sock, len(payload)) == payload
    assert bytes(p.data) == payload
    sock.close()


def test_a_client_that_does_not_read_pauses_the_protocol_and_gets_everything_once_it_does(served: Served):
    sock = served.client()
    p = served.protocols[0]
    stream = p.transport
    stream.set_write_buffer_limits(high=64 * 1024)
    chunk = b"x" * 16384
    for _ in range(400):  # 6.4 MB: far more than both sockets' buffers
        stream.write(chunk)
    assert p.events == ["made", "pause"]
    held = stream.get_write_buffer_size()
    assert held > 64 * 1024
    assert stream.get_write_buffer_limits() == (16 * 1024, 64 * 1024)
    got = receive(served, sock, 400 * 16384)
    assert got == chunk * 400
    served.until(lambda: "resume" in p.events)
    assert p.events == ["made", "pause", "resume"]
    assert stream.get_write_buffer_size() == 0
    sock.close()


def test_close_sends_what_waits_first_then_the_connection_is_lost_and_the_socket_closed(served: Served):
    sock = served.client()
    p = served.protocols[0]
    stream = p.transport
    payload = b"y" * (4 << 20)
    stream.write(payload)
    assert stream.get_write_buffer_size() > 0
    stream.close()
    assert stream.is_closing() and not stream.is_reading()
    stream.write(b"after close")  # (dropped, as asyncio's)
    assert receive(served, sock) == payload  # (then its end)
    served.until(lambda: "lost" in p.events)
    assert p.lost == [None]
    assert len(served.poller) == 0
    with pytest.raises(OSError):  # (closed: nothing opened a descriptor since)
        os.fstat(stream._fd)
    sock.close()


def test_abort_drops_what_waits_and_loses_the_connection(served: Served):
    sock = served.client()
    p = served.protocols[0]
    p.transport.write(b"z" * (8 << 20))
    p.transport.abort()
    served.until(lambda: "lost" in p.events)
    assert p.lost == [None]
    assert len(served.poller) == 0
    sock.close()


def test_the_peer_closing_is_an_eof_then_a_lost_connection(served: Served):
    sock = served.client()
    p = served.protocols[0]
    sock.sendall(b"last words")
    sock.close()
    served.until(lambda: "lost" in p.events)
    assert p.events == ["made", "eof", "lost"]
    assert bytes(p.data) == b"last words"
    assert len(served.poller) == 0


def test_a_protocol_that_keeps_a_half_closed_connection_open_can_still_write(loop: asyncio.AbstractEventLoop):
    served = Served(loop, lambda: Recorder(keep_open=True))
    try:
        sock = served.client()
        p = served.protocols[0]
        sock.shutdown(socket.SHUT_WR)
        served.until(lambda: "eof" in p.events)
        p.transport.write(b"still here")
        assert receive(served, sock, 10) == b"still here"
        assert "lost" not in p.events
        p.transport.close()
        served.until(lambda: "lost" in p.events)
        sock.close()
    finally:
        served.close()


def test_a_peer_that_resets_while_bytes_wait_loses_the_connection_with_the_error(served: Served):
    sock = served.client()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    p = served.protocols[0]
    p.transport.pause_reading()
    p.transport.write(b"w" * (8 << 20))
    assert p.transport.get_write_buffer_size() > 0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # (linger 0: a reset)
    served.until(lambda: "lost" in p.events)
    assert isinstance(p.lost[0], ConnectionError)
    assert len(served.poller) == 0


def test_paused_reading_holds_the_bytes_until_resumed(served: Served):
    sock = served.client()
    p = served.protocols[0]
    p.transport.pause_reading()
    assert not p.transport.is_reading()
    sock.sendall(b"held")
    served.loop.run_until_complete(asyncio.sleep(0.05))
    assert p.data == b""
    p.transport.resume_reading()
    assert p.transport.is_reading()
    served.until(lambda: p.data == b"held")
    sock.close()


def test_a_new_protocol_takes_over_the_stream(served: Served):
    sock = served.client()
    first = served.protocols[0]
    second = Recorder()
    first.transport.set_protocol(second)
    assert first.transport.get_protocol() is second
    sock.sendall(b"to the second")
    served.until(lambda: second.data == b"to the second")
    assert first.data == b""
    sock.close()
    served.until(lambda: "lost" in second.events)


def test_many_clients_at_once_are_each_served(echoed: Served):
    served = echoed
    socks = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(300)]
    served.until(lambda: len(served.protocols) == 300)
    assert len(served.poller) == 300
    for i, sock in enumerate(socks):
        sock.sendall(b"%d;" % i)
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        assert receive(served, sock, len(b"%d;" % i)) == b"%d;" % i
    for sock in socks:
        sock.close()
    served.until(lambda: len(served.poller) == 0)


def test_a_closed_connection_goes_without_the_garbage_collector(served: Served):
    sock = served.client()
    p = served.protocols.pop()
    protocol = weakref.ref(p)  # (its stream holds it until the connection is lost, and it the stream)
    del p
    gc.disable()
    try:
        sock.close()
        served.until(lambda: len(served.poller) == 0)
        served.loop.run_until_complete(asyncio.sleep(0.01))
        assert protocol() is None
    finally:
        gc.enable()


def test_listening_sockets_bind_every_address_of_a_host_once():
    socks = listening_sockets("localhost", 0, 16, reuse_port=False)
    try:
        families = sorted(s.family for s in socks)
        assert families and len(families) == len(set(families))
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) for s in socks)
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)
    finally:
        for s in socks:
            s.close()
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    port.listen()
    try:
        with pytest.raises(OSError):
            listening_sockets("127.0.0.1", port.getsockname()[1], 16, reuse_port=False)
    finally:
        port.close()
