"""A TCP proxy between broker nodes and redis-server that a test steers, to put a fault at a chosen point.

It understands just enough RESP to find where each request (an array of bulk strings) ends, so a test can
- cut a connection right after the first complete request matching some bytes has been forwarded: Redis
  runs what came before and that request, never what follows in the same pipeline;
- delay every request matching some bytes (and, to keep order, what follows it on that connection);
- drop every connection (each side sees a reset), or hold them all (a black hole: nothing forwarded).
It runs its own asyncio loop in a thread; every method is called from the test's thread.

    proxy = RedisProxy(redis_server.port)    # nodes use proxy.url
    proxy.cut_after(b"EVALSHA", b"abc...")   # the next pipeline holding that script is cut right after it
    proxy.delay(b"EVALSHA", 0.3, b"abc...")  # requests holding all the given byte strings wait 0.3 s
    proxy.drop_all(); proxy.hold(True)
    proxy.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from dataclasses import dataclass, field

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def request_end(buf: bytes | bytearray, pos: int = 0) -> int:
    """The index just past the request starting at `pos`, or -1 if it is not complete yet. A request is
    a RESP array of bulk strings (`*N\\r\\n` then N times `$len\\r\\n<bytes>\\r\\n`), or an inline command
    line ending in CRLF."""
    if pos >= len(buf):
        return -1
    if buf[pos : pos + 1] != b"*":
        nl = buf.find(b"\r\n", pos)
        return -1 if nl < 0 else nl + 2
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return -1
    count = int(buf[pos + 1 : nl])
    p = nl + 2
    for _ in range(count):
        nl = buf.find(b"\r\n", p)
        if nl < 0:
            return -1
        length = int(buf[p + 1 : nl])
        p = nl + 2 + length + 2
        if p > len(buf):
            return -1
    return p


@dataclass
class _Rule:
    needles: tuple[bytes, ...]
    delay: float = 0.0
    cut: bool = False
    fired: threading.Event = field(default_factory=threading.Event)

    def matches(self, request: bytes) -> bool:
        return all(n in request for n in self.needles)


class RedisProxy:
    def __init__(self, redis_port: int, redis_host: str = HOST) -> None:
        self.target = (redis_host, redis_port)
        self.port = _free_port()
        self._rules: list[_Rule] = []
        self._holding = False
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"redis-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("the redis proxy did not start")

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    # -- steering (from the test's thread) ----------------------------------------------------------
    def cut_after(self, *needles: bytes) -> threading.Event:
        """Cut the connection of the next request holding every needle right after forwarding it (what
        follows it in the same pipeline never reaches Redis). The event is set when it happened."""
        rule = _Rule(needles, cut=True)
        self._call(self._rules.append, rule)
        return rule.fired

    def delay(self, seconds: float, *needles: bytes) -> threading.Event:
        """Hold every request holding all needles (and what follows on its connection) for `seconds`."""
        rule = _Rule(needles, delay=seconds)
        self._call(self._rules.append, rule)
        return rule.fired

    def clear(self) -> None:
        self._call(self._rules.clear)

    def drop_all(self) -> None:
        """Close every connection now (both sides see it closed)."""
        self._call(self._drop_all)

    def hold(self, on: bool) -> None:
        """A black hole while on: connections stay open but nothing is forwarded either way."""
        self._holding = on

    def close(self) -> None:
        self._call(self._drop_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        done = threading.Event()

        def run() -> None:
            fn(*args)
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    # -- the proxy (on its loop) --------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, HOST, self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    def _drop_all(self) -> None:
        for client, upstream in list(self._conns):
            for w in (client, upstream):
                with contextlib.suppress(Exception):
                    w.transport.abort()
        self._conns.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        await asyncio.gather(
            self._requests(reader, up_writer, pair), self._replies(up_reader, writer), return_exceptions=True
        )
        self._conns.discard(pair)
        for w in pair:
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _wait_flowing(self) -> None:
        while self._holding:
            await asyncio.sleep(0.01)

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, pair: tuple) -> None:
        buf = bytearray()
        while True:
            data = await reader.read(65536)
            if not data:
                up.write_eof()
                return
            buf += data
            while True:
                end = request_end(buf)
                if end < 0:
                    break
                request = bytes(buf[:end])
                del buf[:end]
                await self._wait_flowing()
                rule = next((r for r in self._rules if r.matches(request)), None)
                if rule is not None and rule.delay:
                    rule.fired.set()
                    await asyncio.sleep(rule.delay)
                up.write(request)
                await up.drain()
                if rule is not None and rule.cut:
                    self._rules.remove(rule)
                    rule.fired.set()
                    await asyncio.sleep(0.05)  # let Redis read it before the connection goes
                    for w in pair:
                        w.transport.abort()
                    return

    async def _replies(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await up_reader.read(65536)
            if not data:
                return
            await self._wait_flowing()
            writer.write(data)
            await writer.drain()
