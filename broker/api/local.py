"""What only this node can tell or do for the management API: its connections. Any node's API asks it
through the fleet's node channels (cluster.Cluster.ask); the node serving a request asks itself directly.
Requests and answers are JSON: {"op": ...} in, a JSON value out."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import models

if TYPE_CHECKING:
    from ..channel import Channel
    from ..message import Delivery
    from ..node import Node
    from ..router import Subscription

LISTED = 100  # entries of a session's inflight and queue in a client's detail


def peerhost(peer: str) -> str | None:
    host, sep, _port = peer.rpartition(":")
    return (host.strip("[]") or None) if sep else (peer or None)


def subscription(topic_filter: str, sub: Subscription) -> models.Subscription:
    return models.Subscription(
        topic=topic_filter, qos=sub.qos, no_local=sub.no_local, retain_as_published=sub.retain_as_published,
        retain_handling=sub.retain_handling, subscription_id=sub.sub_id,
    )  # fmt: skip


def delivery(d: Delivery) -> models.Delivery:
    return models.Delivery(topic=d.msg.topic, qos=d.qos, packet_id=d.packet_id or None,
                           payload_size=len(d.msg.payload))  # fmt: skip


class LocalApi:
    def __init__(self, node: Node) -> None:
        self.node = node

    def client(self, ch: Channel) -> models.Client:
        s = ch.session
        assert s is not None
        clock = ch.clock
        return models.Client(
            clientid=ch.client_id, username=ch.username, node=self.node.node_id, zone=ch.zone_name,
            connected=True, peerhost=peerhost(ch.peer), proto_ver=ch.version,
            keepalive=ch.keepalive.interval if ch.keepalive is not None else 0,
            connected_at=round(clock.wall() - (clock.time() - ch.connected_at), 3),
            subscriptions_cnt=len(s.subscriptions), inflight_cnt=len(s.inflight), mqueue_len=len(s.mqueue),
            expiry_interval=s.expiry_interval,
        )  # fmt: skip

    def clients(self) -> list[models.Client]:
        return [self.client(ch) for ch in list(self.node.cm.channels.values()) if ch.session is not None]

    def detail(self, client_id: str) -> models.ClientDetail | None:
        ch = self.node.cm.channels.get(client_id)
        if ch is None or ch.session is None:
            return None
        s = ch.session
        return models.ClientDetail(
            **self.client(ch).model_dump(),
            awaiting_rel_cnt=len(s.awaiting_rel),
            subscriptions=[subscription(f, sub) for f, sub in sorted(s.subscriptions.items())],
            inflight=[delivery(d) for d in list(s.inflight.values())[:LISTED]],
            mqueue=[delivery(d) for d in list(s.mqueue)[:LISTED]],
        )

    def zones(self) -> dict[str, dict[str, Any]]:
        """The zones as this node applied them; an http authenticator's header values hidden (keys)."""
        out = {}
        for name, zone in sorted(self.node.config.zones.items()):
            settings = zone.model_dump(mode="json", by_alias=True)
            for auth in settings.get("authentication") or []:
                for field in ("headers",):
                    if isinstance(auth.get(field), dict):
                        auth[field] = {k: "<hidden>" for k in auth[field]}
            out[name] = settings
        return out

    async def answer(self, body: bytes) -> bytes:
        """An Ask from another node's API (cluster.Cluster.answer)."""
        ask: dict[str, Any] = json.loads(body)
        op = ask.get("op")
        out: Any
        if op == "clients":
            out = [c.model_dump() for c in self.clients()]
        elif op == "client":
            found = self.detail(str(ask["clientid"]))
            out = found.model_dump() if found is not None else None
        elif op == "bans":
            out = {"kicked": await self.node.refresh_bans()}
        elif op == "zones":
            out = {"config_hash": self.node.config_hash, "zones": self.zones()}
        elif op == "traces":
            await self.node.refresh_traces()
            out = {"running": sorted(self.node.tracers)}
        elif op == "flush_traces":
            await self.node.flush_traces()
            out = {"flushed": True}
        elif op == "kick":
            out = {"kicked": self.node.cm.kick(str(ask["clientid"]), bool(ask.get("discard")))}
        else:
            out = {"error": f"unknown op {op!r}"}
        return json.dumps(out).encode()
