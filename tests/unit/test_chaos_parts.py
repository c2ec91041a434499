"""The chaos harness's other parts that need no servers: the Redis proxy's request framing and rules (on a
stand-in upstream that records what reaches it), the nemesis's kinds and its stops of Redis (on a stand-in
fleet), the publishers' bursts, the port allocator, and the wall between the harness, the tests and the
product."""

from __future__ import annotations

import ast
import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from chaos.client import Publisher
from chaos.history import History
from chaos.nemesis import (
    KINDS,
    PRESETS,
    PROXY_KINDS,
    REDIS_KINDS,
    REPLICATED_KINDS,
    STOPS,
    Nemesis,
    Step,
    applicable,
    parse_kinds,
)
from chaos.proxy import Proxy, _ephemeral_low, free_port, request_end

ROOT = Path(__file__).resolve().parents[2]


def resp(*args: str) -> bytes:
    return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)


def test_request_end():
    one, two = resp("SET", "k", "v"), resp("EVALSHA", "abc", "0")
    assert request_end(one + two) == len(one)
    assert request_end(one + two, len(one)) == len(one) + len(two)
    assert request_end(one[:-1]) == -1
    assert request_end(b"PING\r\n") == 6
    assert request_end(b"") == -1


class Upstream:
    """A stand-in for Redis: records every byte, answers each request line-count with +OK."""

    def __init__(self) -> None:
        self.got = bytearray()
        self.conns = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.conns += 1
        while data := await r.read(65536):
            self.got += data
            w.write(b"+OK\r\n")
        w.close()


async def _pair() -> tuple[Upstream, Proxy, asyncio.StreamReader, asyncio.StreamWriter]:
    up = Upstream()
    proxy = Proxy("test", await up.start())
    await proxy.start()
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    return up, proxy, r, w


async def test_cut_after_forwards_up_to_the_matching_request_and_no_further():
    up, proxy, r, w = await _pair()
    fired = proxy.cut_after(b"EVALSHA", b"enqueue")
    pipeline = resp("SET", "a", "1") + resp("EVALSHA", "enqueue", "0") + resp("SET", "b", "2")
    w.write(pipeline)
    assert await asyncio.wait_for(r.read(), 5) is not None  # the connection ends
    assert fired.is_set()
    assert bytes(up.got) == resp("SET", "a", "1") + resp("EVALSHA", "enqueue", "0")
    assert not proxy.rules  # once
    w.close()
    await proxy.close()


async def test_delay_keeps_order_and_hold_holds():
    up, proxy, r, w = await _pair()
    loop = asyncio.get_running_loop()
    proxy.delay(0.3, b"slow")
    t0 = loop.time()
    w.write(resp("GET", "slow") + resp("GET", "fast"))
    await asyncio.sleep(0.15)
    assert up.got == b""  # the fast one waits behind the slow one
    while len(up.got) < len(resp("GET", "slow") + resp("GET", "fast")):
        await asyncio.sleep(0.01)
    assert loop.time() - t0 >= 0.29
    assert bytes(up.got).index(b"slow") < bytes(up.got).index(b"fast")
    proxy.clear()
    proxy.hold(True)
    before = len(up.got)
    w.write(resp("PING"))
    await asyncio.sleep(0.2)
    assert len(up.got) == before
    proxy.hold(False)
    while len(up.got) == before:
        await asyncio.sleep(0.01)
    assert proxy.drop_all() == 1
    assert await asyncio.wait_for(r.read(), 5) is not None
    w.close()
    await proxy.close()


async def test_deafen_forwards_requests_drops_replies_then_resets():
    """reply-lost: what is sent while deaf reaches Redis, no reply comes back, and turning it off resets the
    connection (the node cannot tell whether its writes ran)."""
    up, proxy, r, w = await _pair()
    w.write(resp("SET", "a", "1"))
    assert await asyncio.wait_for(r.readexactly(5), 5) == b"+OK\r\n"
    proxy.deafen(True)
    w.write(resp("SET", "b", "2"))
    while b"b" not in bytes(up.got):
        await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.read(1), 0.2)  # the +OK was dropped
    proxy.deafen(False)
    assert await asyncio.wait_for(r.read(), 5) == b""  # reset
    r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)  # new connections hear again
    w2.write(resp("PING"))
    assert await asyncio.wait_for(r2.readexactly(5), 5) == b"+OK\r\n"
    w.close()
    w2.close()
    await proxy.close()


def test_free_ports_are_below_the_ephemeral_range_and_never_repeated():
    """A port the kernel could hand to an outgoing connection (a proxy's, a replica's) while its node or
    Redis is down for a fault would make the restart fail to bind it."""
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p < _ephemeral_low() for p in ports)


def test_which_faults_apply_to_which_store():
    for store in ("redis", "sentinel", "cluster"):
        # proxies stand before every form's Redis, unless --direct
        assert all(applicable(k, store) for k in PROXY_KINDS)
        assert not any(applicable(k, store, proxied=False) for k in PROXY_KINDS)
        for k in ("redis-term", "redis-restart-under-load", "redis-kill", "redis-pause"):
            assert applicable(k, store) and applicable(k, store, proxied=False)
    for k in REPLICATED_KINDS:
        assert not applicable(k, "redis")
        assert applicable(k, "sentinel") and applicable(k, "cluster")
    assert {"redis-shutdown", "primary-stop"} <= set(REPLICATED_KINDS)
    assert not any(applicable(k, "memory") for k in REDIS_KINDS)
    assert set(STOPS) <= set(PRESETS["redis"])
    assert set(PRESETS["redis"]) | set(PRESETS["nodes"]) == set(KINDS)


def test_parse_kinds():
    assert parse_kinds("all") == list(KINDS)
    assert parse_kinds("none") == []
    assert parse_kinds("takeover,redis") == [k for k in KINDS if k in (*REDIS_KINDS, "takeover")]
    with pytest.raises(ValueError, match="unknown nemesis"):
        parse_kinds("node-kill,meteor")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_product_harness_and_tests_stay_apart():
    """The product imports neither the harness nor the tests; the harness uses no broker code (its checks
    must not share the broker's bugs) and no test code."""
    wrong = []
    for folder, banned in (
        ("broker", ("chaos", "tests", "bench")),
        ("operator", ("chaos", "tests", "bench")),
        ("chaos", ("fleetmq", "tests", "bench")),
    ):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for mod in _imports(path):
                if mod.split(".")[0] in banned:
                    wrong.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not wrong


def _publisher(window: int = 8) -> Publisher:
    h = History()
    return Publisher("pub", 5, h, lambda rng, want: None, random.Random(1), qos=2, topics=["t/0", "t/1"],
                     rate=20, window=window)  # fmt: skip


def test_a_burst_fills_the_window_at_once_and_numbers_on():
    pub = _publisher()
    assert pub.burst(8) == 0  # not connected: nothing
    pub.link = object()  # type: ignore[assignment]  # (connected, as far as burst() looks)
    pub._make()  # one already waiting
    assert pub.burst(20) == 7  # at most the window's room
    assert [key for key, _ in pub.pending] == [("pub", f"t/{i % 2}", i // 2) for i in range(8)]
    assert pub.burst(8) == 0  # full
    pub.producing = False
    pub.pending.clear()
    assert pub.burst(8) == 0  # draining: no more


class FakeRedis:
    def __init__(self, name: str) -> None:
        self.name, self.pid, self.down, self.paused = name, 100, False, False
        self.did: list[str] = []
        self.proc: Any = None

    def alive(self) -> bool:
        return not self.down

    async def terminate(self) -> int:
        self.did.append("SIGTERM")
        self.down = True
        return 0

    async def shutdown(self, *args: str) -> int:
        self.did.append(" ".join(("SHUTDOWN", *args)))
        self.down = True
        return 0

    def kill(self) -> None:
        self.did.append("SIGKILL")
        self.down = True


class FakeFleet:
    """Three servers, the second of which is the primary; publishers, no nodes."""

    def __init__(self, history: History) -> None:
        self.redis = [FakeRedis(f"redis-{i}") for i in range(3)]
        self.nodes: list[Any] = []
        self.proxies: dict[str, Proxy] = {}
        self.pub = _publisher()
        self.pub.link = object()  # type: ignore[assignment]
        self.clients = [self.pub]
        self.history = history

    async def primaries(self) -> list[Any]:
        return [self.redis[1]]

    async def prestop(self, old: Any) -> str:
        old.did.append("prestop")
        return "handed over"

    async def start_redis(self, rs: Any) -> None:
        rs.did.append("start")
        rs.down = False
        rs.pid += 1


@pytest.mark.parametrize("kind", STOPS)
async def test_every_stop_of_a_primary_is_on_the_timeline_and_restarted(kind):
    h = History()
    fleet = FakeFleet(h)
    nemesis = Nemesis(fleet, h, 1, [kind])  # type: ignore[arg-type]
    step = Step(gap=0, kind=kind, pick=0.9, pick2=0, duration=0.01, all_nodes=False, flush=True, latency=0.02)
    await nemesis.inject(step, until=h.now() + 60)
    primary = fleet.redis[1]
    assert all(not r.did for r in fleet.redis if r is not primary)
    [f] = h.faults
    assert f.kind == kind and f.target == "redis-1" and f.end is not None
    assert primary.did[-1] == "start" and f.detail.endswith("new pid 101")
    expected = {
        "redis-term": (["SIGTERM", "start"], "SIGTERM"),
        "redis-shutdown": (["SHUTDOWN NOW", "start"], "SHUTDOWN NOW"),
        "primary-stop": (["prestop", "SIGTERM", "start"], "prestop: handed over"),
        "redis-restart-under-load": (["SIGTERM", "start"], "2 ms after a burst"),
    }[kind]
    assert primary.did == expected[0] and expected[1] in f.detail, f.detail
    if kind == "redis-restart-under-load":
        assert "burst pub 8" in f.detail and len(fleet.pub.pending) == 8
