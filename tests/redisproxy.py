"""The chaos harness's Redis proxy (chaos/proxy.py) for tests that steer it from their own thread, to put a
fault at a chosen point. It runs on an asyncio loop of its own in a thread; every method here is called from
the test's thread and returns once the proxy has applied it.

    proxy = RedisProxy(redis_server.port)    # nodes use proxy.url
    proxy.cut_after(b"EVALSHA", b"abc...")   # the next pipeline holding that script is cut right after it
    proxy.lose_reply(b"EVALSHA", b"abc...")  # it runs, its reply never comes back, the connection is reset
    proxy.delay(0.3, b"EVALSHA", b"abc...")  # requests holding all the given byte strings wait 0.3 s
    proxy.drop_all(); proxy.hold(True)
    proxy.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from chaos.proxy import Proxy, request_end

__all__ = ["RedisProxy", "request_end"]

T = TypeVar("T")


class RedisProxy:
    def __init__(self, redis_port: int, redis_host: str = "127.0.0.1") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redis-proxy", daemon=True)
        self._thread.start()
        self._proxy: Proxy = asyncio.run_coroutine_threadsafe(
            self._start(redis_port, redis_host), self._loop
        ).result(5)
        self.port = self._proxy.port

    async def _start(self, redis_port: int, redis_host: str) -> Proxy:
        proxy = Proxy("redis-proxy", redis_port, upstream_host=redis_host)
        await proxy.start()
        return proxy

    @property
    def url(self) -> str:
        return self._proxy.url

    def _call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(5)

    def cut_after(self, *needles: bytes) -> threading.Event:
        """Cut the connection of the next request holding every needle right after forwarding it (what
        follows it in the same pipeline never reaches Redis). The event is set when it happened."""
        return self._call(lambda: self._proxy.cut_after(*needles))

    def lose_reply(self, *needles: bytes) -> threading.Event:
        """The next request holding every needle reaches Redis (and what follows it on its connection), but
        no reply comes back on that connection, which is reset a moment later: Redis ran it, the node cannot
        know. The event is set when it was forwarded."""
        return self._call(lambda: self._proxy.lose_reply(*needles))

    def hold_reply(self, seconds: float, *needles: bytes) -> threading.Event:
        """The next request holding every needle reaches Redis at once, but its reply (and what follows on
        its connection) comes back `seconds` later: later than what other connections carry meanwhile."""
        return self._call(lambda: self._proxy.hold_reply(seconds, *needles))

    def deafen(self, on: bool) -> None:
        """While on, every connection's requests reach Redis and no reply comes back; off, all are reset."""
        self._call(lambda: self._proxy.deafen(on))

    def delay(self, seconds: float, *needles: bytes) -> threading.Event:
        """Hold every request holding all needles (and what follows on its connection) for `seconds`."""
        return self._call(lambda: self._proxy.delay(seconds, *needles))

    def clear(self) -> None:
        self._call(self._proxy.clear)

    def drop_all(self) -> None:
        """Reset every connection now (both sides see it closed)."""
        self._call(self._proxy.drop_all)

    def hold(self, on: bool) -> None:
        """A black hole while on: connections stay open but nothing is forwarded either way."""
        self._call(lambda: self._proxy.hold(on))

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._proxy.close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
