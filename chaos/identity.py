"""The platform's identity service for a chaos run with --identity: an HTTP authentication and ACL
service (broker.authn.http's protocol) that allows every client and every (action, topic), and counts
what it is asked. With it each node asks it at CONNECT and per topic (cached), and counts its user's
connections over the fleet in Redis (max_connections_per_user): the paths that must keep working while
the store fails."""

from __future__ import annotations

import collections
from typing import Any

from aiohttp import web

from chaos.proxy import free_port

HOST = "127.0.0.1"
USERNAME = "chaos"


class IdentityService:
    def __init__(self) -> None:
        self.port = free_port()
        self.asked: collections.Counter[str] = collections.Counter()
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        self.asked[request.path] += 1
        return web.json_response({"result": "allow"})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/auth", self._answer)
        app.router.add_post("/acl", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def zone(self, clients: int) -> dict[str, Any]:
        """The zone settings that put the service and the fleet-wide connection quota on every CONNECT:
        the quota is the number of clients, all of one user, so a connection counted twice (a takeover,
        a node killed with its clients) refuses one that belongs."""
        base = f"http://{HOST}:{self.port}"
        return {
            "authentication": [
                {"mechanism": "http", "url": f"{base}/auth", "acl_url": f"{base}/acl", "timeout": "2s",
                 "cache_ttl": "5s", "body": {"clientid": "%c", "username": "%u"}},
            ],
            "max_connections_per_user": clients,
        }  # fmt: skip
