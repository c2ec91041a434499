"""A fleet for the Redis rows: one redis-server started by the bench and fleetmq nodes sharing it.

- redis-server on a free port with a temporary data dir, no persistence (`--save "" --appendonly no`),
  stopped (SIGTERM, then SIGKILL) by pid afterwards.
- fleetmq nodes `a` and `b` (`node_id: a` / `b`), `store: {kind: redis}`, each with two listeners: `mqtt`
  (zone `bench`, limits lifted like the in-memory broker's) and `tk` (zone `takeover`: an Inflight Window
  of TAKEOVER_INFLIGHT so that the takeover session has a full window and a queue), and /metrics.
- A raw RESP client (no redis-py needed) for INFO commandstats / stats, and a /metrics reader.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import procs
from bench.brokers import HOST, START_TIMEOUT, Broker, BrokerError, Fleetmq

TAKEOVER_INFLIGHT = 32  # zone `takeover` max_inflight (EMQX's default); the loadgen's -inflight


class RedisError(RuntimeError):
    """An error reply, or Redis could not be reached or started."""


class Resp:
    """A minimal blocking RESP2 client: enough for PING, INFO and CONFIG."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.f = self.sock.makefile("rb")

    def close(self) -> None:
        self.f.close()
        self.sock.close()

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> Any:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        out = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        self.sock.sendall(out)
        return self._read()

    def _read(self) -> Any:
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise RedisError("connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RedisError(f"bad reply {line[:40]!r}")

    def info(self, section: str) -> dict[str, str]:
        text = self.command("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and ":" in line:
                k, _, v = line.partition(":")
                out[k] = v
        return out

    def commandstats(self) -> dict[str, int]:
        """Calls per command (`evalsha`, `script|exists`, ...), commands run inside scripts included."""
        return {k: v["calls"] for k, v in self.commandstats_full().items()}

    def commandstats_full(self) -> dict[str, dict[str, int]]:
        """{command: {"calls": n, "failed_calls": n, "rejected_calls": n}}."""
        out = {}
        for k, v in self.info("commandstats").items():
            fields = dict(f.split("=", 1) for f in v.split(","))
            out[k.removeprefix("cmdstat_")] = {
                f: int(fields.get(f, 0)) for f in ("calls", "failed_calls", "rejected_calls")
            }
        return out

    def errorstats(self) -> dict[str, int]:
        """Error replies by prefix (`NOSCRIPT`, `ERR`, ...) since the start (Redis 6.2+)."""
        out = {}
        for k, v in self.info("errorstats").items():
            out[k.removeprefix("errorstat_")] = int(v.partition("=")[2] or 0)
        return out


class RedisServer:
    """redis-server on a free loopback port, no persistence, data dir under the bench's temp dir."""

    name = "redis"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir / "redis"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str:
        env = os.environ.get("REDIS_SERVER_BIN")
        found = (
            env
            or shutil.which("redis-server")
            or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
        )
        if not found:
            raise BrokerError("redis-server not found (run scripts/system-deps.sh)")
        return found

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.stop()
        self.port = procs.free_port(HOST)
        cmd = [
            self.binary(),
            *("--port", str(self.port), "--bind", HOST, "--dir", str(self.workdir)),
            *("--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"),
            *("--logfile", str(self.log_path)),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError as e:
            raise BrokerError(f"cannot run {cmd[0]}: {e}") from e
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise BrokerError(f"redis-server exited with code {self.proc.returncode}{self.log_tail()}")
            try:
                with Resp(HOST, self.port, timeout=1.0) as r:
                    if r.command("PING") == "PONG":
                        return
            except (OSError, RedisError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"redis-server not answering PING on {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL if it is still there after a grace period."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        self.proc = None

    def client(self) -> Resp:
        return Resp(HOST, self.port)

    def exit_reason(self) -> str:
        rc = self.proc.returncode if self.proc is not None else None
        return f"redis-server exited (code {rc}){self.log_tail()}"

    def log_tail(self, lines: int = 3) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return (": " + " | ".join(t.strip() for t in tail))[:400] if tail else ""


class FleetNode(Broker):
    """One fleetmq node of the bench fleet: sessions in the bench's Redis, /metrics on a free port."""

    tls = False

    def __init__(self, workdir: Path, node_id: str, redis: RedisServer) -> None:
        self.name = f"fleetmq-{node_id}"
        self.node_id = node_id
        self.redis = redis
        self.tk_port = 0
        self.cr_port = 0
        self.metrics_port = 0
        self.event_log = False  # --event-log: the eventlog-pt2pt row measures its cost
        super().__init__(workdir)

    def command(self) -> list[str]:
        self.tk_port = procs.free_port(HOST)
        self.cr_port = procs.free_port(HOST)
        self.metrics_port = procs.free_port(HOST)
        cfg = self.workdir / "fleetmq.yaml"
        cfg.write_text(
            f"node_id: {self.node_id}\n"
            f'store: {{kind: redis, url: "{self.redis.url}"}}\n'
            "zones:\n"
            "  bench: {max_inflight: 0, max_mqueue_len: 0, max_awaiting_rel: 0}\n"
            f"  takeover: {{max_inflight: {TAKEOVER_INFLIGHT}, max_mqueue_len: 0, max_awaiting_rel: 0}}\n"
            "  crash: {}\n"  # EMQX's defaults (window 32, queue 1,000): the crash-takeover row
            "event_log: {fleet: bench, max_len: 200000}\n"
            "listeners:\n"
            f'  - {{name: mqtt, zone: bench, bind: "{HOST}:{self.port}", protocol: tcp}}\n'
            f'  - {{name: tk, zone: takeover, bind: "{HOST}:{self.tk_port}", protocol: tcp}}\n'
            f'  - {{name: cr, zone: crash, bind: "{HOST}:{self.cr_port}", protocol: tcp}}\n'
        )
        return [
            Fleetmq.python(),
            *("-m", "fleetmq.broker", "--config", str(cfg)),
            *("--redis-url", self.redis.url, "--metrics", f"{HOST}:{self.metrics_port}"),
            *("--log-level", "warning"),
            *(("--event-log",) if self.event_log else ()),
        ]

    def start(self) -> None:
        super().start()
        try:
            procs.wait_port(HOST, self.tk_port, START_TIMEOUT, self.proc)
            procs.wait_port(HOST, self.cr_port, START_TIMEOUT, self.proc)
            procs.wait_port(HOST, self.metrics_port, START_TIMEOUT, self.proc)
        except RuntimeError as e:
            self.stop()
            raise BrokerError(f"{self.name} {e}{self.log_tail()}") from e

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The node's /metrics as {name: [(labels, value), ...]}."""
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            name, _, labels = head.partition("{")
            pairs = {}
            for item in labels.rstrip("}").split(","):
                if "=" in item:
                    k, _, v = item.partition("=")
                    pairs[k.strip()] = v.strip().strip('"')
            out.setdefault(name, []).append((pairs, float(value)))
        return out


def metric_sum(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in metrics.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


class Fleet:
    """The bench's Redis plus nodes a and b, started on demand and restarted if one died."""

    def __init__(self, workdir: Path) -> None:
        self.redis = RedisServer(workdir)
        self.nodes = {n: FleetNode(workdir, n, self.redis) for n in ("a", "b")}

    def ensure(self, wanted: tuple[str, ...]) -> str | None:
        """Run exactly the `wanted` nodes (others stopped, so a one-node row has one node); return an error."""
        try:
            if not self.redis.alive():
                if self.redis.proc is not None:
                    print(f"  {self.redis.exit_reason()}; restarting the fleet", file=sys.stderr, flush=True)
                for node in self.nodes.values():
                    node.stop()  # they point at the old port
                self.redis.start()
            for name, node in self.nodes.items():
                if name not in wanted:
                    node.stop()
                elif not node.alive():
                    if node.proc is not None:
                        print(f"  {node.exit_reason()}; restarting", file=sys.stderr, flush=True)
                    node.start()
        except BrokerError as e:
            return str(e)
        return None

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.redis.stop()

    def cpu_pids(self, wanted: tuple[str, ...]) -> dict[str, int]:
        return {f"node {n}": self.nodes[n].pid for n in wanted if self.nodes[n].alive()}

    def dead(self, wanted: tuple[str, ...]) -> str | None:
        """Why the fleet is broken, if it is."""
        if not self.redis.alive():
            return self.redis.exit_reason()
        for n in wanted:
            if not self.nodes[n].alive():
                return self.nodes[n].exit_reason()
        return None

    def log_paths(self) -> dict[str, Path]:
        out = {name: node.log_path for name, node in self.nodes.items()}
        out["redis"] = self.redis.log_path
        return {f"fleet-{k}": v for k, v in out.items()}


def store_snapshot(node: FleetNode, redis: RedisServer, qos: int) -> dict[str, float]:
    """Counters read before and after a run to derive Redis round trips per delivered message."""
    m = node.metrics()
    with redis.client() as r:
        full = r.commandstats_full()
        reads = int(r.info("stats").get("total_reads_processed", 0))
        errors = r.errorstats()
    stats = {k: v["calls"] for k, v in full.items()}
    failed = {f"failed:{k}": float(v["failed_calls"] + v["rejected_calls"]) for k, v in full.items()}
    return {
        **failed,
        **{f"error:{k}": float(v) for k, v in errors.items()},
        "round_trips": metric_sum(m, "fleetmq_store_round_trips_total"),
        "delivered": metric_sum(m, "fleetmq_messages_delivered_total", qos=str(qos)),
        "evalsha": float(stats.get("evalsha", 0) + stats.get("evalsha_ro", 0) + stats.get("eval", 0)),
        "script_exists": float(stats.get("script|exists", 0)),
        "commands": float(sum(stats.values())),
        "redis_reads": float(reads),
    }


def store_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Deltas and per-delivered-message rates; `redis_errors`: failed commands and error replies (by
    command / error prefix) that Redis counted during the run."""
    d: dict[str, Any] = {k: after[k] - before.get(k, 0.0) for k in after if ":" not in k}
    errors = {k: after[k] - before.get(k, 0.0) for k in after if ":" in k}
    d["redis_errors"] = {k: int(v) for k, v in errors.items() if v > 0}
    d["redis_errors_unexpected"] = _unexpected(d["redis_errors"])
    n = d["delivered"]
    for k in ("round_trips", "evalsha", "script_exists", "commands", "redis_reads"):
        d[f"{k}_per_msg"] = d[k] / n if n else float("nan")
    return d


def _unexpected(errors: dict[str, int]) -> dict[str, int]:
    """Errors other than what redis-py causes by design: NOSCRIPT on a script's first EVALSHA (it then
    loads the script and retries; counted as a failed evalsha too), and ERR for CLIENT SETINFO on each new
    connection (Redis before 7.2 does not know it)."""
    out = dict(errors)
    noscript = out.pop("error:NOSCRIPT", 0)
    out.pop("error:ERR", None)
    for cmd in ("failed:evalsha", "failed:evalsha_ro"):
        take = min(noscript, out.get(cmd, 0))
        noscript -= take
        if cmd in out:
            out[cmd] -= take
    return {k: v for k, v in out.items() if v > 0}
