"""The fleet's processes: redis-server and fleetmq broker nodes, started, signalled and stopped by pid.

Every process the harness starts is recorded in STARTED and killed by pid at exit if still running, so a
crashed or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos.proxy import free_port as free_port  # (re-exported: one allocator for the harness)

HOST = "127.0.0.1"
REDIS_SERVER = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_SENTINEL = (
    os.environ.get("REDIS_SENTINEL_BIN") or shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
)
REDIS_CLI = os.environ.get("REDIS_CLI_BIN") or shutil.which("redis-cli") or "/usr/bin/redis-cli"
STARTED: list[subprocess.Popen[bytes]] = []


async def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(HOST, port), 0.5)
            w.close()
            return
        except (OSError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not listening on {port} after {timeout:.0f}s")
        await asyncio.sleep(0.05)


class Proc:
    """A child process that can be killed, paused, resumed and started again with the same command."""

    name: str
    log_path: Path

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.down = True  # killed (or not started) on purpose

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n----- chaos: start at {time.strftime('%H:%M:%S')} -----\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        STARTED.append(self.proc)
        self.paused = False
        self.down = False

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9 and reap."""
        self.down = True
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(5)
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    async def terminate(self, grace: float = 10.0) -> int | None:
        """SIGTERM (after SIGCONT if paused), SIGKILL after `grace`; returns the exit status."""
        self.down = True
        if self.proc is None:
            return None
        if self.paused:
            self.resume()
        self.signal(signal.SIGTERM)
        return await self.exited(grace)

    async def exited(self, grace: float) -> int | None:
        """Until the process exits, SIGKILL after `grace`; returns the exit status (-9 when killed)."""
        if self.proc is None:
            return None
        deadline = time.monotonic() + grace
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)
        return self.proc.returncode

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""


async def resp(port: int, *args: str | bytes, timeout: float = 2.0, raw: bool = False) -> Any:
    """One command to a Redis (or Sentinel) on loopback, its reply decoded: status and bulk strings as
    str (bulk strings as bytes if `raw`), integers as int, arrays as lists, nil as None; an error reply
    raises RuntimeError."""
    r, w = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    try:
        parts = [a if isinstance(a, bytes) else a.encode() for a in args]
        w.write(b"".join([b"*%d\r\n" % len(parts), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts)]))
        return await asyncio.wait_for(_reply(r, raw), timeout)
    finally:
        w.close()


async def _reply(r: asyncio.StreamReader, raw: bool = False) -> Any:
    line = (await r.readline()).rstrip(b"\r\n")
    kind, rest = line[:1], line[1:]
    if kind in (b"+", b"_"):
        return rest.decode() if kind == b"+" else None
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = (await r.readexactly(n + 2))[:-2]
        return data if raw else data.decode(errors="replace")
    if kind in (b"*", b"%"):
        n = int(rest)
        return None if n < 0 else [await _reply(r, raw) for _ in range(n * (2 if kind == b"%" else 1))]
    raise RuntimeError(f"unexpected reply {line!r}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def dump_keys(port: int) -> dict[str, Any]:
    """Every key of one Redis and its value, for reading after a failed run (the harness knows nothing of
    what the keys mean): key -> {"type", "value"}, bytes base64-encoded; a hash as {field: value}, a list
    or set as a list, a sorted set as [member, score] pairs, a stream by its length only."""
    out: dict[str, Any] = {}
    cursor = b"0"
    while True:
        cursor, keys = await resp(port, "SCAN", cursor, "COUNT", "1000", raw=True, timeout=10.0)
        for key in keys:
            kind = (await resp(port, "TYPE", key)) or "none"
            value: Any
            if kind == "hash":
                flat = await resp(port, "HGETALL", key, raw=True, timeout=10.0)
                value = {_b64(f): _b64(v) for f, v in zip(flat[::2], flat[1::2], strict=True)}
            elif kind == "list":
                value = [_b64(v) for v in await resp(port, "LRANGE", key, "0", "-1", raw=True, timeout=10.0)]
            elif kind == "set":
                value = [_b64(v) for v in await resp(port, "SMEMBERS", key, raw=True, timeout=10.0)]
            elif kind == "zset":
                flat = await resp(port, "ZRANGE", key, "0", "-1", "WITHSCORES", raw=True, timeout=10.0)
                value = [[_b64(m), sc.decode()] for m, sc in zip(flat[::2], flat[1::2], strict=True)]
            elif kind == "string":
                got = await resp(port, "GET", key, raw=True)
                value = _b64(got) if got is not None else None
            elif kind == "stream":
                value = {"length": await resp(port, "XLEN", key)}
            else:
                continue  # (gone meanwhile)
            out[key.decode(errors="backslashreplace")] = {"type": kind, "value": value}
        if cursor == b"0":
            return out


class Redis(Proc):
    """redis-server on a fixed loopback port with its data dir; AOF with appendfsync always unless `aof`
    is False (a Redis that forgets everything on restart: one of the deliberately broken fleets). `extra`:
    more arguments (a replica's --replicaof, a cluster node's settings); `announce`: those naming the
    address the others know it by, kept across restarts (`public_port`: a proxy's in front of it, else its
    own port)."""

    def __init__(
        self, name: str, data_dir: Path, log_dir: Path, *, aof: bool = True, extra: list[str] | None = None
    ):
        super().__init__()
        self.name, self.data_dir, self.aof = name, data_dir, aof
        self.port = free_port()
        self.public_port = self.port
        self.extra = extra or []
        self.announce: list[str] = []
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"

    def argv(self) -> list[str]:
        return [
            REDIS_SERVER, "--port", str(self.port), "--bind", HOST, "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.aof else "no", "--appendfsync", "always", "--save", "",
            "--daemonize", "no", "--protected-mode", "no", *self.announce, *self.extra,
        ]  # fmt: skip

    def known_as(self, port: int | None) -> bool:
        """Whether `port` (as a sentinel, a replica or the cluster names it) is this server."""
        return port is not None and port in (self.port, self.public_port)

    async def command(self, *args: str) -> Any:
        return await resp(self.port, *args)

    async def info(self, section: str = "replication") -> dict[str, str]:
        """INFO `section` as a dict (the harness's own connection, never through a proxy)."""
        text = str(await self.command("INFO", section))
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    async def shutdown(self, *args: str, grace: float = 15.0) -> int | None:
        """The SHUTDOWN command (with `args`, e.g. NOW), sent as a client would; until the process exits
        (SIGKILL after `grace`: a SHUTDOWN that failed). Returns the exit status."""
        self.down = True
        if self.paused:
            self.resume()
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):  # (no reply: the connection ends)
            await resp(self.port, "SHUTDOWN", *args, timeout=grace)
        return await self.exited(grace)

    async def role(self) -> str | None:
        """master or slave, None when it does not answer."""
        try:
            reply = await self.command("ROLE")
        except (OSError, TimeoutError, RuntimeError):
            return None
        return str(reply[0]) if reply else None

    async def start(self, timeout: float = 15.0) -> None:
        if not os.access(self.argv()[0], os.X_OK):
            raise RuntimeError(f"{self.argv()[0]} not found (make deps)")
        self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not await self.ping():  # PONG, not -LOADING while the AOF is replayed
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not answering PING after {timeout:.0f}s")
            await asyncio.sleep(0.05)

    async def ping(self) -> bool:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(HOST, self.port), 0.5)
        except (OSError, TimeoutError):
            return False
        try:
            w.write(b"*1\r\n$4\r\nPING\r\n")
            return await asyncio.wait_for(r.readline(), 0.5) == b"+PONG\r\n"
        except (OSError, TimeoutError):
            return False
        finally:
            w.close()


class Sentinel(Redis):
    """redis-sentinel on loopback watching `primary` under MASTER (at its public port: through its proxy
    when it has one), with a config file of its own (Sentinel rewrites it as it learns replicas, other
    sentinels and failovers)."""

    MASTER = "chaos"

    def __init__(self, name: str, data_dir: Path, log_dir: Path, primary: Redis, quorum: int = 2):
        super().__init__(name, data_dir, log_dir, aof=False)
        self.conf = data_dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind {HOST}\nprotected-mode no\ndaemonize no\ndir {data_dir}\n"
            f"sentinel monitor {self.MASTER} {HOST} {primary.public_port} {quorum}\n"
            f"sentinel down-after-milliseconds {self.MASTER} 2000\n"
            f"sentinel failover-timeout {self.MASTER} 10000\n"
            f"sentinel parallel-syncs {self.MASTER} 1\n"
        )

    def argv(self) -> list[str]:
        return [REDIS_SENTINEL, str(self.conf)]

    async def primary_port(self) -> int | None:
        try:
            reply = await self.command("SENTINEL", "get-master-addr-by-name", self.MASTER)
        except (OSError, TimeoutError, RuntimeError):
            return None
        return int(reply[1]) if reply else None


class Node(Proc):
    """One fleetmq broker node: `python -m fleetmq.broker --config FILE`, its listener, metrics and (with
    `api_keys`) management API ports chosen once and kept across restarts, its log appended."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        store: dict[str, Any],
        zone: dict[str, Any],
        api_keys: Path | None = None,
    ):
        super().__init__()
        self.name = name
        self.port, self.metrics_port = free_port(), free_port()
        self.api_port = free_port() if api_keys is not None else None
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        config: dict[str, Any] = {
            "node_id": name,
            "store": store,
            "zones": {"default": zone},
            "listeners": [{"name": "mqtt", "zone": "default", "bind": f"{HOST}:{self.port}"}],
            "metrics": {"bind": f"{HOST}:{self.metrics_port}"},
        }
        if api_keys is not None:
            config["api"] = {"bind": f"{HOST}:{self.api_port}", "keys_file": str(api_keys)}
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "fleetmq.broker",
            "--config",
            str(self.config_path),
            "--log-level",
            "info",
        ]

    async def start(self, timeout: float = 30.0) -> None:
        self.spawn()
        assert self.proc is not None
        await wait_listening(self.port, self.proc, timeout, self.name)

    async def metrics(self) -> str:
        """The node's /metrics text (empty when it does not answer)."""
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(HOST, self.metrics_port), 2)
        except (OSError, TimeoutError):
            return ""
        try:
            w.write(f"GET /metrics HTTP/1.0\r\nHost: {HOST}\r\n\r\n".encode())
            data = await asyncio.wait_for(r.read(), 5)
        except (OSError, TimeoutError):
            return ""
        finally:
            w.close()
        return data.partition(b"\r\n\r\n")[2].decode(errors="replace")


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`, from Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sname, _, rest = head.partition("{")
        if sname != name:
            continue
        have = dict(kv.split("=", 1) for kv in rest.rstrip("}").replace('"', "").split(",") if "=" in kv)
        if all(have.get(k) == v for k, v in labels.items()):
            with contextlib.suppress(ValueError):
                total += float(value)
    return total


@atexit.register
def _kill_leftovers() -> None:
    for p in STARTED:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGKILL)
