"""The chaos harness's other parts that need no servers: the Redis proxy's request framing and rules (on a
stand-in upstream that records what reaches it), the nemesis's kinds, and the wall between the harness,
the tests and the product."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from chaos.nemesis import KINDS, REDIS_KINDS, parse_kinds
from chaos.proxy import Proxy, request_end

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
