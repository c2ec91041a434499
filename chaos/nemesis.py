"""The nemesis: faults chosen by a seeded RNG, one at a time, each healed before the next, on a timeline.

Every step draws the same number of values from the RNG whatever the fleet's state, so a seed always
gives the same sequence of fault kinds, durations and target indexes; only which live client or node an
index lands on depends on timing.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Protocol

from chaos.client import Client
from chaos.history import History
from chaos.procs import Node, Redis
from chaos.proxy import Proxy

KINDS = (
    "node-kill",  # kill -9 a node, restart it after a while (same config, ports, log)
    "node-pause",  # SIGSTOP a node, SIGCONT after a while (some pauses outlast the heartbeat TTL)
    "redis-kill",  # kill -9 redis-server, restart it on the same port and data dir (AOF)
    "redis-pause",  # SIGSTOP redis-server, SIGCONT after a while
    "redis-term",  # SIGTERM a Redis (a primary): a graceful shutdown, as a pod deletion or a node drain does
    "takeover",  # a client connects to another node while its old connection is still open
    "proxy-drop",  # reset the Redis connections of one node or of all
    "proxy-blackhole",  # forward nothing between one node (or all) and Redis for a while
    "proxy-delay",  # delay everything between one node (or all) and Redis
    "reply-lost",  # Redis gets and runs what one node (or all) sends, no reply comes back, then a reset
    "primary-kill",  # kill -9 a primary (Sentinel's, or a cluster shard's), restart it (it comes back a replica)
    "failover",  # a graceful switch to a replica (SENTINEL FAILOVER, CLUSTER FAILOVER)
    "replica-lag",  # SIGSTOP a replica, SIGCONT after a while (WAIT for it times out meanwhile)
)
PROXY_KINDS = ("proxy-drop", "proxy-blackhole", "proxy-delay", "reply-lost")
REPLICATED_KINDS = ("primary-kill", "failover", "replica-lag")
REDIS_KINDS = ("redis-kill", "redis-pause", "redis-term", *PROXY_KINDS, *REPLICATED_KINDS)
# named sets: the faults of the nodes alone, and those of Redis and the way to it (issue 13 found every
# failure after a Redis outage)
PRESETS = {
    "all": KINDS,
    "nodes": ("node-kill", "node-pause", "takeover"),
    "redis": REDIS_KINDS,
}


def applicable(kind: str, store: str) -> bool:
    """Whether a fault means something for a fleet on `store` (the run options' store): proxies stand only
    before a single redis-server, replicas only in Sentinel and Cluster setups, no Redis in memory."""
    if store == "memory":
        return kind not in REDIS_KINDS
    if store == "redis":
        return kind not in REPLICATED_KINDS
    return kind not in PROXY_KINDS


def parse_kinds(spec: str) -> list[str]:
    """A comma-separated list of kinds and preset names ("none" for no faults), in KINDS order."""
    if spec in ("none", ""):
        return []
    kinds: list[str] = []
    for k in (k.strip() for k in spec.split(",") if k.strip()):
        kinds += PRESETS.get(k, (k,))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return [k for k in KINDS if k in kinds]


@dataclass
class Step:
    """One planned fault: drawn from the RNG before it is known what it will land on."""

    gap: float  # healthy seconds before it
    kind: str
    pick: float  # which node / client / Redis (an index into the live ones)
    pick2: float  # the takeover's destination node
    duration: float
    all_nodes: bool  # proxy faults: every node's proxy, or one
    flush: bool  # proxy-blackhole: deliver what was held when healed, or reset the connections
    latency: float  # proxy-delay


class Fleet(Protocol):
    nodes: list[Node]
    redis: list[Redis]
    proxies: dict[str, Proxy]
    clients: list[Client]

    def live_nodes(self) -> list[Node]: ...

    async def start_node(self, node: Node) -> None: ...

    async def primaries(self) -> list[Redis]: ...

    async def replicas(self) -> list[Redis]: ...

    async def failover(self, pick: float) -> str: ...

    async def start_redis(self, rs: Redis) -> None: ...

    async def store_whole(self, timeout: float) -> bool:
        """Until the store is back to full redundancy (every replica linked and caught up); False if it
        was not within `timeout`."""
        ...


#: how long a Redis fault waits for the store to be whole again after the last one
WHOLE_TIMEOUT = 30.0


class Nemesis:
    def __init__(
        self,
        fleet: Fleet,
        history: History,
        seed: int,
        kinds: list[str],
        *,
        gap: tuple[float, float] = (1.0, 4.0),
        max_down: float = 8.0,
    ):
        self.fleet, self.history, self.kinds = fleet, history, kinds
        self.rng = random.Random(f"nemesis:{seed}")
        self.gap, self.max_down = gap, max_down

    def plan(self) -> Step:
        r = self.rng
        return Step(
            gap=r.uniform(*self.gap),
            kind=r.choice(self.kinds),
            pick=r.random(),
            pick2=r.random(),
            duration=r.uniform(0.5, self.max_down),
            all_nodes=r.random() < 0.5,
            flush=r.random() < 0.5,
            latency=r.choice((0.02, 0.05, 0.1, 0.25, 0.5, 1.0)),
        )

    async def run(self, until: float) -> None:
        """Inject faults until `until` (History time); a fault under way is healed when time is up."""
        while True:
            if not self.kinds:
                await asyncio.sleep(max(0.0, until - self.history.now()))
                return
            step = self.plan()
            if self.history.now() + step.gap >= until - 0.5:
                await asyncio.sleep(max(0.0, until - self.history.now()))
                return
            if step.kind in REDIS_KINDS and self.history.now() < until - 0.5:
                # One failure at a time: wait_replicas 1 makes a write survive the loss of its primary, not
                # that of the replica that confirmed it before another has it too. A Redis fault lands only
                # once the last one has healed all the way (every replica in sync), then the gap begins.
                t0 = self.history.now()
                whole = await self.fleet.store_whole(min(WHOLE_TIMEOUT, max(0.0, until - t0)))
                if self.history.now() - t0 >= 1.0 or not whole:
                    self.history.notes.append(
                        f"{self.history.now():.3f} the store {'was whole' if whole else 'was still not whole'} "
                        f"after {self.history.now() - t0:.1f}s; {step.kind} next"
                    )
                if self.history.now() + step.gap >= until - 0.5:
                    await asyncio.sleep(max(0.0, until - self.history.now()))
                    return
            await asyncio.sleep(step.gap)
            await self.inject(step, until)

    async def inject(self, step: Step, until: float) -> None:
        h, fleet = self.history, self.fleet
        hold = min(step.duration, max(0.0, until - h.now()))
        if step.kind in ("node-kill", "node-pause"):
            live = fleet.live_nodes()
            if len(live) < 2:  # never the last node: clients need somewhere to go
                return
            node = live[int(step.pick * len(live))]
            if step.kind == "node-kill":
                f = h.fault("node-kill", node.name, f"pid {node.pid}, down {hold:.1f}s")
                node.kill()
                await asyncio.sleep(hold)
                await fleet.start_node(node)
                h.healed(f, f"new pid {node.pid}")
            else:
                f = h.fault("node-pause", node.name, f"SIGSTOP {hold:.1f}s")
                node.pause()
                await asyncio.sleep(hold)
                node.resume()
                h.healed(f)
        elif step.kind == "redis-term":
            servers = await fleet.primaries() if len(fleet.redis) > 1 else fleet.redis
            if not servers:
                return
            rs = servers[int(step.pick * len(servers))]
            f = h.fault("redis-term", rs.name, f"pid {rs.pid} SIGTERM, down {hold:.1f}s")
            code = await rs.terminate()
            await asyncio.sleep(hold)
            await fleet.start_redis(rs)
            h.healed(f, f"exited {code}; new pid {rs.pid}")
        elif step.kind in ("redis-kill", "redis-pause"):
            rs = fleet.redis[int(step.pick * len(fleet.redis))]
            if step.kind == "redis-kill":
                f = h.fault("redis-kill", rs.name, f"pid {rs.pid}, down {hold:.1f}s")
                rs.kill()
                await asyncio.sleep(hold)
                await fleet.start_redis(rs)
                h.healed(f, f"new pid {rs.pid}")
            else:
                f = h.fault("redis-pause", rs.name, f"SIGSTOP {hold:.1f}s")
                rs.pause()
                await asyncio.sleep(hold)
                rs.resume()
                h.healed(f)
        elif step.kind in ("primary-kill", "replica-lag"):
            servers = await (fleet.primaries() if step.kind == "primary-kill" else fleet.replicas())
            if not servers:
                return
            rs = servers[int(step.pick * len(servers))]
            if step.kind == "primary-kill":
                f = h.fault("primary-kill", rs.name, f"pid {rs.pid}, down {hold:.1f}s")
                rs.kill()
                await asyncio.sleep(hold)
                await fleet.start_redis(rs)
                h.healed(f, f"new pid {rs.pid}")
            else:
                f = h.fault("replica-lag", rs.name, f"SIGSTOP {hold:.1f}s")
                rs.pause()
                await asyncio.sleep(hold)
                rs.resume()
                h.healed(f)
        elif step.kind == "failover":
            f = h.fault("failover", "redis", await fleet.failover(step.pick))
            await asyncio.sleep(max(hold, 2.0))  # (the switch and the nodes following it)
            h.healed(f)
        elif step.kind == "takeover":
            clients = [c for c in fleet.clients if c.link is not None]
            if not clients:
                return
            c = clients[int(step.pick * len(clients))]
            others = [n for n in fleet.live_nodes() if n.name != c.node]
            if not others:
                return
            dest = others[int(step.pick2 * len(others))]
            f = h.fault("takeover", c.cid, f"{c.node} -> {dest.name}")
            if c.take_over(dest.name):
                c.connected.clear()
                try:
                    await asyncio.wait_for(c.connected.wait(), 10)
                    h.healed(f, f"on {c.node}")
                except TimeoutError:
                    h.healed(f, "not reconnected within 10s")
            else:
                h.healed(f, "client not connected")
        else:
            proxies = list(fleet.proxies.values())
            if not proxies:
                return
            chosen = proxies if step.all_nodes else [proxies[int(step.pick * len(proxies))]]
            target = "all nodes" if step.all_nodes else chosen[0].name
            if step.kind == "proxy-drop":
                f = h.fault("proxy-drop", target)
                n = sum(p.drop_all() for p in chosen)
                h.healed(f, f"{n} connections reset")
            elif step.kind == "proxy-blackhole":
                f = h.fault(
                    "proxy-blackhole", target, f"{hold:.1f}s, then {'flush' if step.flush else 'reset'}"
                )
                for p in chosen:
                    p.hold(True)
                await asyncio.sleep(hold)
                for p in chosen:
                    p.heal(flush=step.flush)
                h.healed(f)
            elif step.kind == "reply-lost":
                # short: the point is writes that ran unheard, not a timeout (the nodes' is 5 s)
                deaf = 0.05 + step.latency
                f = h.fault("reply-lost", target, f"replies dropped for {deaf * 1000:.0f} ms, then reset")
                for p in chosen:
                    p.deafen(True)
                await asyncio.sleep(deaf)
                for p in chosen:
                    p.deafen(False)
                h.healed(f)
            else:
                f = h.fault("proxy-delay", target, f"+{step.latency * 1000:.0f} ms for {hold:.1f}s")
                for p in chosen:
                    p.slow(step.latency)
                await asyncio.sleep(hold)
                for p in chosen:
                    p.heal()
                h.healed(f)

    async def heal_all(self) -> None:
        """Everything back to normal: resumed, restarted, proxies flowing."""
        for rs in self.fleet.redis:
            if rs.paused:
                rs.resume()
            if not rs.alive():
                await self.fleet.start_redis(rs)
        for p in self.fleet.proxies.values():
            p.heal()
        for n in self.fleet.nodes:
            if n.paused:
                n.resume()
            if not n.alive():
                await self.fleet.start_node(n)
