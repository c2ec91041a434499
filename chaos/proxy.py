"""A TCP proxy between one broker node and Redis that the nemesis drives.

- pass: bytes flow both ways as they arrive;
- drop(): every open connection is reset at once (the node reconnects through the proxy);
- blackhole(): nothing is forwarded either way and new connections hang before reaching Redis, as in a
  partition; heal(flush=True) delivers what was held (a partition shorter than TCP's patience),
  heal(flush=False) resets the connections instead;
- delay(seconds): every chunk is forwarded that much later, in order.
Each node gets its own proxy, so a fault can cut one node off from Redis or all of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from chaos.procs import HOST, free_port


class _Pipe:
    """One accepted connection and its upstream twin, pumping both ways through delay queues."""

    def __init__(self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.proxy, self.down_r, self.down_w = proxy, reader, writer
        self.up_w: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    async def run(self) -> None:
        await self.proxy.flowing.wait()  # a black-holed connection does not reach Redis
        if self.closed:
            return
        try:
            up_r, self.up_w = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.proxy.upstream_port), 5
            )
        except (OSError, TimeoutError):
            self.abort()
            return
        if self.closed:
            self.abort()
            return
        for r, w in ((self.down_r, self.up_w), (up_r, self.down_w)):
            q: collections.deque[tuple[float, bytes]] = collections.deque()
            ready = asyncio.Event()
            self.tasks.append(asyncio.ensure_future(self._read(r, q, ready)))
            self.tasks.append(asyncio.ensure_future(self._write(w, q, ready)))
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _read(
        self, r: asyncio.StreamReader, q: collections.deque[tuple[float, bytes]], ready: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while chunk := await r.read(65536):
                q.append((loop.time() + self.proxy.latency, chunk))
                ready.set()
        except (OSError, ConnectionError):
            pass
        self.abort()

    async def _write(
        self, w: asyncio.StreamWriter, q: collections.deque[tuple[float, bytes]], ready: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not q:
                    ready.clear()
                    await ready.wait()
                    continue
                await self.proxy.flowing.wait()
                wait = q[0][0] - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                w.write(q.popleft()[1])
                await w.drain()
        except (OSError, ConnectionError):
            self.abort()

    def abort(self) -> None:
        """Reset both sides now; what was in flight is lost."""
        if self.closed:
            return
        self.closed = True
        self.proxy.pipes.discard(self)
        for w in (self.down_w, self.up_w):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()


class Proxy:
    """Listens on a free loopback port and forwards to `upstream_port` (the Redis port)."""

    def __init__(self, name: str, upstream_port: int):
        self.name, self.upstream_port = name, upstream_port
        self.port = free_port()
        self.latency = 0.0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pipes: set[_Pipe] = set()
        self.accepted = self.dropped = 0
        self._server: asyncio.Server | None = None
        self._runs: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        pipe = _Pipe(self, reader, writer)
        self.pipes.add(pipe)
        await pipe.run()

    # -- faults
    def drop(self) -> int:
        """Reset every open connection; returns how many."""
        pipes = list(self.pipes)
        for p in pipes:
            p.abort()
        self.dropped += len(pipes)
        return len(pipes)

    def blackhole(self) -> None:
        self.flowing.clear()

    def delay(self, seconds: float) -> None:
        self.latency = seconds

    def heal(self, *, flush: bool = True) -> None:
        self.latency = 0.0
        if not self.flowing.is_set() and not flush:
            self.drop()
        self.flowing.set()

    @property
    def healthy(self) -> bool:
        return self.flowing.is_set() and self.latency == 0.0

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for p in list(self.pipes):
            p.abort()
        self.flowing.set()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
