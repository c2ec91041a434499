"""`--workers N`: one pod, several cores. A supervisor runs N broker processes sharing the listening ports
(SO_REUSEPORT: the kernel spreads connections over them) and serves their /metrics, /healthz and /readyz
as one endpoint.

Each worker is a node of the fleet (node id ``<node_id>-<i>``) keeping its sessions in Redis, so clients
on different workers reach each other and take sessions over exactly as across pods. With the in-memory
store the workers would be separate brokers, so the option needs the Redis store.

The supervisor forwards SIGTERM/SIGINT (drain) and SIGHUP (reload) to its workers, restarts a worker that
dies (with backoff), and its workers die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from . import http
from .config import BrokerConfig, parse_bind

log = logging.getLogger("fleetmq.workers")

RESTART_BACKOFF = (0.5, 30.0)  # first and longest delay before restarting a dead worker
STOP_TIMEOUT = 30.0  # a draining worker gets this long before SIGKILL


def check(config: BrokerConfig, workers: int) -> str | None:
    """Why ``--workers`` cannot be used with this config (None if it can)."""
    if workers > 1 and config.store.kind != "redis":
        return (
            f"--workers {workers} needs the Redis session store (--redis-url URL or store: {{kind: redis}}): "
            "each worker is a node of the fleet sharing sessions and routes in Redis; with the in-memory "
            "store the workers would be separate brokers that cannot see each other's clients"
        )
    return None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Worker:
    def __init__(self, index: int, argv: list[str], socket_path: str) -> None:
        self.index = index
        self.argv = argv
        self.socket = socket_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        log.info("worker %d started (pid %d)", self.index, self.proc.pid)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


class Supervisor:
    def __init__(self, config: BrokerConfig, argv: Sequence[str], workers: int) -> None:
        self.config = config
        self._dir = tempfile.mkdtemp(prefix="fleetmq-workers-")
        self.workers = []
        for i in range(workers):
            sock = os.path.join(self._dir, f"w{i}.sock")
            node_id = f"{config.node_id}-{i}"
            cmd = [
                sys.executable,
                "-m",
                "fleetmq.broker",
                *argv,
                "--node-id",
                node_id,
                "--worker-socket",
                sock,
            ]
            self.workers.append(Worker(i, cmd, sock))
        self._stopping = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._signal_all(signal.SIGHUP))
        http_server = None
        if self.config.metrics.bind:
            host, port = parse_bind(self.config.metrics.bind)
            http_server = await http.serve(self._route, host=host, port=port)
        for w in self.workers:
            w.start()
        watchers = [loop.create_task(self._keep_running(w)) for w in self.workers]
        await stop.wait()
        self._stopping = True
        log.info("stopping %d workers", len(self.workers))
        self._signal_all(signal.SIGTERM)
        await asyncio.gather(*watchers, return_exceptions=True)
        if http_server is not None:
            await http_server.cleanup()
        for w in self.workers:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(w.socket)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
        return 0

    def stopping(self) -> bool:
        """(A call: mypy would take the attribute as still False after an await.)"""
        return self._stopping

    def _signal_all(self, sig: int) -> None:
        for w in self.workers:
            w.signal(sig)

    async def _keep_running(self, w: Worker) -> None:
        delay = RESTART_BACKOFF[0]
        while True:
            assert w.proc is not None
            proc = w.proc
            code = await asyncio.to_thread(self._wait, proc)
            if self.stopping():
                return
            log.error(
                "worker %d (pid %d) exited with %s; restarting in %.1fs", w.index, proc.pid, code, delay
            )
            await asyncio.sleep(delay)
            if self.stopping():
                return
            delay = min(delay * 2, RESTART_BACKOFF[1])
            w.restarts += 1
            w.start()

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                return proc.wait(timeout=STOP_TIMEOUT if self._stopping else 1.0)
            except subprocess.TimeoutExpired:
                if self._stopping:
                    log.warning("worker pid %d still draining after %.0fs: killed", proc.pid, STOP_TIMEOUT)
                    proc.kill()

    # -- HTTP -----------------------------------------------------------------------------------
    async def _ask(self, path: str) -> list[tuple[int, bytes] | None]:
        async def one(w: Worker) -> tuple[int, bytes] | None:
            try:
                return await http.get_unix(w.socket, path, timeout=5.0)
            except (OSError, TimeoutError, ValueError, IndexError, aiohttp.ClientError):
                return None

        return list(await asyncio.gather(*(one(w) for w in self.workers)))

    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            texts = [r[1].decode() if r and r[0] == 200 else "" for r in await self._ask("/metrics")]
            return "200 OK", CONTENT_TYPE_LATEST, merge_metrics(texts)
        if path in ("/healthz", "/readyz"):
            answers = await self._ask(path)
            ok = all(a is not None and a[0] == 200 for a in answers)
            if path == "/healthz":
                return (
                    ("200 OK" if ok else "503 Service Unavailable"),
                    "text/plain",
                    b"ok\n" if ok else b"down\n",
                )
            reports: list[dict[str, Any]] = [
                json.loads(a[1]) if a is not None and a[1] else {"ready": False} for a in answers
            ]
            hashes = {r.get("config_hash") for r in reports}
            info = {
                "ready": ok,
                "node_id": self.config.node_id,
                "config_hash": hashes.pop() if len(hashes) == 1 else None,
                "connections": sum(r.get("connections", 0) for r in reports),
                "listeners": sorted({name for r in reports for name in r.get("listeners", [])}),
                "workers": reports,
            }
            return (
                ("200 OK" if ok else "503 Service Unavailable"),
                "application/json",
                json.dumps(info).encode(),
            )
        return "404 Not Found", "text/plain", b"not found\n"


def merge_metrics(texts: Sequence[str]) -> bytes:
    """The workers' expositions as one, each sample labelled with its worker's index."""
    families: dict[str, Metric] = {}
    for index, text in enumerate(texts):
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp)

    class Merged:
        def collect(self) -> list[Metric]:
            return list(families.values())

    registry = CollectorRegistry()
    registry.register(Merged())
    return generate_latest(registry)
