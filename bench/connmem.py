"""What one subscribed connection holds (issue 30), beside the `subscribed` row's RSS per connection.

    python -m bench.connmem floor [--loop uvloop|asyncio] [--transport loop|epoll] [--conns N]
        A bare asyncio Protocol with one slot, answering CONNECT, SUBSCRIBE and PINGREQ and nothing else:
        what a transport alone costs per connection (RSS), the floor under any broker written on it: the
        event loop's own (loop), or fleetmq's (epoll: broker/poller.py, what its tcp listeners use).
    python -m bench.connmem trace [--conns N] [--top K]
        fleetmq (in-memory store, interpreted) under tracemalloc: the bytes each connection's allocations
        hold, by the line that made them, while the connections are open and once they closed.
    python -m bench.connmem arenas [--compiled] [--conns N]
        fleetmq (in-memory store) once the connections closed and it gave memory back: CPython's small-
        object arenas still in use, and in each one mostly free, what keeps it (gdb reads the arenas and
        the type of each live block: bench/arenawalk.py). With --compiled, the mypyc build's.

All open the connections with the loadgen's idle mode (`-subscribe`, each to a topic of its own, 1,000
connecting at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import brokers, driver, procs
from tests.support import free_port, stop_process, wait_port

HOST = "127.0.0.1"
SETTLE_S = 2.0


# ---------------------------------------------------------------------------------------------- floor
class _Bare(asyncio.Protocol):
    __slots__ = ("t",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: Any = transport

    def data_received(self, data: bytes) -> None:
        i = 0
        while i < len(data):
            kind, n, mul, j = data[i] >> 4, 0, 1, i + 1
            while True:
                b = data[j]
                n, mul, j = n + (b & 127) * mul, mul * 128, j + 1
                if b < 128:
                    break
            if kind == 1:  # CONNECT -> CONNACK
                self.t.write(b"\x20\x02\x00\x00")
            elif kind == 8:  # SUBSCRIBE -> SUBACK granting QoS 0
                self.t.write(b"\x90\x03" + data[j : j + 2] + b"\x00")
            elif kind == 12:  # PINGREQ -> PINGRESP
                self.t.write(b"\xd0\x00")
            i = j + n


async def _serve_bare(port: int, transport: str) -> None:
    loop = asyncio.get_running_loop()
    if transport == "epoll":
        from fleetmq.broker.poller import PolledServer, Poller, listening_sockets

        PolledServer(Poller(loop), listening_sockets(HOST, port, 4096, reuse_port=False), _Bare)
    else:
        await loop.create_server(_Bare, HOST, port, backlog=4096)
    await asyncio.Event().wait()


def _held(port: int, pid: int, conns: int) -> tuple[int, int]:
    """RSS of `pid` (KB) before and with `conns` subscribed connections from the loadgen."""
    before = procs.rss_kb(pid)
    held = driver.IdleConns(driver.build(), port, conns, timeout=600, subscribe=True, concurrency=1000)
    try:
        if held.result.get("connected") != conns:
            raise SystemExit(f"connmem: {held.result}")
        time.sleep(SETTLE_S)
        return before, procs.rss_kb(pid)
    finally:
        held.close()


def floor(loop: str, transport: str, conns: int) -> None:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "bench.connmem", "_bare", loop, transport, str(port)])
    try:
        wait_port(HOST, port, 15)
        time.sleep(1.0)
        before, after = _held(port, child.pid, conns)
    finally:
        stop_process(child)
    what = f"{loop}'s transport" if transport == "loop" else f"fleetmq's epoll transport on {loop}"
    print(f"bare Protocol, {what}: {conns:,} subscribed connections, RSS {before / 1024:.1f} -> "
          f"{after / 1024:.1f} MB: {(after - before) / conns:.2f} KB per connection")  # fmt: skip


# ---------------------------------------------------------------------------------------------- trace
def _traced(config: str, snapshots: str) -> None:
    """fleetmq's main under tracemalloc; a file `<snapshots>/take.<name>` makes it dump `<name>.snap`."""
    tracemalloc.start(8)
    folder = Path(snapshots)

    def watch() -> None:
        while True:
            time.sleep(0.2)
            for take in folder.glob("take.*"):
                name = take.name.removeprefix("take.")
                take.unlink()
                tracemalloc.take_snapshot().dump(str(folder / f"{name}.snap"))

    threading.Thread(target=watch, daemon=True).start()
    from fleetmq.broker.cli import main

    sys.exit(main(["--config", config, "--log-level", "warning"]))


def _snapshot(folder: Path, name: str) -> tracemalloc.Snapshot:
    (folder / f"take.{name}").touch()
    path = folder / f"{name}.snap"
    deadline = time.monotonic() + 120
    while not path.exists() or (folder / f"take.{name}").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"connmem: no snapshot {name}")
        time.sleep(0.2)
    time.sleep(0.5)  # (written whole)
    return tracemalloc.Snapshot.load(str(path))


def _report(what: str, base: tracemalloc.Snapshot, snap: tracemalloc.Snapshot, conns: int, top: int) -> None:
    stats = snap.compare_to(base, "lineno")
    print(f"\n{what}: {sum(s.size_diff for s in stats) / conns:,.0f} B traced per connection")
    for s in stats[:top]:
        frame = s.traceback[0]
        where = frame.filename.split("site-packages/")[-1].replace(str(Path.cwd()) + "/", "")
        print(f"  {s.size_diff / conns:7.0f} B  {s.count_diff / conns:5.2f} blocks  {where}:{frame.lineno}")


def trace(conns: int, top: int) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fleetmq-connmem-") as tmp:
        folder = Path(tmp)
        config = folder / "fleetmq.yaml"
        config.write_text(
            "node_id: connmem\nstore: {kind: memory}\n"
            f'listeners:\n  - {{name: mqtt, zone: default, bind: "{HOST}:{port}", protocol: tcp}}\n'
        )
        child = subprocess.Popen([sys.executable, "-m", "bench.connmem", "_traced", str(config), tmp])
        try:
            wait_port(HOST, port, 60)
            time.sleep(1.0)
            base = _snapshot(folder, "base")
            held = driver.IdleConns(
                driver.build(), port, conns, timeout=600, subscribe=True, concurrency=1000
            )
            try:
                if held.result.get("connected") != conns:
                    raise SystemExit(f"connmem: {held.result}")
                time.sleep(SETTLE_S)
                with_them = _snapshot(folder, "held")
            finally:
                held.close()
            time.sleep(5.0)
            closed = _snapshot(folder, "closed")
        finally:
            stop_process(child)
    _report(f"{conns:,} subscribed connections open", base, with_them, conns, top)
    _report("after they closed", base, closed, conns, top)


# --------------------------------------------------------------------------------------------- arenas
def arenas(compiled: bool, conns: int) -> None:
    if shutil.which("gdb") is None:
        subprocess.run(["bash", str(brokers.REPO / "scripts" / "system-deps.sh"), "debug"], check=True)
    with tempfile.TemporaryDirectory(prefix="fleetmq-connmem-") as tmp:
        node = brokers.FleetmqCompiled(Path(tmp)) if compiled else brokers.Fleetmq(Path(tmp))
        node.start()
        try:
            time.sleep(1.0)  # (settled, as the bench's rows start)
            before, with_them = _held(node.port, node.pid, conns)
            time.sleep(5.0)  # (as the bench's `subscribed` row: the node has trimmed by then)
            closed = procs.rss_kb(node.pid)
            walked = subprocess.run(
                ["gdb", "-p", str(node.pid), "-batch", "-nx", "-ex", f"source {Path(__file__).with_name('arenawalk.py')}"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        finally:
            node.stop()
    found = [json.loads(line[6:]) for line in walked.stdout.splitlines() if line.startswith("ARENA ")]
    if not found:
        raise SystemExit(
            f"connmem: gdb read no arenas (the interpreter's debug symbols?): {walked.stderr[-500:]}"
        )
    print(f"{node.name}: {conns:,} subscribed connections, RSS {before / 1024:.1f} -> {with_them / 1024:.1f} MB, "
          f"{closed / 1024:.1f} MB 5 s after they closed: {(with_them - closed) / (with_them - before):.0%} given back")  # fmt: skip
    sparse = [a for a in found if a["free"] * 2 >= a["total"]]
    print(f"{len(found)} arenas of 1 MB in use; {len(sparse)} of them more than half free, kept by:")
    blocks: collections.Counter[str] = collections.Counter()
    only: collections.Counter[str] = collections.Counter()
    for a in sparse:
        blocks.update(a["live"])
        if len(a["live"]) == 1:
            only.update(a["live"].keys())
    for kind, n in blocks.most_common(15):
        alone = f", the only kind in {only[kind]} arenas" if only[kind] else ""
        print(f"  {n:5d} {kind}{alone}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_bare"]:  # (the child of `floor`)
        loop, transport, port = argv[1], argv[2], int(argv[3])
        if loop == "uvloop":
            import uvloop

            uvloop.run(_serve_bare(port, transport))
        else:
            asyncio.run(_serve_bare(port, transport))
        return 0
    if argv[:1] == ["_traced"]:  # (the child of `trace`)
        _traced(argv[1], argv[2])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.connmem", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("floor", help="a bare asyncio Protocol's RSS per connection")
    f.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    f.add_argument("--transport", choices=["loop", "epoll"], default="loop")
    f.add_argument("--conns", type=int, default=10000)
    t = sub.add_parser("trace", help="fleetmq's allocations per connection, by line (tracemalloc)")
    t.add_argument("--conns", type=int, default=5000)
    t.add_argument("--top", type=int, default=20)
    r = sub.add_parser("arenas", help="what keeps CPython's arenas once the connections closed (gdb)")
    r.add_argument("--compiled", action="store_true", help="the mypyc build (scripts/compiled.py)")
    r.add_argument("--conns", type=int, default=18000)
    a = p.parse_args(argv)
    procs.raise_nofile()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if a.what == "floor":
        floor(a.loop, a.transport, a.conns)
    elif a.what == "arenas":
        arenas(a.compiled, a.conns)
    else:
        trace(a.conns, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
