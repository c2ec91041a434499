"""The whole fleet as the management API sees it from any node: sessions from the store (every session of
the fleet is in Redis, the offline ones included), and what only a client's node knows (its connection,
its inflight window and queue) asked of that node (local.LocalApi, over cluster.Cluster.ask). A node that
does not answer leaves its clients listed as the store has them."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..banned import Ban
from ..codec import Prop
from ..message import Message
from ..store.base import Retain, SessionInfo
from ..topic import parse_share, topic_matches
from ..trace import TraceSpec
from . import models
from .local import LISTED, LocalApi, delivery, subscription

if TYPE_CHECKING:
    from ..node import Node


class NodeUnavailable(Exception):
    """The node a client is connected to did not answer."""


def _stored(info: SessionInfo) -> models.Client:
    return models.Client(
        clientid=info.client_id, username=info.username, node=info.node or None, zone=info.zone,
        connected=bool(info.node), peerhost=None, proto_ver=None, keepalive=None, connected_at=None,
        subscriptions_cnt=info.subscriptions, inflight_cnt=0, mqueue_len=info.queued,
        expiry_interval=info.expiry_interval,
    )  # fmt: skip


def matches(cid: str, zone: str, username: str | None, node: str | None, q: models.ClientQuery) -> bool:
    return (
        (q.zone is None or zone == q.zone)
        and (q.username is None or username == q.username)
        and (q.node is None or node == q.node)
        and (q.connected is None or bool(node) == q.connected)
        and (q.clientid is None or cid.startswith(q.clientid))
    )


class FleetView:
    def __init__(self, node: Node, local: LocalApi) -> None:
        self.node = node
        self.local = local

    async def _ask(self, node_id: str, ask: dict[str, Any]) -> Any:
        """A node's answer (this one's without a round trip); raises NodeUnavailable without one."""
        if node_id == self.node.node_id:
            body = await self.local.answer(json.dumps(ask).encode())
        elif self.node.cluster is None:
            raise NodeUnavailable(node_id)
        else:
            got = await self.node.cluster.ask(node_id, json.dumps(ask).encode())
            if got is None:
                raise NodeUnavailable(node_id)
            body = got
        out = json.loads(body)
        if isinstance(out, dict) and "error" in out:
            raise NodeUnavailable(f"{node_id}: {out['error']}")
        return out

    async def _live_nodes(self) -> list[str]:
        """The nodes whose heartbeat lasts now (read, not the reaper's last look: a node that just
        joined is asked too)."""
        cluster = self.node.cluster
        if cluster is None:
            return [self.node.node_id]
        return [node for node, alive, _info in await cluster.nodes() if alive]

    async def nodes(self) -> list[models.Node]:
        cluster = self.node.cluster
        if cluster is None:
            connections, sessions = self.node.cm.counts()
            uptime = time.time() - self.node.started_ms / 1000
            delivered = int(self.node.report()["delivered"])
            return [models.Node(node=self.node.node_id, status="running", connections=connections,
                                sessions=sessions, version=__version__, config_hash=self.node.config_hash,
                                uptime_s=round(uptime, 1), delivered=delivered, reported_at=time.time())]  # fmt: skip
        out = []
        for node_id, alive, info in await cluster.nodes():
            started = int(info.get("started_ms") or 0)
            reported = int(info.get("ts_ms") or 0)
            out.append(models.Node(
                node=node_id, status="running" if alive else "unreachable",
                connections=int(info.get("connections") or 0), sessions=int(info.get("sessions") or 0),
                version=info.get("version", ""), config_hash=info.get("config_hash", ""),
                uptime_s=round((reported - started) / 1000, 1) if started and reported else None,
                delivered=int(info.get("delivered") or 0), reported_at=reported / 1000 if reported else None,
            ))  # fmt: skip
        return out

    async def clients(self, q: models.ClientQuery) -> models.ClientList:
        nodes = [n for n in await self._live_nodes() if q.node is None or n == q.node]
        if q.connected is False:
            nodes = []  # (the store has every offline session)
        stored, *answers = await asyncio.gather(
            self.node.store.sessions(),
            *(self._ask(n, {"op": "clients"}) for n in nodes),
            return_exceptions=True,
        )
        if isinstance(stored, BaseException):
            raise stored
        # Filtered, sorted and counted as they come; only the page's become models (10,000 sessions).
        merged: dict[str, SessionInfo | dict[str, Any]] = {info.client_id: info for info in stored}
        for answer in answers:
            if isinstance(answer, NodeUnavailable):
                continue  # its clients stay as the store has them
            if isinstance(answer, BaseException):
                raise answer
            for c in answer:
                merged[c["clientid"]] = c
        found = sorted(
            cid
            for cid, c in merged.items()
            if (
                matches(cid, c.zone, c.username, c.node or None, q)
                if isinstance(c, SessionInfo)
                else matches(cid, c["zone"], c["username"], c["node"], q)
            )
        )
        first = (q.page - 1) * q.limit
        page = [
            _stored(c) if isinstance(c, SessionInfo) else models.Client.model_validate(c)
            for c in (merged[cid] for cid in found[first : first + q.limit])
        ]
        return models.ClientList(data=page, meta=models.Page(page=q.page, limit=q.limit, count=len(found)))

    async def _owner(self, client_id: str) -> str | None:
        if client_id in self.node.cm.channels:
            return self.node.node_id
        cluster = self.node.cluster
        if cluster is None:
            return None
        return await cluster.store.owner(client_id)

    async def detail(self, client_id: str) -> models.ClientDetail | None:
        owner = await self._owner(client_id)
        if owner:
            try:
                live = await self._ask(owner, {"op": "client", "clientid": client_id})
            except NodeUnavailable:
                live = None
            if live is not None:
                return models.ClientDetail.model_validate(live)
        stored = await self.node.store.session(client_id, LISTED)
        if stored is None:
            return None
        return models.ClientDetail(
            **_stored(stored.info).model_dump(),
            awaiting_rel_cnt=stored.info.awaiting_rel,
            subscriptions=[subscription(f, s) for f, s in stored.subscriptions],
            inflight=[],
            mqueue=[delivery(d) for d in stored.queue],
        )

    async def kick(self, client_id: str, discard: bool) -> bool:
        """Disconnect a client (0x98), and with `discard` end its session; False when the fleet has
        neither a connection nor a session of it."""
        owner = await self._owner(client_id)
        if (
            owner
            and (await self._ask(owner, {"op": "kick", "clientid": client_id, "discard": discard}))["kicked"]
        ):
            return True
        stored = await self.node.store.session(client_id, 0)
        if stored is None and client_id not in self.node.cm.offline:
            return False
        if discard:
            self.node.cm.end_session(client_id)
            await self.node.committer.drain()
        return True

    # -- bans ---------------------------------------------------------------------------------------
    async def bans(self) -> list[Ban]:
        await self.node.refresh_bans()
        return self.node.cm.banned.all(time.time())

    async def ban(self, ban: Ban) -> None:
        """Stored, then every node told at once (each also reads the bans with its next heartbeat)."""
        await self.node.ban(ban)
        await self._all_nodes({"op": "bans"})

    async def unban(self, key: str) -> bool:
        removed = await self.node.unban(key)
        await self._all_nodes({"op": "bans"})
        return removed

    # -- zones and bridges ----------------------------------------------------------------------
    async def zones(self) -> list[models.NodeZones]:
        nodes = await self._live_nodes()
        answers = await asyncio.gather(
            *(self._ask(n, {"op": "zones"}) for n in nodes), return_exceptions=True
        )
        return [models.NodeZones(node=n, **a) for n, a in zip(nodes, answers, strict=True)
                if not isinstance(a, BaseException)]  # fmt: skip

    async def bridges(self) -> list[models.Bridge]:
        cluster = self.node.cluster
        if cluster is None:
            rows = [(self.node.node_id, True, {"bridges": json.dumps(self.node.bridge_summaries())})]
        else:
            rows = await cluster.nodes()
        out = []
        for node_id, alive, info in rows:
            if not alive:
                continue
            for name, b in sorted(json.loads(info.get("bridges") or "{}").items()):
                out.append(models.Bridge(bridge=name, node=node_id, **b))
        return out

    # -- traces ------------------------------------------------------------------------------------
    async def _all_nodes(self, ask: dict[str, Any]) -> None:
        others = [n for n in await self._live_nodes() if n != self.node.node_id]
        await asyncio.gather(*(self._ask(n, ask) for n in others), return_exceptions=True)

    async def trace(self, spec: TraceSpec) -> None:
        await self.node.put_trace(spec)
        await self._all_nodes({"op": "traces"})

    async def untrace(self, name: str) -> bool:
        removed = await self.node.delete_trace(name)
        await self._all_nodes({"op": "traces"})
        return removed

    async def flush_traces(self) -> None:
        """Every node writes what its traces hold now (else within trace flush interval)."""
        await self.node.flush_traces()
        await self._all_nodes({"op": "flush_traces"})

    # -- topics ---------------------------------------------------------------------------------------
    def subscribers(self, topic: str) -> list[models.Subscriber]:
        """Every subscription whose filter matches `topic` (each node keeps the whole fleet's routes)."""
        router = self.node.router
        out = []
        for cid in router.clients():
            for topic_filter, sub in router.subscriptions(cid).items():
                group, real = parse_share(topic_filter)
                if topic_matches(real, topic):
                    out.append(models.Subscriber(
                        clientid=cid, qos=sub.qos, no_local=sub.no_local,
                        retain_as_published=sub.retain_as_published, subscription_id=sub.sub_id,
                        shared=group is not None,
                    ))  # fmt: skip
        return sorted(out, key=lambda s: s.clientid)

    def retained(self, q: models.RetainedQuery) -> models.RetainedList:
        found = sorted(self.node.retained.match(q.topic, time.time()), key=lambda m: m.topic)
        first = (q.page - 1) * q.limit
        data = [
            models.RetainedMessage(
                topic=m.topic,
                qos=m.qos,
                payload=base64.b64encode(m.payload).decode(),
                payload_size=len(m.payload),
                published_at=m.ts,
                expires_at=m.expires_at,
            )
            for m in found[first : first + q.limit]
        ]
        return models.RetainedList(data=data, meta=models.Page(page=q.page, limit=q.limit, count=len(found)))

    async def delete_retained(self, topic: str) -> bool:
        """Clear a topic's retained message fleet-wide without sending anything to its subscribers."""
        if not self.node.retained.match(topic, time.time()):
            return False
        msg = Message(topic, b"", 0, True, sender="")
        self.node.retained.put(msg)
        if self.node.store.durable:
            self.node.committer.add(Retain(msg))
            await self._committed()
        return True

    async def publish(self, req: models.PublishRequest, zone: str) -> int:
        """Route a message as a client of `zone` would; returns the sessions matched once it is stored as
        a PUBACK would need it to be."""
        p = req.properties
        props: dict[int, Any] = {}
        if p.payload_format_indicator is not None:
            props[Prop.PAYLOAD_FORMAT_INDICATOR] = p.payload_format_indicator
        if p.content_type is not None:
            props[Prop.CONTENT_TYPE] = p.content_type
        if p.response_topic is not None:
            props[Prop.RESPONSE_TOPIC] = p.response_topic
        if p.correlation_data is not None:
            props[Prop.CORRELATION_DATA] = base64.b64decode(p.correlation_data)
        if p.user_properties:
            props[Prop.USER_PROPERTY] = list(p.user_properties.items())
        expiry = p.message_expiry_interval
        msg = Message(req.topic, req.payload_bytes(), req.qos, req.retain, props or None, "", expiry)
        matched, needs_commit = self.node.cm.publish(msg, zone)
        if needs_commit:
            await self._committed()
        return matched

    async def _committed(self) -> None:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def settle(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        self.node.cm.after_commit(settle)
        if not await done:
            raise StoreUnavailable("the session store did not take the message: not stored, send it again")


class StoreUnavailable(Exception):
    """A write the answer waits for failed."""
