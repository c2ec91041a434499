"""A fleet for the Redis rows: one redis-server started by the bench and fleetmq nodes sharing it.

- redis-server (tests/support.py's RedisServer) on a free port with a temporary data dir, no persistence
  (`--save "" --appendonly no`), stopped (SIGTERM, then SIGKILL) by pid afterwards.
- fleetmq nodes `a` and `b` (`node_id: a` / `b`), `store: {kind: redis}`, each with two listeners: `mqtt`
  (zone `bench`, limits lifted like the in-memory broker's) and `tk` (zone `takeover`: an Inflight Window
  of TAKEOVER_INFLIGHT so that the takeover session has a full window and a queue), and /metrics.
- redis-py for INFO commandstats / stats / errorstats, and a /metrics reader.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetmq.broker import apikeys

from bench.brokers import HOST, START_TIMEOUT, Broker, BrokerError, Fleetmq
from chaos import codec
from tests.support import RedisServer, free_port, wait_port

TAKEOVER_INFLIGHT = 32  # zone `takeover` max_inflight (EMQX's default); the loadgen's -inflight


class BenchRedis(RedisServer):
    """The shared RedisServer (tests/support.py) as the bench runs it: a free loopback port, no persistence,
    data and log under the bench's temp dir; a failed start is a BrokerError (an error cell)."""

    name = "redis"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir / "redis", autostart=False, appendonly=False)

    def start(self, timeout: float = START_TIMEOUT) -> BenchRedis:
        try:
            super().start(timeout)
        except RuntimeError as e:
            raise BrokerError(f"{str(e).splitlines()[0]}{self.log_tail()}") from e
        return self

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM by pid, SIGKILL if it is still there after a grace period; forgotten, so that ensure()
        does not report a deliberate stop as a crash."""
        code = super().stop(timeout)
        self.proc = None
        return code

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

    def __init__(self, workdir: Path, node_id: str, redis: BenchRedis) -> None:
        self.name = f"fleetmq-{node_id}"
        self.node_id = node_id
        self.redis = redis
        self.tk_port = 0
        self.cr_port = 0
        self.metrics_port = 0
        self.event_log = False  # --event-log: the eventlog-pt2pt row measures its cost
        self.api = False  # the management API on (the api-list row)
        self.api_port = 0
        self.api_key = ""
        super().__init__(workdir)

    def command(self) -> list[str]:
        self.tk_port = free_port(HOST)
        self.cr_port = free_port(HOST)
        self.metrics_port = free_port(HOST)
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
        if self.api:
            keys = self.workdir / "api-keys.yaml"
            keys.unlink(missing_ok=True)
            self.api_key = apikeys.add(keys, "bench", "viewer")
            self.api_port = free_port(HOST)
            cfg.write_text(
                cfg.read_text() + f'api: {{bind: "{HOST}:{self.api_port}", keys_file: "{keys}"}}\n'
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
            if self.api:
                wait_port(HOST, self.api_port, START_TIMEOUT, self.proc)
            wait_port(HOST, self.tk_port, START_TIMEOUT, self.proc)
            wait_port(HOST, self.cr_port, START_TIMEOUT, self.proc)
            wait_port(HOST, self.metrics_port, START_TIMEOUT, self.proc)
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
        self.redis = BenchRedis(workdir)
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


def store_snapshot(node: FleetNode, redis: BenchRedis, qos: int) -> dict[str, float]:
    """Counters read before and after a run to derive Redis round trips per delivered message."""
    m = node.metrics()
    with redis.client() as r:  # redis-py parses INFO: {"cmdstat_evalsha": {"calls": 3, ...}, ...}
        commandstats = r.info("commandstats")
        reads = int(r.info("stats").get("total_reads_processed", 0))
        errorstats = r.info("errorstats")  # error replies by prefix (`NOSCRIPT`, `ERR`, ...), Redis 6.2+
    # per command (`evalsha`, `script|exists`, ...), commands run inside scripts included
    full = {k.removeprefix("cmdstat_"): v for k, v in commandstats.items()}
    errors = {k.removeprefix("errorstat_"): int(v.get("count", 0)) for k, v in errorstats.items()}
    stats = {k: int(v.get("calls", 0)) for k, v in full.items()}
    failed = {
        f"failed:{k}": float(v.get("failed_calls", 0) + v.get("rejected_calls", 0)) for k, v in full.items()
    }
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


# -- the management API over many sessions (the api-list row) ---------------------------------------------
async def _sessions(port: int, n: int, prefix: str, concurrency: int = 200) -> None:
    """n persistent MQTT 5 sessions (expiry an hour), made by clients that connect and leave."""
    ids = iter(range(n))

    async def worker() -> None:
        for i in ids:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(codec.connect(f"{prefix}-{i:05d}", version=codec.V5, clean=False,
                                       props={"session_expiry_interval": 3600}))  # fmt: skip
            await reader.readexactly(1)  # the CONNACK: its type, its remaining length, the rest
            length, shift = 0, 0
            while (byte := (await reader.readexactly(1))[0]) & 0x80:
                length, shift = length | (byte & 0x7F) << shift, shift + 7
            await reader.readexactly(length | byte << shift)
            writer.write(codec.disconnect(version=codec.V5))
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def time_client_listing(node: FleetNode, n: int, rounds: int = 5) -> dict[str, Any]:
    """Make `n` sessions on `node`, then time GET /api/v1/clients (the first page of 100 over all of
    them, which sorts and counts every one) `rounds` times."""
    prefix = f"apil{time.time_ns() % 10**8}"
    t0 = time.monotonic()
    asyncio.run(_sessions(node.port, n, prefix))
    made_s = time.monotonic() - t0
    req = urllib.request.Request(f"http://{HOST}:{node.api_port}/api/v1/clients?limit=100",
                                 headers={"Authorization": f"Bearer {node.api_key}"})  # fmt: skip
    seconds, count = [], 0
    for _ in range(rounds):
        t = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.loads(r.read())
        seconds.append(round(time.monotonic() - t, 3))
        count = body["meta"]["count"]
    if count < n:
        raise BrokerError(f"the API listed {count} clients of the {n} sessions made")
    return {"sessions": count, "seconds": seconds, "seconds_median": statistics.median(seconds),
            "made_s": round(made_s, 1)}  # fmt: skip
