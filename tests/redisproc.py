"""A real `redis-server` process for tests, driven by signals, plus a minimal RESP2 client.

Stdlib only (raw sockets), so the harness needs nothing beyond the redis-server binary:

    rs = RedisServer(tmp_path / "redis")      # started on a free 127.0.0.1 port, answers PING
    rs.command("SET", "k", "v")               # -> "OK"
    rs.kill(); rs.start()                     # same port and dir; appendfsync always keeps "k"
    rs.pause(); rs.resume()                   # SIGSTOP / SIGCONT
    rs.stop()                                 # SIGTERM, data kept on disk

Every started server is tracked in LIVE_REDIS and killed by pid at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
REDIS_SERVER_BIN = (
    os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"
)

# every RedisServer with a running process, so failing tests can show logs and nothing outlives pytest
LIVE_REDIS: list[RedisServer] = []


def redis_server_available() -> bool:
    return os.path.isfile(REDIS_SERVER_BIN) and os.access(REDIS_SERVER_BIN, os.X_OK)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ RESP2
class RedisReplyError(Exception):
    """An error reply (`-ERR ...`) from Redis."""


def _encode(args: tuple) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes | bytearray | memoryview):
            b = bytes(a)
        elif isinstance(a, str):
            b = a.encode()
        elif isinstance(a, int | float):
            b = repr(a).encode()
        else:
            raise TypeError(f"cannot send {type(a).__name__} to Redis: {a!r}")
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line, self.buf = self.buf[:i], self.buf[i + 2 :]
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def reply(self, decode: bool) -> Any:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.exact(n)
            return data.decode(errors="replace") if decode else data
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self.reply(decode) for _ in range(n)]
        raise ValueError(f"unexpected RESP reply: {line[:80]!r}")


def resp_call(
    host: str, port: int, *commands: tuple, decode: bool = False, timeout: float = 5.0
) -> list[Any]:
    """Send `commands` (tuples of arguments) on one new connection; return their replies in order.

    Error replies come back as RedisReplyError instances (not raised)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(b"".join(_encode(c) for c in commands))
        r = _Reader(s)
        return [r.reply(decode) for _ in commands]


# ------------------------------------------------------------------ the process
class RedisServer:
    """One redis-server on 127.0.0.1, data (AOF, fsync always) and log in `data_dir`.

    The port is chosen once (free port unless given) and kept across stop()/kill()/start()."""

    def __init__(self, data_dir: Path | str, port: int | None = None, *, autostart: bool = True):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port is not None
        self.port = port if port is not None else _free_port()
        self.proc: subprocess.Popen | None = None
        self.paused = False
        if autostart:
            self.start()

    # -- addresses
    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def log(self) -> str:
        parts = []
        for p in (self.data_dir / "redis.stdout", self.log_path):
            with contextlib.suppress(OSError):
                parts.append(p.read_text(errors="replace"))
        return "".join(parts)

    def argv(self) -> list[str]:
        d = str(self.data_dir)
        return [
            REDIS_SERVER_BIN,
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", d,
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip

    # -- lifecycle
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (again) on the same port and data dir; return once it answers PING."""
        if self.alive():
            raise RuntimeError(f"redis-server pid {self.pid} on port {self.port} is already running")
        if not redis_server_available():
            raise RuntimeError(f"redis-server not found at {REDIS_SERVER_BIN} (run `make deps`)")
        attempts = 1 if (self._fixed_port or self.proc is not None) else 3
        for attempt in range(attempts):
            self._spawn()
            try:
                self.wait_ready(timeout)
                return self
            except RuntimeError:
                exited = not self.alive()
                self._reap()
                # a free port taken by someone else between choosing and binding: choose another
                if exited and attempt + 1 < attempts and "Address already in use" in self.log():
                    self.port = _free_port()
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        with open(self.data_dir / "redis.stdout", "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.paused = False
        if self not in LIVE_REDIS:
            LIVE_REDIS.append(self)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until PING answers PONG (not -LOADING while the AOF is replayed)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise RuntimeError(f"redis-server exited with {code} on port {self.port}:\n{self.log()}")
            try:
                last = resp_call(HOST, self.port, ("PING",), timeout=0.5)[0]
                if last == "PONG":
                    return
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                self._signal(signal.SIGKILL)
                raise RuntimeError(
                    f"redis-server on port {self.port} not ready within {timeout}s ({last!r}):\n{self.log()}"
                )
            time.sleep(0.01)

    def _signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def _reap(self, timeout: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.paused = False
        if self in LIVE_REDIS:
            LIVE_REDIS.remove(self)
        return self.proc.returncode

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); the AOF stays in data_dir."""
        if self.paused:
            self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        return self._reap(timeout)

    def kill(self) -> int | None:
        """SIGKILL (kill -9) and reap; what was fsynced (everything acked, with appendfsync always) stays."""
        self._signal(signal.SIGKILL)
        return self._reap()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- client
    def command(self, *args: Any, decode: bool = False, timeout: float = 5.0) -> Any:
        """One command on a fresh connection: command("HGETALL", key). Simple strings -> str, integers -> int,
        bulk strings -> bytes (str with decode=True), nil -> None, arrays -> list; an error reply raises
        RedisReplyError (errors nested in arrays, e.g. from EXEC, are returned as RedisReplyError)."""
        reply = resp_call(HOST, self.port, args, decode=decode, timeout=timeout)[0]
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    def pipeline(self, *commands: tuple, decode: bool = False, timeout: float = 5.0) -> list[Any]:
        """Several commands on one connection in order (MULTI/EXEC work); errors are returned, not raised."""
        return resp_call(HOST, self.port, *commands, decode=decode, timeout=timeout)

    def ping(self, timeout: float = 1.0) -> bool:
        try:
            return self.command("PING", timeout=timeout) == "PONG"
        except (OSError, RedisReplyError):
            return False

    def keys(self, pattern: str = "*") -> list[str]:
        return sorted(self.command("KEYS", pattern, decode=True))

    def hgetall(self, key: str | bytes) -> dict[bytes, bytes]:
        flat = self.command("HGETALL", key)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def dbsize(self) -> int:
        return self.command("DBSIZE")

    def flushall(self) -> None:
        self.command("FLUSHALL")

    def info(self, section: str | None = None) -> dict[str, str]:
        """INFO [section] as {field: value} (values as text)."""
        text = self.command("INFO", *([section] if section else []), decode=True)
        out: dict[str, str] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and ":" in line:
                k, _, v = line.partition(":")
                out[k] = v
        return out

    def commandstats(self) -> dict[str, int]:
        """Calls per command from INFO commandstats: {"set": 3, "evalsha": 10, ...}; reset with
        command("CONFIG", "RESETSTAT")."""
        out: dict[str, int] = {}
        for k, v in self.info("commandstats").items():
            if k.startswith("cmdstat_"):
                fields = dict(kv.split("=", 1) for kv in v.split(","))
                out[k.removeprefix("cmdstat_")] = int(fields.get("calls", 0))
        return out

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.alive() else "stopped")
        return f"<RedisServer {self.url} pid={self.pid} {state} dir={self.data_dir}>"


@atexit.register
def _kill_leftovers() -> None:
    for rs in list(LIVE_REDIS):
        with contextlib.suppress(Exception):
            rs.kill()
