"""Build and drive the Go load generator (bench/loadgen).

The generator is Go, not Python, so that it costs far less CPU per message than
either broker and the comparison measures the brokers, not the client.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent / "loadgen"


class LoadgenError(RuntimeError):
    """The load generator failed (build, crash, or a scenario error it reported)."""


def cache_dir() -> Path:
    env = os.environ.get("FLEETMQ_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fleetmq" / "bench"


def _go() -> str:
    go = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(p).exists()), None
    )
    if not go:
        raise LoadgenError("the Go toolchain (go 1.22+) is needed to build bench/loadgen")
    return go


def build(cache: Path | None = None) -> Path:
    """Return the loadgen binary, (re)building it when missing or older than its sources."""
    cache = cache or cache_dir()
    binary = cache / "loadgen"
    sources = [*SRC.glob("*.go"), SRC / "go.mod"]
    newest = max(p.stat().st_mtime for p in sources)
    if binary.exists() and binary.stat().st_mtime >= newest:
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"loadgen.tmp{os.getpid()}"
    env = dict(os.environ)
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod").strip()
    proc = subprocess.run(
        [_go(), "build", "-buildvcs=false", "-o", str(tmp), "."],
        cwd=SRC,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise LoadgenError(f"go build failed: {proc.stderr.strip()[-800:]}")
    tmp.replace(binary)
    return binary


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                return None
    return None


def run_flow(
    binary: Path,
    port: int,
    mode: str,
    qos: int,
    *,
    duration: float,
    warmup: float,
    window: int,
    payload: int,
    sub_port: int | None = None,
    clean: bool = True,
    tls_ca: str | None = None,
    cpu_pids: dict[str, int] | None = None,
    subs: int | None = None,
) -> dict[str, Any]:
    """Run one throughput/latency scenario; returns the loadgen's JSON result.

    sub_port: subscribers connect there (another fleet node) instead of `port`.
    clean=False: persistent sessions (clean_session=0) for publishers and subscribers.
    tls_ca: every client speaks TLS to `port`, verifying the broker against this CA file.
    subs: subscribers (the loadgen's default by mode otherwise).
    cpu_pids: {name: pid} whose user + system CPU seconds in the measured window come back as
    ``window_cpu_s`` (read by the loadgen from /proc at the window's edges).
    """
    cmd = [
        str(binary),
        *("-host", "127.0.0.1", "-port", str(port), "-mode", mode, "-qos", str(qos)),
        *("-duration", f"{duration}s", "-warmup", f"{warmup}s", "-window", str(window)),
        *("-payload", str(payload), "-json"),
    ]
    if sub_port is not None:
        cmd += ["-sub-port", str(sub_port)]
    if not clean:
        cmd.append("-clean=false")
    if tls_ca is not None:
        cmd += ["-tls-ca", tls_ca]
    if subs is not None:
        cmd += ["-subs", str(subs)]
    if cpu_pids:
        cmd += ["-cpu-pids", ",".join(f"{name}={pid}" for name, pid in cpu_pids.items())]
    return _run(cmd, timeout=duration + warmup + 60)


def run_takeover(
    binary: Path, port_a: int, port_b: int, qos: int, *, reps: int, queued: int, inflight: int, payload: int
) -> dict[str, Any]:
    """Takeover latency: sessions with a full inflight window and `queued` messages on the node at port_a
    are taken over by a connect to the node at port_b, `reps` times (plus 2 unmeasured)."""
    cmd = [
        str(binary),
        *("-host", "127.0.0.1", "-port", str(port_a), "-sub-port", str(port_b), "-mode", "takeover"),
        *("-qos", str(qos), "-reps", str(reps), "-queued", str(queued), "-inflight", str(inflight)),
        *("-payload", str(payload), "-json"),
    ]
    return _run(cmd, timeout=60 + reps * 45)


def run_broadcast(
    binary: Path, port: int, *, conns: int, messages: int, qos: int, payload: int, cpu_pids: dict[str, int]
) -> dict[str, Any]:
    """`conns` connections subscribed to one topic, `messages` published to it: each reaches all of them.
    Returns the deliveries counted and the CPU seconds of `cpu_pids` from the first publish to the last."""
    cmd = [
        str(binary),
        *("-host", "127.0.0.1", "-port", str(port), "-mode", "broadcast", "-qos", str(qos)),
        *("-conns", str(conns), "-concurrency", "1000", "-messages", str(messages), "-payload", str(payload)),
        *("-cpu-pids", ",".join(f"{name}={pid}" for name, pid in cpu_pids.items()), "-json"),
    ]
    return _run(cmd, timeout=600)


def _run(cmd: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LoadgenError("loadgen timed out") from e
    res = _last_json(proc.stdout)
    if res is None:
        raise LoadgenError(f"loadgen exit {proc.returncode}: {proc.stderr.strip()[-300:] or 'no output'}")
    if res.get("error"):
        raise LoadgenError(str(res["error"]))
    return res


class IdleConns:
    """Holds `conns` idle MQTT connections open (a loadgen child) until closed."""

    def __init__(
        self,
        binary: Path,
        port: int,
        conns: int,
        timeout: float = 120.0,
        subscribe: bool = False,
        concurrency: int = 200,
    ) -> None:
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-port",
                str(port),
                "-mode",
                "idle",
                "-conns",
                str(conns),
                "-concurrency",
                str(concurrency),
                *(["-subscribe"] if subscribe else []),
                "-hold",
                "600s",
                "-json",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.result = self._read_result(timeout)

    def _read_result(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                self.close()
                raise LoadgenError(f"idle loadgen gave no result within {timeout:.0f}s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.close()
                raise LoadgenError(f"idle loadgen exited: {err.strip()[-300:] or 'no output'}")
            buf += chunk
        res = _last_json(buf.decode(errors="replace").split("\n", 1)[0])
        if res is None:
            self.close()
            raise LoadgenError("idle loadgen printed no JSON")
        return res

    def close(self) -> None:
        """Close stdin (the loadgen then disconnects everything) and reap it."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
