"""The little HTTP a broker speaks: /metrics, /healthz, /readyz for Prometheus and the kubelet, served by
a node and, in multi-process mode, by the supervisor that asks its workers over Unix sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

#: (method, path) -> (status line, content type, body)
Route = Callable[[str, str], Awaitable[tuple[str, str, bytes]]]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def handler(route: Route) -> Handler:
    """A one-request-per-connection HTTP/1.1 handler around ``route``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"method not allowed\n"
            else:
                status, ctype, body = await route(method, path.split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if method == "GET" else b""))
            await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ValueError,
            ConnectionError,
        ):
            pass
        finally:
            writer.close()

    return handle


async def get_unix(socket_path: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``path`` from a server on a Unix socket: (status code, body)."""

    async def fetch() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: worker\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    return await asyncio.wait_for(fetch(), timeout)
