"""The management API's HTTP side (aiohttp): one route table that both serves the requests and writes the
OpenAPI document, API keys checked by role, and every error as application/problem+json."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from .. import __version__
from ..apikeys import ApiKey, ApiKeys
from ..banned import Ban
from ..topic import valid_filter, valid_topic
from ..trace import TraceSpec
from . import models
from .fleet import FleetView, NodeUnavailable, StoreUnavailable
from .local import LocalApi
from .openapi import document

if TYPE_CHECKING:
    from ..node import Node

log = logging.getLogger("fleetmq.api")

PREFIX = "/api/v1"
CONSOLE = Path(__file__).parent / "console"  # the web console's files (package data)
PROBLEM = "application/problem+json"
KEY = web.RequestKey("key", ApiKey)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[Api, web.Request], Awaitable[web.StreamResponse]]
    summary: str
    answer: type[BaseModel] | None  # the 200 answer's model (None: 204)
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None  # the JSON body's model
    created: bool = False  # answered 201 (with the answer model), not 200
    ndjson: bool = False  # answered with JSON lines
    public: bool = False  # served without a key (the OpenAPI document)

    @property
    def operation_id(self) -> str:
        return self.handler.__name__


class Problem(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def problem(status: int, detail: str, path: str, headers: dict[str, str] | None = None) -> web.Response:
    body = models.Problem(title=HTTPStatus(status).phrase, status=status, detail=detail, instance=path)
    return web.Response(status=status, text=body.model_dump_json(), content_type=PROBLEM, headers=headers)


def validation_detail(e: ValidationError, where: str) -> str:
    """Each error with the field's path: `query parameter page: Input should be greater than 0`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(the whole)"
        parts.append(f"{where} {loc}: {err['msg']}")
    return "; ".join(parts)


def parse_query(model: type[BaseModel], request: web.Request) -> Any:
    params: dict[str, str] = {}
    for name in request.query:
        values = request.query.getall(name)
        if len(values) > 1:
            raise Problem(400, f"query parameter {name}: given {len(values)} times")
        params[name] = values[0]
    try:
        return model.model_validate(params)
    except ValidationError as e:
        raise Problem(400, validation_detail(e, "query parameter")) from e


async def parse_body(model: type[BaseModel], request: web.Request) -> Any:
    if request.content_type != "application/json":
        raise Problem(415, f"the body must be application/json, not {request.content_type or 'none'}")
    try:
        data = await request.json()
    except ValueError as e:
        raise Problem(400, f"the body is not JSON: {e}") from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise Problem(400, validation_detail(e, "body")) from e


def ok(answer: BaseModel) -> web.Response:
    return web.Response(text=answer.model_dump_json(), content_type="application/json")


class Api:
    def __init__(self, node: Node, keys: ApiKeys, local: LocalApi) -> None:
        self.node = node
        self.keys = keys
        self.fleet = FleetView(node, local)

    # -- routes ---------------------------------------------------------------------------------
    async def get_nodes(self, request: web.Request) -> web.StreamResponse:
        return ok(models.NodeList(data=await self.fleet.nodes()))

    async def get_clients(self, request: web.Request) -> web.StreamResponse:
        return ok(await self.fleet.clients(parse_query(models.ClientQuery, request)))

    async def get_client(self, request: web.Request) -> web.StreamResponse:
        cid = request.match_info["clientid"]
        found = await self.fleet.detail(cid)
        if found is None:
            raise Problem(404, f"no client {cid!r}: not connected to any node and no session")
        return ok(found)

    async def get_client_subscriptions(self, request: web.Request) -> web.StreamResponse:
        cid = request.match_info["clientid"]
        found = await self.fleet.detail(cid)
        if found is None:
            raise Problem(404, f"no client {cid!r}: not connected to any node and no session")
        return ok(models.SubscriptionList(data=found.subscriptions))

    async def delete_client(self, request: web.Request) -> web.StreamResponse:
        cid = request.match_info["clientid"]
        q = parse_query(models.KickQuery, request)
        if not await self.fleet.kick(cid, q.session == "discard"):
            raise Problem(404, f"no client {cid!r}: not connected to any node and no session")
        return web.Response(status=204)

    async def get_subscriptions(self, request: web.Request) -> web.StreamResponse:
        q = parse_query(models.TopicQuery, request)
        return ok(models.SubscriberList(data=self.fleet.subscribers(q.topic)))

    async def get_retained(self, request: web.Request) -> web.StreamResponse:
        q = parse_query(models.RetainedQuery, request)
        if not valid_filter(q.topic):
            raise Problem(400, f"query parameter topic: {q.topic!r} is not a valid topic filter")
        return ok(self.fleet.retained(q))

    async def delete_retained(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        if not valid_topic(topic):
            raise Problem(400, f"{topic!r} is not a topic name (no + or #)")
        if not await self.fleet.delete_retained(topic):
            raise Problem(404, f"no retained message on {topic!r}")
        return web.Response(status=204)

    async def post_publish(self, request: web.Request) -> web.StreamResponse:
        req: models.PublishRequest = await parse_body(models.PublishRequest, request)
        key = request[KEY]
        zone_name = key.zone or "default"
        if key.zone is not None:
            zone = self.node.zones.get(key.zone)
            if zone is None:
                raise Problem(
                    403, f"key {key.name!r} is bound to zone {key.zone!r}, which this fleet has not"
                )
            if zone.acl is not None and not zone.acl.bind(key.name, f"api:{key.name}").can_publish(req.topic):
                raise Problem(
                    403, f"zone {key.zone!r}'s ACL does not let key {key.name!r} publish on {req.topic!r}"
                )
        return ok(models.Published(matched=await self.fleet.publish(req, zone_name)))

    async def get_banned(self, request: web.Request) -> web.StreamResponse:
        return ok(models.BannedList(data=await self.fleet.bans()))

    async def post_banned(self, request: web.Request) -> web.StreamResponse:
        req: models.BanRequest = await parse_body(models.BanRequest, request)
        try:
            ban = req.ban(request[KEY].name, time.time())
        except ValueError as e:
            raise Problem(400, f"body {e}") from e
        await self.fleet.ban(ban)
        return web.Response(status=201, text=ban.model_dump_json(), content_type="application/json")

    async def delete_banned(self, request: web.Request) -> web.StreamResponse:
        kind, who = request.match_info["as"], request.match_info["who"]
        if kind not in ("clientid", "username", "peerhost"):
            raise Problem(400, f"{kind!r} is none of clientid, username, peerhost")
        if not await self.fleet.unban(f"{kind}:{who}"):
            raise Problem(404, f"no ban of {kind} {who!r}")
        return web.Response(status=204)

    async def post_trace(self, request: web.Request) -> web.StreamResponse:
        req: models.TraceRequest = await parse_body(models.TraceRequest, request)
        if any(s.name == req.name for s, _n in await self.node.trace_specs()):
            raise Problem(409, f"a trace named {req.name!r} exists: DELETE it first")
        now = time.time()
        spec = TraceSpec(name=req.name, kind="clientid" if req.clientid is not None else "topic",
                         filter=req.clientid or req.topic or "", start=now, end=now + req.duration,
                         payload_limit=req.payload_limit)  # fmt: skip
        if spec.kind == "topic" and not valid_filter(spec.filter):
            raise Problem(400, f"body topic: {spec.filter!r} is not a valid topic filter")
        await self.fleet.trace(spec)
        return web.Response(
            status=201, text=_trace(spec, 0, now).model_dump_json(), content_type="application/json"
        )

    async def get_traces(self, request: web.Request) -> web.StreamResponse:
        now = time.time()
        return ok(models.TraceList(data=[_trace(s, n, now) for s, n in await self.node.trace_specs()]))

    async def get_trace(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if not any(s.name == name for s, _n in await self.node.trace_specs()):
            raise Problem(404, f"no trace named {name!r}")
        await self.fleet.flush_traces()
        lines = await self.node.trace_lines(name)
        body = "".join(line + "\n" for line in lines)
        return web.Response(text=body, content_type="application/x-ndjson",
                            headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'})  # fmt: skip

    async def delete_trace(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if not await self.fleet.untrace(name):
            raise Problem(404, f"no trace named {name!r}")
        return web.Response(status=204)

    async def get_zones(self, request: web.Request) -> web.StreamResponse:
        return ok(models.ZonesAnswer(data=await self.fleet.zones()))

    async def get_bridges(self, request: web.Request) -> web.StreamResponse:
        return ok(models.BridgeList(data=await self.fleet.bridges()))

    async def get_openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(document(ROUTES, __version__))

    # -- the app --------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            route: Route | None = getattr(handler, "route", None)
            if route is not None and not route.public:
                request[KEY] = self._authorize(request)
            return await handler(request)
        except Problem as p:
            return problem(p.status, p.detail, request.path, p.headers)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            detail = e.text if e.text and e.text != f"{e.status}: {e.reason}" else e.reason
            return problem(e.status, f"{request.method} {request.path}: {detail}", request.path)
        except NodeUnavailable as e:
            return problem(503, f"a node of the fleet did not answer: {e}", request.path)
        except StoreUnavailable as e:
            return problem(503, str(e), request.path)
        except Exception as e:  # said as a problem and logged; the node goes on
            log.exception("management API: %s %s failed", request.method, request.path)
            return problem(500, f"{type(e).__name__}: {e}", request.path)

    def _authorize(self, request: web.Request) -> ApiKey:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        challenge = {"WWW-Authenticate": 'Bearer realm="fleetmq"'}
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(401, "no API key: send Authorization: Bearer <key>", challenge)
        self.keys.reload()
        key = self.keys.check(token.strip())
        if key is None:
            raise Problem(401, "unknown API key", challenge)
        if key.role != "admin" and request.method not in ("GET", "HEAD"):
            raise Problem(403, f"key {key.name!r} is a viewer: it may only GET")
        return key

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        for route in ROUTES:
            app.router.add_route(route.method, route.path, _bound(self, route))
        # the web console: static files, public (the page asks for a key and sends it with each call)
        app.router.add_get("/", console_page)
        app.router.add_static("/console/", CONSOLE, append_version=False)
        app.on_response_prepare.append(_security_headers)
        return app


def _trace(spec: TraceSpec, records: int, now: float) -> models.Trace:
    return models.Trace(name=spec.name, kind=spec.kind, filter=spec.filter, start=spec.start, end=spec.end,
                        payload_limit=spec.payload_limit, status="running" if spec.active(now) else "stopped",
                        records=records)  # fmt: skip


async def console_page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(CONSOLE / "index.html")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The console's pages run only the console's own script, and in no one else's frame."""
    response.headers.setdefault("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")


def _bound(api: Api, route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await route.handler(api, request)

    handle.route = route  # type: ignore[attr-defined]  # (read by the guard: public or not)
    return handle


ROUTES: list[Route] = [
    Route("GET", f"{PREFIX}/nodes", Api.get_nodes, "Every node of the fleet", models.NodeList),
    Route("GET", f"{PREFIX}/clients", Api.get_clients, "Clients of the fleet, connected or with a session",
          models.ClientList, models.ClientQuery),
    Route("GET", f"{PREFIX}/clients/{{clientid}}", Api.get_client, "A client and its session",
          models.ClientDetail),
    Route("GET", f"{PREFIX}/clients/{{clientid}}/subscriptions", Api.get_client_subscriptions,
          "A client's subscriptions", models.SubscriptionList),
    Route("DELETE", f"{PREFIX}/clients/{{clientid}}", Api.delete_client,
          "Disconnect a client (MQTT 5: 0x98), and with session=discard end its session", None,
          models.KickQuery),
    Route("GET", f"{PREFIX}/subscriptions", Api.get_subscriptions, "Who would receive a message on a topic",
          models.SubscriberList, models.TopicQuery),
    Route("GET", f"{PREFIX}/retained", Api.get_retained, "Retained messages under a topic filter",
          models.RetainedList, models.RetainedQuery),
    Route("DELETE", f"{PREFIX}/retained/{{topic:.+}}", Api.delete_retained,
          "Clear a topic's retained message (nothing is sent to subscribers)", None),
    Route("POST", f"{PREFIX}/publish", Api.post_publish,
          "Publish; at QoS 1 and 2 answered once stored, as a PUBACK is", models.Published, body=models.PublishRequest),
    Route("GET", f"{PREFIX}/banned", Api.get_banned, "The fleet's bans", models.BannedList),
    Route("POST", f"{PREFIX}/banned", Api.post_banned,
          "Ban a client id, username or address: refused at CONNECT (0x8A), disconnected if connected (0x98)",
          Ban, body=models.BanRequest, created=True),
    Route("DELETE", f"{PREFIX}/banned/{{as}}/{{who}}", Api.delete_banned, "Lift a ban", None),
    Route("POST", f"{PREFIX}/traces", Api.post_trace,
          "Trace a client id's packets or a topic filter's PUBLISHes on every node, for a while",
          models.Trace, body=models.TraceRequest, created=True),
    Route("GET", f"{PREFIX}/traces", Api.get_traces, "The traces, running and stopped", models.TraceList),
    Route("GET", f"{PREFIX}/traces/{{name}}", Api.get_trace,
          "What a trace recorded: JSON lines, each packet as a node saw it", None, ndjson=True),
    Route("DELETE", f"{PREFIX}/traces/{{name}}", Api.delete_trace, "Stop a trace and delete its records", None),
    Route("GET", f"{PREFIX}/zones", Api.get_zones, "Each node's zones as it applied them", models.ZonesAnswer),
    Route("GET", f"{PREFIX}/bridges", Api.get_bridges, "Each bridge as the nodes report it", models.BridgeList),
    Route("GET", f"{PREFIX}/openapi.json", Api.get_openapi, "This document", None, public=True),
]  # fmt: skip
