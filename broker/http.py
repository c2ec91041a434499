"""The broker's operational HTTP: /metrics, /healthz and /readyz for Prometheus and the kubelet, served
with aiohttp by a node, a worker of `--workers N` (on a Unix socket, for its supervisor) and the
supervisor (which asks its workers over those sockets)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

#: (method, path) -> (status line, content type, body)
Route = Callable[[str, str], Awaitable[tuple[str, str, bytes]]]


def app(route: Route) -> web.Application:
    """Every GET or HEAD path goes to `route`; other methods are 405."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="method not allowed\n", headers={"Allow": "GET, HEAD"})
        status, ctype, body = await route(request.method, request.path)
        return web.Response(status=int(status.split(" ", 1)[0]), body=body, headers={"Content-Type": ctype})

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", handle)
    return application


async def serve(route: Route, *, host: str = "", port: int = 0, unix: str | None = None) -> web.AppRunner:
    """Serve `route` on HOST:PORT, or on the Unix socket `unix`; stop it with `cleanup()`."""
    runner = web.AppRunner(app(route), access_log=None, handle_signals=False)
    await runner.setup()
    site: web.BaseSite
    if unix is not None:
        site = web.UnixSite(runner, unix)
    else:
        site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    return runner


async def get_unix(socket_path: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET `path` from a server on a Unix socket: (status code, body)."""
    connector = aiohttp.UnixConnector(path=socket_path)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.get(f"http://worker{path}") as response,
    ):
        return response.status, await response.read()
