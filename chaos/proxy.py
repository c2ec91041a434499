"""A TCP proxy between broker nodes and redis-server that puts faults where it is told.

One proxy serves both the chaos nemesis (asyncio, in the harness's loop) and the deterministic fault tests
(tests/redisproxy.py runs it on a loop of its own in a thread). It understands just enough RESP to find
where each request ends, so a fault can land between two requests of one pipeline:
- cut_after(needles): the next request holding every needle is forwarded, then the connection is cut:
  Redis runs what came before and that request, never what follows in the same pipeline;
- delay(seconds, needles): requests holding every needle (every request without needles) wait that long,
  and what follows them on their connection waits behind them, so order is kept;
- slow(seconds): every chunk either way is forwarded that much later (network latency);
- hold(True): a black hole: nothing is forwarded either way and new connections do not reach Redis;
  hold(False) delivers what was held (a partition shorter than TCP's patience), heal(flush=False)
  resets the connections instead;
- drop_all(): every open connection is reset at once (the node reconnects through the proxy);
- lose_reply(needles): the next request holding every needle, and what follows it, reach Redis, but no
  reply comes back on that connection from then on; a moment later it is reset. Redis ran the request,
  the node cannot know it did (a reply lost to a shutdown, a failover or a network cut);
- hold_reply(seconds, needles): the next request holding every needle reaches Redis at once, but what
  comes back on its connection waits that long (a reply slower than what other connections carry);
- deafen(True): the same on every connection, for as long as it lasts: requests are forwarded, replies
  dropped; deafen(False) (or heal()) then resets every connection.
Self-contained on purpose (no broker code, nothing else from chaos), so the tests can import it alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import socket
import threading
from dataclasses import dataclass, field

HOST = "127.0.0.1"
#: how long a connection whose replies are lost stays open (Redis reads and runs what was sent meanwhile)
LOSE_AFTER = 0.1


_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _share(low: int, high: int) -> tuple[int, int]:
    """The part of [low, high] this process draws from: the k-th of n equal parts for pytest-xdist's
    worker gw<k> of n (PYTEST_XDIST_WORKER, PYTEST_XDIST_WORKER_COUNT), so two workers never hand out
    the same port (one could take a port the other's Redis left for a moment); the whole range otherwise."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    k, n = int(worker[2:]) % int(count), int(count)
    size = (high - low + 1) // n
    return low + k * size, low + (k + 1) * size - 1


def free_port(host: str = HOST) -> int:
    """A port on `host` nothing listens on, below the kernel's ephemeral range and never handed out twice
    by this process: a port the kernel picked itself could be taken, while it is not listened on (a node
    or a Redis down for a fault), as the local end of some outgoing connection (a proxy's, a replica's),
    and the restart would find it in use. The one allocator of the chaos harness, the tests and the bench."""
    rng = random.SystemRandom()
    top = _ephemeral_low() - 1
    low, high = _share(min(10000, top - 1000), top)
    for _ in range(200):
        port = rng.randint(low, high)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # (a crowded range: the kernel's choice)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def request_end(buf: bytes | bytearray, pos: int = 0) -> int:
    """The index just past the request starting at `pos`, or -1 if it is not complete yet. A request is
    a RESP array of bulk strings (`*N\\r\\n` then N times `$len\\r\\n<bytes>\\r\\n`), or an inline command
    line ending in CRLF."""
    if pos >= len(buf):
        return -1
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return -1
    if buf[pos : pos + 1] != b"*":
        return nl + 2
    count = int(buf[pos + 1 : nl])
    p = nl + 2
    for _ in range(count):
        nl = buf.find(b"\r\n", p)
        if nl < 0:
            return -1
        p = nl + 2 + int(buf[p + 1 : nl]) + 2
        if p > len(buf):
            return -1
    return p


@dataclass
class Rule:
    """What to do with requests holding every needle; `fired` is set when it first applied (a
    threading.Event, so a test's thread can wait on it)."""

    needles: tuple[bytes, ...]
    delay: float = 0.0
    cut: bool = False
    lose: bool = False  # forward it, then drop every reply on its connection and reset it
    hold_reply: float = 0.0  # forward it, then hold what comes back on its connection this long
    fired: threading.Event = field(default_factory=threading.Event)

    def matches(self, request: bytes) -> bool:
        return all(n in request for n in self.needles)


# what a direction's writer gets: (when to send, bytes, the cut rule that fires after it) or None for EOF
_Item = tuple[float, bytes, Rule | None] | None


class _Pipe:
    """One accepted connection and its upstream twin, pumped both ways through timed queues."""

    def __init__(self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.proxy, self.down_r, self.down_w = proxy, reader, writer
        self.up_w: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False
        self.deaf = False  # replies are dropped (a lose rule fired on this connection)
        self.replies_from = 0.0  # replies wait until this loop time (a hold_reply rule fired)

    async def run(self) -> None:
        await self.proxy.flowing.wait()  # a black-holed connection does not reach Redis
        if self.closed:
            return
        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(self.proxy.upstream_host, self.proxy.upstream_port), 5
            )
        except (OSError, TimeoutError):
            self.abort()
            return
        self.up_w = up_w
        if self.gone():  # dropped while it was connecting
            self.abort()
            return
        for r, w, requests in ((self.down_r, up_w, True), (up_r, self.down_w, False)):
            q: collections.deque[_Item] = collections.deque()
            ready = asyncio.Event()
            self.tasks.append(asyncio.ensure_future(self._read(r, q, ready, requests)))
            self.tasks.append(asyncio.ensure_future(self._write(w, q, ready)))
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _read(
        self,
        r: asyncio.StreamReader,
        q: collections.deque[_Item],
        ready: asyncio.Event,
        requests: bool,
    ) -> None:
        """Queue what arrives, each piece with the time it may leave; requests one by one (the rules
        apply to them), replies chunk by chunk."""
        loop = asyncio.get_running_loop()
        proxy = self.proxy
        buf = bytearray()
        last = 0.0
        try:
            while chunk := await r.read(65536):
                if not requests:
                    if self.deaf or proxy.deaf:
                        continue  # a reply lost on its way back
                    last = max(last, loop.time() + proxy.latency, self.replies_from)
                    q.append((last, chunk, None))
                    ready.set()
                    continue
                buf += chunk
                while True:
                    try:
                        end = request_end(buf)
                    except ValueError:  # not RESP after all: pass it on as it is
                        end = len(buf)
                    if end < 0:
                        break
                    request = bytes(buf[:end])
                    del buf[:end]
                    rule = next((x for x in proxy.rules if x.matches(request)), None)
                    wait = proxy.latency
                    if rule is not None and rule.hold_reply:
                        proxy.rules.remove(rule)  # once
                        self.replies_from = loop.time() + rule.hold_reply
                        rule.fired.set()
                        rule = None
                    if rule is not None and rule.lose:
                        proxy.rules.remove(rule)  # once
                        self.deaf = True
                        rule.fired.set()
                        loop.call_later(LOSE_AFTER, self.abort)
                        rule = None
                    if rule is not None:
                        if rule.cut:
                            proxy.rules.remove(rule)  # once
                        else:
                            wait += rule.delay
                            rule.fired.set()
                    last = max(last, loop.time() + wait)
                    q.append((last, request, rule if rule is not None and rule.cut else None))
                    ready.set()
        except (OSError, ConnectionError):
            self.abort()
            return
        q.append(None)
        ready.set()

    async def _write(
        self, w: asyncio.StreamWriter, q: collections.deque[_Item], ready: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not q:
                    ready.clear()
                    await ready.wait()
                    continue
                await self.proxy.flowing.wait()
                item = q[0]
                if item is None:  # EOF after everything before it
                    await w.drain()
                    self.abort()
                    return
                t, data, cut = item
                if t > loop.time():
                    await asyncio.sleep(t - loop.time())
                    continue
                q.popleft()
                if w.is_closing():  # the other side is gone (asyncio would log every write)
                    self.abort()
                    return
                w.write(data)
                if cut is not None:
                    await w.drain()
                    cut.fired.set()
                    await asyncio.sleep(0.05)  # let Redis read it before the connection goes
                    self.abort()
                    return
                if not q:
                    await w.drain()
        except (OSError, ConnectionError):
            self.abort()

    def gone(self) -> bool:
        return self.closed

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
    """Listens on a loopback port (a free one unless given) and forwards to Redis at `upstream_port`.
    Every method is called from the loop it was started on."""

    def __init__(
        self, name: str, upstream_port: int, *, upstream_host: str = HOST, port: int | None = None
    ) -> None:
        self.name, self.upstream_host, self.upstream_port = name, upstream_host, upstream_port
        self.port = port or free_port()
        self.latency = 0.0
        self.rules: list[Rule] = []
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pipes: set[_Pipe] = set()
        self.deaf = False
        self.accepted = self.dropped = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        pipe = _Pipe(self, reader, writer)
        self.pipes.add(pipe)
        await pipe.run()

    # -- faults
    def _add(self, rule: Rule) -> threading.Event:
        """Apply `rule` from now on; the event is set when it fires."""
        self.rules.append(rule)
        return rule.fired

    def cut_after(self, *needles: bytes) -> threading.Event:
        return self._add(Rule(needles, cut=True))

    def delay(self, seconds: float, *needles: bytes) -> threading.Event:
        return self._add(Rule(needles, delay=seconds))

    def lose_reply(self, *needles: bytes) -> threading.Event:
        return self._add(Rule(needles, lose=True))

    def hold_reply(self, seconds: float, *needles: bytes) -> threading.Event:
        return self._add(Rule(needles, hold_reply=seconds))

    def deafen(self, on: bool) -> None:
        """Replies dropped on every connection while on; turned off, every connection is reset (what
        was sent meanwhile ran, or is still running, and nobody heard back)."""
        if on:
            self.deaf = True
            return
        if self.deaf:
            self.drop_all()
            self.deaf = False

    def clear(self) -> None:
        self.rules.clear()

    def slow(self, seconds: float) -> None:
        self.latency = seconds

    def drop_all(self) -> int:
        """Reset every open connection; returns how many."""
        pipes = list(self.pipes)
        for p in pipes:
            p.abort()
        self.dropped += len(pipes)
        return len(pipes)

    def hold(self, on: bool) -> None:
        if on:
            self.flowing.clear()
        else:
            self.flowing.set()

    def heal(self, *, flush: bool = True) -> None:
        """Back to a plain pipe: no latency, no rules, flowing (after a reset when not `flush`)."""
        self.latency = 0.0
        self.rules.clear()
        self.deafen(False)
        if not self.flowing.is_set() and not flush:
            self.drop_all()
        self.flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop_all()
        self.flowing.set()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
