"""The nemesis: faults chosen by a seeded RNG, one at a time, each healed before the next, on a timeline.

Every step draws the same number of values from the RNG whatever the fleet's state, so a seed always
gives the same sequence of fault kinds, durations and target indexes; only which live client or node an
index lands on depends on timing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from chaos.client import Client, Publisher
from chaos.history import History
from chaos.procs import Node, Proc, Redis
from chaos.proxy import Proxy

KINDS = (
    "node-kill",  # kill -9 a node, restart it after a while (same config, ports, log)
    "node-pause",  # SIGSTOP a node, SIGCONT after a while (some pauses outlast the heartbeat TTL)
    "redis-kill",  # kill -9 redis-server, restart it on the same port and data dir (AOF)
    "redis-pause",  # SIGSTOP redis-server, SIGCONT after a while
    "redis-term",  # SIGTERM a Redis (a primary): a graceful shutdown, as a pod deletion or a node drain does
    "redis-shutdown",  # the SHUTDOWN command (or SHUTDOWN NOW) to a primary, restarted after a while
    "primary-stop",  # a primary's pod deleted: redis.sh's prestop handover, SIGTERM, started again as a pod
    "redis-restart-under-load",  # a burst of QoS 2 publishes, within ms a Redis (primary) stopped, restarted
    "takeover",  # a client connects to another node while its old connection is still open
    "api-kick",  # DELETE /api/v1/clients/{id} on any node: the client's node disconnects it (0x98)
    "proxy-drop",  # reset the Redis connections of one node or of all
    "proxy-blackhole",  # forward nothing between one node (or all) and Redis for a while
    "proxy-delay",  # delay everything between one node (or all) and Redis
    "reply-lost",  # Redis gets and runs what one node (or all) sends, no reply comes back, then a reset
    "primary-kill",  # kill -9 a primary (Sentinel's, or a cluster shard's), restart it (it comes back a replica)
    "failover",  # a graceful switch to a replica (SENTINEL FAILOVER, CLUSTER FAILOVER)
    "replica-lag",  # SIGSTOP a replica, SIGCONT after a while (WAIT for it times out meanwhile)
)
NODE_KINDS = ("node-kill", "node-pause", "takeover", "api-kick")
# faults of the proxies: before a single redis-server one per node, before every server of Sentinel or a
# cluster one per server (which the nodes, the sentinels and the replicas all go through)
PROXY_KINDS = ("proxy-drop", "proxy-blackhole", "proxy-delay", "reply-lost")
REPLICATED_KINDS = ("redis-shutdown", "primary-stop", "primary-kill", "failover", "replica-lag")
REDIS_KINDS = tuple(k for k in KINDS if k not in NODE_KINDS)
# named sets: the faults of the nodes alone, and those of Redis and the way to it (issue 13 found every
# failure after a Redis outage)
PRESETS = {
    "all": KINDS,
    "nodes": NODE_KINDS,
    "redis": REDIS_KINDS,
}
#: the stops of a Redis (a primary where there are several) that a restart heals
STOPS = ("redis-term", "redis-shutdown", "primary-stop", "redis-restart-under-load")

_P = TypeVar("_P", bound=Proc)  # a node or a redis-server, with the fleet's way to start it again


def applicable(kind: str, store: str, proxied: bool = True, api: bool = True) -> bool:
    """Whether a fault means something for a fleet on `store` (the run options' store): proxy faults where
    the nodes reach Redis through proxies (every form, unless --direct), replicas only in Sentinel and
    Cluster setups, no Redis in memory, kicks where the nodes serve the management API."""
    if kind == "api-kick":
        return api
    if store == "memory":
        return kind not in REDIS_KINDS
    if kind in PROXY_KINDS:
        return proxied
    if store == "redis":
        return kind not in REPLICATED_KINDS
    return True


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

    async def kick(self, cid: str, pick: float) -> str:
        """DELETE /api/v1/clients/{cid} on a live node (`pick` says which); what it answered."""
        ...

    async def prestop(self, old: Redis) -> str:
        """What a primary's pod does when it is deleted, before its SIGTERM (a handover to a replica)."""
        ...

    def quiet_limit(self) -> float | None:
        """How long a Redis may go unheard through its proxy before the store fails it over (None: any)."""
        ...

    async def proxy_role(self, proxy: Proxy) -> str: ...

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

    async def _kill(self, kind: str, proc: _P, hold: float, start: Callable[[_P], Awaitable[None]]) -> None:
        """kill -9 `proc`, and `hold` s later start it again."""
        f = self.history.fault(kind, proc.name, f"pid {proc.pid}, down {hold:.1f}s")
        proc.kill()
        await asyncio.sleep(hold)
        await start(proc)
        self.history.healed(f, f"new pid {proc.pid}")

    async def _pause(self, kind: str, proc: Proc, hold: float) -> None:
        """SIGSTOP `proc` for `hold` s."""
        f = self.history.fault(kind, proc.name, f"SIGSTOP {hold:.1f}s")
        proc.pause()
        await asyncio.sleep(hold)
        proc.resume()
        self.history.healed(f)

    async def inject(self, step: Step, until: float) -> None:
        h, fleet = self.history, self.fleet
        hold = min(step.duration, max(0.0, until - h.now()))
        if step.kind in ("node-kill", "node-pause"):
            live = fleet.live_nodes()
            if len(live) < 2:  # never the last node: clients need somewhere to go
                return
            node = live[int(step.pick * len(live))]
            if step.kind == "node-kill":
                await self._kill(step.kind, node, hold, fleet.start_node)
            else:
                await self._pause(step.kind, node, hold)
        elif step.kind in STOPS:
            await self._stop(step, hold)
        elif step.kind in ("redis-kill", "redis-pause"):
            rs = fleet.redis[int(step.pick * len(fleet.redis))]
            if step.kind == "redis-kill":
                await self._kill(step.kind, rs, hold, fleet.start_redis)
            else:
                await self._pause(step.kind, rs, hold)
        elif step.kind in ("primary-kill", "replica-lag"):
            servers = await (fleet.primaries() if step.kind == "primary-kill" else fleet.replicas())
            if not servers:
                return
            rs = servers[int(step.pick * len(servers))]
            if step.kind == "primary-kill":
                await self._kill(step.kind, rs, hold, fleet.start_redis)
            else:
                await self._pause(step.kind, rs, hold)
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
        elif step.kind == "api-kick":
            clients = [c for c in fleet.clients if c.link is not None]
            if not clients:
                return
            c = clients[int(step.pick * len(clients))]
            f = h.fault("api-kick", c.cid, f"connected to {c.node}")
            c.connected.clear()
            h.more(f, await fleet.kick(c.cid, step.pick2))
            try:
                await asyncio.wait_for(c.connected.wait(), 10)
                h.healed(f, f"back on {c.node}")
            except TimeoutError:
                h.healed(f, "not reconnected within 10s")
        else:
            proxies = list(fleet.proxies.values())
            if not proxies:
                return
            per_server = set(fleet.proxies) <= {r.name for r in fleet.redis}  # (else one per node)
            if per_server and not step.all_nodes:
                # one server's: a primary's (the nodes write there and its replicas read from it; a
                # replica's proxy carries little more than its sentinels' checks)
                primaries = [
                    fleet.proxies[r.name] for r in await fleet.primaries() if r.name in fleet.proxies
                ]
                proxies = primaries or proxies
            chosen = proxies if step.all_nodes else [proxies[int(step.pick * len(proxies))]]
            role = "" if step.all_nodes else await fleet.proxy_role(chosen[0])
            target = ("every Redis" if per_server else "all nodes") if step.all_nodes else chosen[0].name
            behind = f" ({role})" if role else ""
            # where the sentinels reach the servers through the proxies too: short enough that they do not
            # take a server for failed (a failover is other faults' business)
            limit = fleet.quiet_limit()
            capped = " (capped: the sentinels go through it)" if limit is not None else ""
            if step.kind == "proxy-drop":
                f = h.fault("proxy-drop", target, role)
                n = sum(p.drop_all() for p in chosen)
                h.healed(f, f"{n} connections reset")
            elif step.kind == "proxy-blackhole":
                held = min(hold, limit) if limit is not None else hold
                f = h.fault(
                    "proxy-blackhole",
                    target,
                    f"{held:.1f}s{capped if held < hold else ''}, then {'flush' if step.flush else 'reset'}"
                    + behind,
                )
                for p in chosen:
                    p.hold(True)
                await asyncio.sleep(held)
                for p in chosen:
                    p.heal(flush=step.flush)
                h.healed(f)
            elif step.kind == "reply-lost":
                # short: the point is writes that ran unheard, not a timeout (the nodes' is 5 s)
                deaf = 0.05 + step.latency
                f = h.fault(
                    "reply-lost", target, f"replies dropped for {deaf * 1000:.0f} ms, then reset{behind}"
                )
                for p in chosen:
                    p.deafen(True)
                await asyncio.sleep(deaf)
                for p in chosen:
                    p.deafen(False)
                h.healed(f)
            else:
                # (each way: a round trip takes twice as long)
                latency = min(step.latency, limit / 3) if limit is not None else step.latency
                f = h.fault(
                    "proxy-delay",
                    target,
                    f"+{latency * 1000:.0f} ms{capped if latency < step.latency else ''} for {hold:.1f}s"
                    + behind,
                )
                for p in chosen:
                    p.slow(latency)
                await asyncio.sleep(hold)
                for p in chosen:
                    p.heal()
                h.healed(f)

    async def _stop(self, step: Step, hold: float) -> None:
        """A Redis stopped (the single server, else a primary), then started again as its pod would be:
        SIGTERM (redis-term); the SHUTDOWN command, or SHUTDOWN NOW (redis-shutdown, `flush` picks); the
        managed Redis' pod deletion, prestop first (primary-stop); or, within a few milliseconds of a burst
        of QoS 2 publishes (a window's worth from every QoS 2 publisher), kill -9 or SIGTERM
        (redis-restart-under-load, `flush` picks; `latency` / 10 is how long after the burst)."""
        h, fleet = self.history, self.fleet
        servers = await fleet.primaries() if len(fleet.redis) > 1 else fleet.redis
        if not servers:
            return
        rs = servers[int(step.pick * len(servers))]
        pid = rs.pid
        if step.kind == "redis-term":
            f = h.fault(step.kind, rs.name, f"pid {pid} SIGTERM, down {hold:.1f}s")
            code = await rs.terminate()
        elif step.kind == "redis-shutdown":
            args = ("NOW",) if step.flush else ()
            f = h.fault(step.kind, rs.name, f"pid {pid} {' '.join(('SHUTDOWN', *args))}, down {hold:.1f}s")
            code = await rs.shutdown(*args)
        elif step.kind == "primary-stop":
            f = h.fault(step.kind, rs.name, f"pid {pid}: prestop, then SIGTERM, down {hold:.1f}s")
            h.more(f, f"prestop: {await fleet.prestop(rs)}")
            code = await rs.terminate()
        else:
            after = step.latency / 10
            how = "SIGTERM" if step.flush else "kill -9"
            pubs = [c for c in fleet.clients if isinstance(c, Publisher) and c.qos == 2]
            f = h.fault(
                step.kind, rs.name, f"pid {pid} {how} {after * 1000:.0f} ms after a burst, down {hold:.1f}s"
            )
            queued = {p.cid: p.burst(p.window) for p in pubs}
            await asyncio.sleep(after)
            in_flight = sum(len(p.out) for p in pubs)
            if step.flush:
                code = await rs.terminate()
            else:
                rs.kill()
                code = rs.proc.returncode if rs.proc else None
            burst = ", ".join(f"{cid} {n}" for cid, n in queued.items() if n)
            h.more(
                f,
                f"burst {burst or 'none (windows full or publishers away)'}; {in_flight} in flight at the stop",
            )
        await asyncio.sleep(hold)
        await fleet.start_redis(rs)
        h.healed(f, f"exited {code}; new pid {rs.pid}")

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
