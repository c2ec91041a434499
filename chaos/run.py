"""One chaos run: start the fleet, the clients and the nemesis; heal, drain, check; print one summary."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from chaos.api import ApiPublisher, admin_key, describe
from chaos.checker import CLASSES, Report, check
from chaos.client import Client, Publisher, Subscriber
from chaos.history import History
from chaos.identity import USERNAME, IdentityService
from chaos.nemesis import Nemesis, applicable
from chaos.procs import HOST, REDIS_CLI, Node, Redis, Sentinel, dump_keys, free_port, metric_sum
from chaos.proxy import Proxy
from chaos.relay import make_relays


@dataclass
class Options:
    seed: int = 1
    duration: float = 60.0  # seconds of the nemesis phase
    nodes: int = 3
    kinds: list[str] = field(default_factory=list)
    publishers: int = 4
    subscribers: int = 4
    rate: float = 20.0  # messages a second per publisher
    topics: int = 2  # topics per publisher
    window: int = 8  # publisher's in-flight window
    # "redis": one redis-server behind a proxy per node; "sentinel": a primary, 2 replicas and 3 sentinels;
    # "cluster": a Redis Cluster of 3 primaries and 3 replicas (each server of those two behind a proxy of
    # its own, which it announces); "memory": every node with in-memory sessions (a deliberately broken fleet)
    store: str = "redis"
    relay: bool = False  # clients reach the nodes through relays that lose, duplicate, reorder (broken)
    aof: bool = True  # False: redis-server without persistence (a deliberately broken fleet)
    proxied: bool = True  # False: everyone reaches the Redis servers directly (no proxy faults then)
    gap: tuple[float, float] = (1.0, 4.0)
    max_down: float = 8.0
    drain: float = 30.0
    stuck_after: float = 10.0
    zone: dict[str, Any] = field(default_factory=dict)
    identity: bool = False  # an HTTP auth + ACL service and the fleet-wide connection quota on (identity.py)
    api: bool = True  # every node serves the management API: a publisher over HTTP, kicks (api.py)
    logs: Path | None = None
    examples: int = 5


class Fleet:
    """The processes and proxies of one run, and the clients (the nemesis reaches them through this)."""

    def __init__(self, opts: Options, history: History, workdir: Path, logdir: Path):
        self.opts, self.history = opts, history
        self.api_keys = workdir / "api-keys.yaml" if opts.api else None
        self.api_key = admin_key(self.api_keys) if self.api_keys is not None else ""
        self.redis: list[Redis] = []
        self.sentinels: list[Sentinel] = []
        self.proxies: dict[str, Proxy] = {}
        self.nodes: list[Node] = []
        self.clients: list[Client] = []
        store: dict[str, Any] = {"kind": "memory"}
        if opts.store == "redis":
            self.redis.append(Redis("redis-0", workdir / "redis-0", logdir, aof=opts.aof))
        elif opts.store == "sentinel":
            self.redis = [Redis(f"redis-{i}", workdir / f"redis-{i}", logdir) for i in range(3)]
            if opts.proxied:
                for rs in self.redis:
                    # Sentinel learns a replica's address from what it announces, and names a promoted one
                    # by it: every address it gives the nodes (and the replicas their primary's) is a proxy's
                    self._front(rs, ["--replica-announce-ip", HOST, "--replica-announce-port"])
            primary = self.redis[0]
            for rs in self.redis[1:]:
                rs.extra = ["--replicaof", HOST, str(primary.public_port)]
            self.sentinels = [
                Sentinel(f"sentinel-{i}", workdir / f"sentinel-{i}", logdir, primary) for i in range(3)
            ]
            store = {
                "kind": "redis",
                "sentinel": {
                    "nodes": [f"{HOST}:{x.port}" for x in self.sentinels],
                    "master": Sentinel.MASTER,
                },
                "wait_replicas": 1,
            }
        elif opts.store == "cluster":
            for i in range(6):
                bus = free_port()
                rs = Redis(f"redis-{i}", workdir / f"redis-{i}", logdir, extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--cluster-port", str(bus),
                    "--repl-diskless-sync-delay", "0",
                ])  # fmt: skip
                if opts.proxied:
                    # CLUSTER SHARDS, MOVED and the replicas' links name the proxy; the bus stays direct, so
                    # a proxy fault never makes the cluster think a node failed
                    self._front(rs, ["--cluster-announce-bus-port", str(bus), "--cluster-announce-port"])
                self.redis.append(rs)
            store = {
                "kind": "redis",
                "cluster": {"nodes": [f"{HOST}:{r.public_port}" for r in self.redis]},
                "wait_replicas": 1,
            }
        for i in range(opts.nodes):
            name = f"n{i}"
            if opts.store == "redis" and not opts.proxied:
                store = {"kind": "redis", "url": f"redis://{HOST}:{self.redis[0].port}/0"}
            elif opts.store == "redis":
                proxy = Proxy(f"{name}-redis-proxy", self.redis[0].port)
                self.proxies[name] = proxy
                store = {"kind": "redis", "url": f"redis://{HOST}:{proxy.port}/0"}
            self.nodes.append(Node(name, logdir, store, opts.zone, self.api_keys))
        self.relays = (
            {
                r.name.removesuffix("-relay"): r
                for r in make_relays([(n.name, n.port) for n in self.nodes], opts.seed)
            }
            if opts.relay
            else {}
        )
        self._watch: asyncio.Task[None] | None = None
        self._restarting: set[str] = set()

    def _front(self, rs: Redis, announce: list[str]) -> None:
        """A proxy in front of `rs`, which announces the proxy's port (the last of `announce`): everyone
        (nodes, sentinels, replicas) reaches it through the proxy; only the harness goes straight to it."""
        proxy = Proxy(f"{rs.name}-proxy", rs.port)
        self.proxies[rs.name] = proxy
        rs.public_port = proxy.port
        rs.announce = [*announce, str(proxy.port)]

    async def start(self) -> None:
        for p in self.proxies.values():  # (replicas reach their primary through its proxy)
            await p.start()
        for rs in self.redis:
            await rs.start()
        if self.opts.store == "cluster":
            await self._create_cluster()
        for x in self.sentinels:
            await x.start()
        if self.sentinels:
            await self._until("every sentinel knows both replicas", self._sentinels_ready)
        await asyncio.gather(*(n.start() for n in self.nodes))
        for r in self.relays.values():
            await r.start()
        self._watch = asyncio.ensure_future(self._watch_exits())

    async def _create_cluster(self) -> None:
        cli = await asyncio.create_subprocess_exec(
            REDIS_CLI, "--cluster", "create", *(f"{HOST}:{r.port}" for r in self.redis),
            "--cluster-replicas", "1", "--cluster-yes",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await cli.communicate()
        if cli.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{out.decode(errors='replace')}")
        await self._until("the cluster whole, every replica in sync", self._cluster_ready)

    async def _cluster_ready(self) -> bool:
        public = {r.public_port for r in self.redis}
        for r in self.redis:
            info = await r.command("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
            repl = await r.command("INFO", "replication")
            if "role:slave" in repl and "master_link_status:up" not in repl:
                return False
            # every node known by its public address (its proxy's) yet, not the one it was met at
            nodes = str(await r.command("CLUSTER", "NODES")).splitlines()
            if any(int(line.split()[1].split("@")[0].rpartition(":")[2]) not in public for line in nodes):
                return False
        return True

    async def _sentinels_ready(self) -> bool:
        for x in self.sentinels:
            flat = await x.command("SENTINEL", "master", Sentinel.MASTER)
            info = dict(zip(flat[::2], flat[1::2], strict=True))
            if int(info["num-slaves"]) < 2 or int(info["num-other-sentinels"]) < 2:
                return False
        return True

    @staticmethod
    async def _until(what: str, ready: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, TimeoutError, RuntimeError):
                if await ready():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            await asyncio.sleep(0.2)

    # -- what the nemesis asks of the Redis side
    async def primaries(self) -> list[Redis]:
        """The servers that are primaries now (a failed-over primary restarted is a replica)."""
        if self.sentinels:
            for x in self.sentinels:
                port = await x.primary_port()
                if port is not None:
                    return [r for r in self.redis if r.known_as(port)]
            return []
        return [r for r in self.redis if r.alive() and not r.paused and await r.role() == "master"]

    @staticmethod
    async def _caught_up(primary: Redis, timeout: float = 2.0) -> None:
        """Until every replica of `primary` has its whole replication stream (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await primary.info()
            offset = int(info.get("master_repl_offset", "0"))
            offsets = [int(dict(kv.split("=") for kv in v.split(","))["offset"]) for k, v in info.items()
                       if k.startswith("slave") and k[5:].isdigit()]  # fmt: skip
            if all(o >= offset for o in offsets):
                return
            await asyncio.sleep(0.05)

    async def start_redis(self, rs: Redis) -> None:
        """Start a killed Redis server again. On Sentinel it comes back as a pod of the managed Redis does
        (operator/redis.sh): a replica of the primary the sentinels name, or the primary if they still name
        it; never of the primary it was first given, which may be its own replica by now (a replication
        loop: no master at all)."""
        if self.sentinels:
            for x in self.sentinels:
                if x.alive() and not x.paused and (port := await x.primary_port()) is not None:
                    rs.extra = [] if rs.known_as(port) else ["--replicaof", HOST, str(port)]
                    break
        await rs.start()

    async def store_whole(self, timeout: float) -> bool:
        if self.opts.store == "cluster":
            ready = self._cluster_ready
        elif self.sentinels:
            ready = self._sentinel_whole
        else:
            return True  # (one Redis: nothing to wait for)
        try:
            await self._until("the store whole", ready, timeout)
        except RuntimeError:
            return False
        return True

    async def _sentinel_whole(self) -> bool:
        """The sentinels' primary says it is one and has both replicas online, caught up with it."""
        primaries = await self.primaries()
        if not primaries or not primaries[0].alive() or primaries[0].paused:
            return False
        info = await primaries[0].info()
        if info.get("role") != "master":
            return False
        replicas = [dict(kv.split("=") for kv in v.split(",")) for k, v in info.items()
                    if k.startswith("slave") and k[5:].isdigit()]  # fmt: skip
        # (a linked replica acknowledging within the second is as caught up as a live stream gets)
        return len(replicas) == len(self.redis) - 1 and all(
            r.get("state") == "online" and int(r.get("lag", "99")) <= 1 for r in replicas
        )

    async def replicas(self) -> list[Redis]:
        return [r for r in self.redis if r.alive() and not r.paused and await r.role() == "slave"]

    async def failover(self, pick: float) -> str:
        """A planned switch of a primary to one of its replicas. On Sentinel, as a fleet's managed Redis does
        it when its primary's pod stops (see prestop). On a cluster, CLUSTER FAILOVER on a replica (Redis
        pauses the primary itself)."""
        try:
            if self.sentinels:
                primaries = await self.primaries()
                if not primaries or not primaries[0].alive() or primaries[0].paused:
                    return "no primary"
                return await self.prestop(primaries[0])
            replicas = await self.replicas()
            if not replicas:
                return "no replica"
            r = replicas[int(pick * len(replicas))]
            await r.command("CLUSTER", "FAILOVER")
            return f"{r.name} takes over"
        except (OSError, TimeoutError, RuntimeError) as e:  # (one in progress already, a node away...)
            return f"refused: {e}"

    async def prestop(self, old: Redis) -> str:
        """What the stop of a primary's pod does before its SIGTERM. On Sentinel, operator/redis.sh's
        prestop: writes paused on the primary, replicas caught up, SENTINEL FAILOVER, the old primary made
        a replica of the new one, writes let go (a bare SENTINEL FAILOVER loses what a replica acknowledged
        while the primary took writes after another replica's promotion). redis.sh hands over in sentinel
        mode only; on a cluster this does the same with CLUSTER FAILOVER on one of its replicas (the
        replica has Redis pause the primary's writes, catches up, takes over) and waits for the old primary
        to say it is a replica. Returns what happened."""
        try:
            if self.sentinels:
                live = [x for x in self.sentinels if x.alive() and not x.paused]
                if not live:
                    return "no sentinel"
                await old.command("CLIENT", "PAUSE", "30000", "WRITE")
                try:
                    await self._caught_up(old)
                    await live[0].command("SENTINEL", "FAILOVER", Sentinel.MASTER)
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        port = await live[0].primary_port()
                        if port is not None and not old.known_as(port):
                            await old.command("REPLICAOF", HOST, str(port))
                            return f"asked {live[0].name}; {old.name} now a replica of :{port}"
                        await asyncio.sleep(0.2)
                    return f"asked {live[0].name}; no switch within 20 s"
                finally:
                    await old.command("CLIENT", "UNPAUSE")
            replicas = [
                r
                for r in self.redis
                if r is not old and r.alive() and not r.paused
                and old.known_as(int((await r.info()).get("master_port", "0")))
            ]  # fmt: skip
            if not replicas:
                return "no replica"
            await replicas[0].command("CLUSTER", "FAILOVER")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if await old.role() == "slave":
                    return f"CLUSTER FAILOVER on {replicas[0].name}; {old.name} now a replica"
                await asyncio.sleep(0.1)
            return f"CLUSTER FAILOVER on {replicas[0].name}; {old.name} still a primary after 20 s"
        except (OSError, TimeoutError, RuntimeError) as e:  # (one in progress already, a node away...)
            return f"refused: {e}"

    def quiet_limit(self) -> float | None:
        """How long a Redis may go unheard (behind a black-holed or slowed proxy) before the store takes it
        for failed: on Sentinel the sentinels, which reach the servers through the same proxies, fail a
        primary over after down-after (2 s); a cluster's bus is direct, a single server has no failover."""
        return 1.5 if self.sentinels and self.proxies else None

    async def proxy_role(self, proxy: Proxy) -> str:
        """What stands behind a proxy, for the timeline: '' for a node's own proxy, else the server's name
        and role (primary, replica)."""
        rs = next((r for r in self.redis if self.proxies.get(r.name) is proxy), None)
        if rs is None:
            return ""
        role = {"master": "primary", "slave": "replica"}.get(await rs.role() or "", "down")
        return f"{rs.name} {role}"

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.alive() and not n.paused and not n.down]

    def pick(self, rng: random.Random, want: str | None) -> tuple[str, str, int] | None:
        """Where a client connects: `want` if it is live, else a random live node."""
        live = self.live_nodes()
        if not live:
            return None
        chosen = next((n for n in live if n.name == want), None) or rng.choice(live)
        relay = self.relays.get(chosen.name)
        return chosen.name, HOST, relay.port if relay else chosen.port

    def _api_nodes(self) -> list[Node]:
        return [n for n in self.live_nodes() if n.api_port is not None]

    def pick_api(self, rng: random.Random) -> tuple[str, str] | None:
        """A random live node's management API: (node, base URL)."""
        live = self._api_nodes()
        if not live:
            return None
        n = rng.choice(live)
        return n.name, f"http://{HOST}:{n.api_port}"

    async def kick(self, cid: str, pick: float) -> str:
        live = self._api_nodes()
        if not live:
            return "no node serves the API"
        n = live[int(pick * len(live))]
        url = f"http://{HOST}:{n.api_port}/api/v1/clients/{cid}"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
                http.delete(url, headers={"Authorization": f"Bearer {self.api_key}"}) as r,
            ):
                return f"asked {n.name}: {r.status} {(await r.text())[:120]}".rstrip()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            return f"asked {n.name}: {type(e).__name__} {e}"

    async def start_node(self, node: Node) -> None:
        try:
            await node.start()
        except RuntimeError as e:  # it did not come back: an exit nobody asked for
            self.history.node_exits.append(
                (node.name, self.history.now(), node.proc.returncode if node.proc else None, False)
            )
            self.history.notes.append(f"{self.history.now():.3f} {node.name} failed to restart: {e}")

    async def _watch_exits(self) -> None:
        """A node that exits on its own is a crash: recorded, then restarted so the run goes on."""
        while True:
            await asyncio.sleep(0.2)
            for n in self.nodes:
                if (
                    not n.down
                    and n.proc is not None
                    and n.proc.poll() is not None
                    and n.name not in self._restarting
                ):
                    self.history.node_exits.append((n.name, self.history.now(), n.proc.returncode, False))
                    self._restarting.add(n.name)
                    await self.start_node(n)
                    self._restarting.discard(n.name)
            for rs in self.redis:
                if not rs.down and rs.proc is not None and rs.proc.poll() is not None:
                    self.history.notes.append(
                        f"{self.history.now():.3f} {rs.name} exited with {rs.proc.returncode} on its own"
                    )
                    await self.start_redis(rs)

    async def stop(self) -> list[str]:
        """Stop everything by pid; returns notes about exits at shutdown."""
        notes = []
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        codes = await asyncio.gather(*(n.terminate() for n in self.nodes))
        for n, code in zip(self.nodes, codes, strict=True):
            if code == -signal.SIGKILL:  # killed by terminate() after its grace
                notes.append(f"{n.name} did not stop within 10s of SIGTERM at the end; killed")
            elif code not in (0, None):  # a failed shutdown is a crash too
                self.history.node_exits.append((n.name, self.history.now(), code, False))
                notes.append(f"{n.name} exited with status {code} on SIGTERM at the end")
        for p in self.proxies.values():
            await p.close()
        for r in self.relays.values():
            await r.close()
        for rs in [*self.sentinels, *self.redis]:
            await rs.terminate()
        return notes


def _clients(
    opts: Options, fleet: Fleet, h: History, run_id: str
) -> tuple[list[Publisher | ApiPublisher], list[Subscriber]]:
    """Publishers and subscribers over both protocol versions and both QoS levels (i % 2 picks the
    version, i // 2 % 2 the QoS), each with its own RNG from the seed; with the API, one more publisher
    over HTTP at QoS 1."""
    pubs: list[Publisher | ApiPublisher] = []
    subs = []
    user = USERNAME if opts.identity else None
    for i in range(opts.publishers):
        version, qos = (4, 5)[i % 2], (1, 2)[i // 2 % 2]
        cid = f"pub{i}-v{version}q{qos}"
        topics = [f"chaos/{run_id}/{cid}/{k}" for k in range(opts.topics)]
        rng = random.Random(f"client:{opts.seed}:{cid}")
        pubs.append(
            Publisher(
                cid,
                version,
                h,
                fleet.pick,
                rng,
                qos=qos,
                topics=topics,
                rate=opts.rate,
                window=opts.window,
                username=user,
            )
        )
    if opts.api:
        cid = "api-pub"
        pubs.append(
            ApiPublisher(
                cid,
                h,
                fleet.pick_api,
                random.Random(f"client:{opts.seed}:{cid}"),
                key=fleet.api_key,
                topics=[f"chaos/{run_id}/{cid}/{k}" for k in range(opts.topics)],
                rate=opts.rate,
            )
        )
    for i in range(opts.subscribers):
        version, qos = (4, 5)[i % 2], (1, 2)[i // 2 % 2]
        cid = f"sub{i}-v{version}q{qos}"
        rng = random.Random(f"client:{opts.seed}:{cid}")
        subs.append(
            Subscriber(cid, version, h, fleet.pick, rng, qos=qos, filter=f"chaos/{run_id}/#", username=user)
        )
    return pubs, subs


def _undelivered(h: History) -> list[tuple[str, tuple[str, str, int]]]:
    """(subscriber, message) pairs acked but not delivered yet."""
    got: dict[str, set[tuple[str, str, int]]] = {s: set() for s in h.subs}
    for d in h.deliveries:
        got[d.sub].add((d.pub, d.topic, d.seq))
    out = []
    for key, m in h.msgs.items():
        if m.acked is None:
            continue
        for s, info in h.subs.items():
            if info.suback is not None and m.sent > info.suback and key not in got[s]:
                out.append((s, key))
    return out


async def _drain(h: History, pubs: list[Publisher | ApiPublisher], limit: float) -> None:
    """Wait until every publisher's window is acked and every acked message delivered, or `limit`."""
    t = h.now()
    while h.now() - t < limit:
        if all(p.idle() for p in pubs) and not _undelivered(h):
            return
        await asyncio.sleep(0.25)


async def run(opts: Options) -> tuple[History, Report, dict[str, Any]]:
    h = History()
    run_id = f"s{opts.seed}-{int(time.time()) % 100000}"
    workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
    logdir = opts.logs or Path("chaos/results") / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{opts.seed}"
    logdir.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in opts.kinds if applicable(k, opts.store, opts.proxied, opts.api)]
    identity = IdentityService() if opts.identity else None
    if identity is not None:
        await identity.start()
        opts = dataclasses.replace(
            opts, zone={**identity.zone(opts.publishers + opts.subscribers), **opts.zone}
        )
    fleet = Fleet(opts, h, workdir, logdir)
    pubs, subs = _clients(opts, fleet, h, run_id)
    fleet.clients = [*(p for p in pubs if isinstance(p, Publisher)), *subs]
    tasks: list[asyncio.Task[None]] = []
    extra: dict[str, Any] = {"logs": str(logdir), "kinds": kinds, "run_id": run_id}
    unrecovered: list[str] = []
    try:
        await fleet.start()
        h.notes.append(f"{h.now():.3f} fleet up: {', '.join(f'{n.name}:{n.port}' for n in fleet.nodes)}")
        tasks += [asyncio.ensure_future(c.run()) for c in subs]
        t_sub = h.now()
        while any(h.subs[s.cid].suback is None for s in subs) and h.now() - t_sub < 30:
            await asyncio.sleep(0.05)
        tasks += [asyncio.ensure_future(p.run()) for p in pubs]
        tasks += [asyncio.ensure_future(p.produce()) for p in pubs if isinstance(p, Publisher)]
        t_start = h.now()
        nemesis = Nemesis(fleet, h, opts.seed, kinds, gap=opts.gap, max_down=opts.max_down)
        nem = asyncio.ensure_future(nemesis.run(t_start + opts.duration))
        while not nem.done():
            await asyncio.wait([nem, *tasks], return_when=asyncio.FIRST_COMPLETED, timeout=1.0)
            for t in tasks:
                if t.done():
                    t.result()  # a client that failed is a harness bug: stop here
        nem.result()
        extra["nemesis_s"] = h.now() - t_start
        await nemesis.heal_all()
        h.notes.append(f"{h.now():.3f} healed; draining")
        for p in pubs:
            p.producing = False
        t_drain = h.now()
        await _drain(h, pubs, opts.drain)
        late = _undelivered(h)
        if late:
            # still undelivered to connected subscribers: reconnecting tells stuck (it comes now) from
            # lost (it never does)
            behind = {s for s, _ in late}
            h.notes.append(
                f"{h.now():.3f} {len(late)} deliveries still missing {h.now() - t_drain:.0f}s after healing; "
                f"reconnecting {', '.join(sorted(behind))}"
            )
            for s in subs:
                if s.cid in behind:
                    s.reconnect()
            await _drain(h, pubs, min(opts.drain, 15.0))
        await asyncio.sleep(0.5)  # late repeats and duplicates show up too
        extra["drain_s"] = h.now() - t_drain
        for p in pubs:
            if isinstance(p, ApiPublisher):
                if not p.idle():
                    unrecovered.append(f"{p.describe()}; one still not taken {opts.drain:.0f}s after healing")
            elif not p.idle():
                unrecovered.append(
                    f"{p.cid}: {len(p.out)} in flight, {len(p.pending)} unsent {opts.drain:.0f}s after healing "
                    f"(connected: {p.link is not None}, node {p.node})"
                )
        extra["api"] = [p.report() for p in pubs if isinstance(p, ApiPublisher)]
        for s in subs:
            if h.subs[s.cid].suback is None:
                unrecovered.append(f"{s.cid}: never subscribed (connected: {s.link is not None})")
        h.end = h.now()
        extra["metrics"] = await _metrics(fleet)
        extra["store_dump"] = str(await _dump_store(fleet, logdir))
        extra["proxies"] = {name: p.accepted for name, p in fleet.proxies.items()}
        if fleet.relays:
            extra["relay"] = dict(next(iter(fleet.relays.values())).budget.done)
    finally:
        for c in [*fleet.clients, *pubs]:
            c.stop()
        if tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        for t in tasks:
            t.cancel()
        for c in fleet.clients:
            await c.close()
        h.notes += await fleet.stop()
        if identity is not None:
            await identity.stop()
            extra["identity_asked"] = dict(identity.asked)
        shutil.rmtree(workdir, ignore_errors=True)
    for n in fleet.nodes:
        tracebacks = n.log().count("Traceback (most recent call last)")
        if tracebacks:
            h.notes.append(f"{n.name}: {tracebacks} tracebacks in {n.log_path}")
    report = check(h, stuck_after=opts.stuck_after, unrecovered=unrecovered)
    if report.ok and "store_dump" in extra:
        Path(extra.pop("store_dump")).unlink(missing_ok=True)  # (kept for the runs that failed)
    return h, report, extra


async def _dump_store(fleet: Fleet, logdir: Path) -> Path:
    """Every key of every Redis primary after the drain, to logdir/store.json: what a violation left in
    the store (which copies of a message a session holds, under which receipts) is read from it."""
    dump: dict[str, Any] = {}
    for rs in fleet.redis:
        if rs.alive() and not rs.paused and await rs.role() == "master":
            with contextlib.suppress(OSError, TimeoutError, RuntimeError):
                dump[rs.name] = await dump_keys(rs.port)
    path = logdir / "store.json"
    path.write_text(json.dumps(dump))
    return path


async def _metrics(fleet: Fleet) -> dict[str, float]:
    """What the brokers themselves counted (nodes restarted during the run start from zero)."""
    texts = await asyncio.gather(*(n.metrics() for n in fleet.nodes))
    out: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            m = re.match(r'fleetmq_messages_dropped_total\{.*reason="([^"]+)"', line)
            if m:
                key = f"dropped:{m.group(1)}"
                out[key] = out.get(key, 0.0) + float(line.rpartition(" ")[2])
        out["store_errors"] = out.get("store_errors", 0.0) + metric_sum(text, "fleetmq_store_errors_total")
        m = re.search(r'^fleetmq_build_info\{.*path="(\w+)"', text, re.M)  # (make chaos: compiled)
        if m:
            out[f"nodes:{m.group(1)}"] = out.get(f"nodes:{m.group(1)}", 0.0) + 1
        for line in text.splitlines():  # (--identity: what the chain and the quotas decided)
            m = re.match(r"fleetmq_(authentications|authorizations|quota_refusals)_total\{(.*)\} (\S+)", line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
                what = "/".join(v for k, v in sorted(labels.items()) if k != "zone")
                key = f"{m.group(1)}:{what}"
                out[key] = out.get(key, 0.0) + float(m.group(3))
    return {k: v for k, v in out.items() if v}


# ------------------------------------------------------------------ the summary
def summary(opts: Options, h: History, rep: Report, extra: dict[str, Any]) -> str:
    s = rep.stats
    nemesis_s = float(extra.get("nemesis_s", 0.0))
    lines = [
        f"chaos: seed {opts.seed}, {opts.nodes} nodes{' behind broken relays' if opts.relay else ''}, store {opts.store}"
        + {
            "redis": f" (redis-server, AOF {'appendfsync always' if opts.aof else 'OFF'}"
            + (", each node through its proxy)" if opts.proxied else ", reached directly)"),
            "sentinel": " (a primary, 2 replicas, 3 sentinels; AOF appendfsync always, wait_replicas 1"
            + (", every server behind a proxy)" if opts.proxied else ")"),
            "cluster": " (3 primaries, 3 replicas; AOF appendfsync always, wait_replicas 1"
            + (", every server behind a proxy)" if opts.proxied else ")"),
        }.get(opts.store, "")
        + f", {opts.publishers} publishers x {opts.topics} topics at {opts.rate:g} msg/s, {opts.subscribers} subscribers",
        f"nemesis: {', '.join(extra.get('kinds', [])) or 'none'}; {nemesis_s:.0f}s under the nemesis, "
        f"then healed and drained for {float(extra.get('drain_s', 0.0)):.0f}s",
        f"messages: published {s['published']:,}, acked {s['acked']:,}; deliveries expected {s['expected_deliveries']:,}, "
        f"delivered {s['delivered_first']:,} first / {s['delivered_total']:,} total "
        f"(QoS 1 repeats {s['qos1_repeats']:,}, QoS 2 resends dropped by the receiver {s['qos2_resends_deduped']:,})",
        f"clients: {s['connects']:,} connections, {s['connack_refusals']:,} CONNACK refusals, "
        f"{s['publishes_resent']:,} PUBLISH resends, {s['refused_acks']:,} acks with an error code",
    ]
    if extra.get("relay"):
        lines.append(
            "broken relays (--broken relay) did: " + ", ".join(f"{k} {v}" for k, v in extra["relay"].items())
        )
    if extra.get("api"):
        lines.append("over the management API: " + "; ".join(describe(a) for a in extra["api"]))
    if extra.get("identity_asked"):
        lines.append(
            "the identity service (--identity) was asked: "
            + ", ".join(f"{path} {n:,}" for path, n in sorted(extra["identity_asked"].items()))
        )
    if extra.get("proxies"):
        lines.append(
            "connections through the proxies: "
            + ", ".join(f"{name} {n:,}" for name, n in extra["proxies"].items())
        )
    if extra.get("metrics"):
        lines.append(
            "brokers counted: " + ", ".join(f"{k} {v:g}" for k, v in sorted(extra["metrics"].items()))
        )
    lines.append(
        f"faults: {s['faults']} ({_kind_counts(h)}), a fault active {s['fault_active_s']:.0f}s of {nemesis_s:.0f}s"
    )
    lines.append("violations:")
    for kind, desc in CLASSES.items():
        vs = rep.violations[kind]
        lines.append(f"  {kind:13} {len(vs):6}   {desc}")
        for v in vs[: opts.examples]:
            lines.append(f"      {v.text}")
        if len(vs) > opts.examples:
            lines.append(f"      ... and {len(vs) - opts.examples} more")
    lines.append(
        f"timeline (seconds since {time.strftime('%H:%M:%S', time.localtime(h.t0_wall))}.{int(h.t0_wall % 1 * 1000):03d}):"
    )
    for f in h.faults:
        end = f"{f.end:8.2f}" if f.end is not None else "  active"
        lines.append(f"  #{f.id:<3} {f.start:8.2f} {end}  {f.kind:16} {f.target:22} {f.detail}")
    if not h.faults:
        lines.append("  (no faults)")
    old_open = [x for x in h.lingering if x[3] is None]
    if old_open:
        lines.append(
            f"note: {len(old_open)} connections left by a takeover were still open 10s later, e.g. {old_open[:3]}"
        )
    for note in h.notes:
        if "fleet up" in note or "healed" in note:
            continue
        lines.append(f"note: {note}")
    lines.append(f"logs: {extra.get('logs')}")
    fault_minutes = nemesis_s / 60
    verdict = "PASS" if rep.ok else "FAIL"
    counts = ",".join(f"{k}={n}" for k, n in rep.counts().items() if n)
    lines.append(
        f"RESULT {verdict} seed={opts.seed} fault-minutes={fault_minutes:.2f} nemesis={','.join(extra.get('kinds', []))}"
        + (f" violations={counts}" if counts else "")
    )
    return "\n".join(lines)


def _kind_counts(h: History) -> str:
    c: dict[str, int] = {}
    for f in h.faults:
        c[f.kind] = c.get(f.kind, 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items())) or "none"


def to_json(opts: Options, h: History, rep: Report, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "seed": opts.seed,
        "ok": rep.ok,
        "fault_minutes": float(extra.get("nemesis_s", 0.0)) / 60,
        "kinds": extra.get("kinds", []),
        "stats": rep.stats,
        "counts": rep.counts(),
        "examples": {k: [v.text for v in vs[:20]] for k, vs in rep.violations.items() if vs},
        "faults": [f.__dict__ for f in h.faults],
        "logs": extra.get("logs"),
        "metrics": extra.get("metrics", {}),
        "relay": extra.get("relay", {}),
        "identity_asked": extra.get("identity_asked", {}),
        "api": extra.get("api", []),
        "notes": h.notes,
        "t0_wall": h.t0_wall,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")
