"""Ports, processes and a Redis server: the one copy the tests and the bench (bench/) share.

    port = free_port()                                # a free 127.0.0.1 port (chaos/proxy.py's allocator)
    wait_port(HOST, port, 15, proc)                   # until it accepts TCP (RuntimeError if proc exits first)
    wait_until(lambda: ready(), timeout=5, msg="x")   # poll a predicate, AssertionError on timeout
    stop_process(proc, grace=5)                       # SIGTERM by pid, SIGKILL after grace; reaped
    kill_process(proc)                                # SIGKILL by pid; reaped
    srv = TcpServer(handle)                           # a thread calling handle(conn) per connection
    srv.close()                                       # the port is free when this returns

    rs = RedisServer(tmp_path / "redis")              # redis-server on a free port, AOF with fsync always
    rs.command("SET", "k", "v")                       # -> "OK", through redis-py on a fresh connection
    rs.client()                                       # a redis.Redis (redis-py's own API) on that server
    rs.kill(); rs.start()                             # same port and dir; appendfsync always keeps "k"
    rs.pause(); rs.resume()                           # SIGSTOP / SIGCONT
    rs.stop()                                         # SIGTERM, data kept on disk

Only the standard library, redis-py (a dependency of the broker itself) and chaos/proxy.py (standard library
only), so tests/kubeapi.py, which must import without the test extra, can use it too. Every started RedisServer is tracked in LIVE_REDIS (the test
report shows their logs) and killed by pid at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from chaos.proxy import free_port as free_port  # (re-exported: one port allocator for tests, bench and chaos)

HOST = "127.0.0.1"
T = TypeVar("T")


# ------------------------------------------------------------------ ports and waiting
def wait_until(
    pred: Callable[[], T], timeout: float = 5.0, interval: float = 0.02, msg: str = "condition"
) -> T:
    """Call `pred` until it returns something true and return that; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {msg}")
        time.sleep(interval)


def wait_port(host: str, port: int, timeout: float = 15.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """Block until host:port accepts TCP connections; RuntimeError when `proc` exits first or time runs out
    (the process is left as it is)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"did not listen on {host}:{port} within {timeout:g}s")
        time.sleep(0.05)


# ------------------------------------------------------------------ processes
class TcpServer:
    """A listening socket on a free loopback port whose thread hands each connection to `handle`.

    close() shuts the socket down before closing it: a bare close() leaves a listener blocked in accept()
    in another thread listening, so the port stays taken (a server started on it next fails to bind) and
    one more connection is accepted."""

    def __init__(self, handle: Callable[[socket.socket], None], host: str = HOST) -> None:
        self._handle = handle
        self._srv = socket.create_server((host, 0))
        self.host, self.port = host, int(self._srv.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._handle(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._srv.shutdown(socket.SHUT_RDWR)
        self._srv.close()
        self._thread.join(timeout=10)


def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def stop_process(proc: subprocess.Popen[Any], grace: float = 5.0) -> int | None:
    """SIGTERM by pid (and SIGCONT, so a stopped process acts on it), SIGKILL if it is still there after
    `grace` seconds; reaped. Returns the exit code (-15, -9, ...)."""
    _signal(proc, signal.SIGTERM)
    _signal(proc, signal.SIGCONT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        return kill_process(proc)
    return proc.returncode


def kill_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int | None:
    """SIGKILL by pid (kill -9: a crash) and reap. Returns the exit code."""
    _signal(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    return proc.returncode


# ------------------------------------------------------------------ redis-py clients
RedisReplyError = redis.ResponseError  # an error reply (`-ERR ...`, `-WRONGTYPE ...`) from Redis

_NO_RETRY = Retry(NoBackoff(), 0)  # a fault shows at once: tests kill and pause the server on purpose
# no CLIENT SETINFO on connect (`driver_info` in recent redis-py, `lib_name`/`lib_version` in older ones)
_NO_SETINFO: dict[str, None] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def _redis(
    port: int, *, decode: bool, timeout: float, raw: bool, password: str | None = None, host: str = HOST
) -> redis.Redis:
    """A redis.Redis with its own pool (closed with it): RESP2, no retries, no CLIENT SETINFO (nothing but
    the caller's commands reaches the server, so INFO commandstats counts only those). `raw`: replies as
    Redis sends them (no redis-py response callbacks; status replies as str)."""
    pool = redis.ConnectionPool(
        host=host,
        port=port,
        password=password,
        protocol=2,  # no HELLO; RESP2 replies (HGETALL a flat array), as the tests read them
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=_NO_RETRY,
        decode_responses=decode,
        encoding_errors="replace",
        **_NO_SETINFO,
    )
    client = redis.Redis.from_pool(pool)
    if raw:
        client.response_callbacks.clear()
    return client


@contextlib.contextmanager
def _as_oserror() -> Iterator[None]:
    """redis-py's connection errors as the OSError a socket would raise (ConnectionError, TimeoutError)."""
    try:
        yield
    except redis.TimeoutError as e:
        raise TimeoutError(str(e)) from e
    except redis.ConnectionError as e:  # refused, closed, -LOADING (BusyLoadingError)
        raise ConnectionError(str(e)) from e


# ------------------------------------------------------------------ redis-server
REDIS_SERVER_BIN = (
    os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"
)

# every RedisServer with a running process, so failing tests can show logs and nothing outlives pytest
LIVE_REDIS: list[RedisServer] = []


def redis_server_available() -> bool:
    return os.path.isfile(REDIS_SERVER_BIN) and os.access(REDIS_SERVER_BIN, os.X_OK)


class RedisServer:
    """One redis-server on 127.0.0.1, data and log in `data_dir`; by default an AOF with fsync always (what
    the broker acks is on disk), `appendonly=False` for none. `config`: more `--name value` arguments.

    The port is chosen once (a free port unless given) and kept across stop()/kill()/start(). `password`:
    what its clients here authenticate with (a subclass that starts it otherwise sets it on the server)."""

    password: str | None = None

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        *,
        autostart: bool = True,
        appendonly: bool = True,
        appendfsync: str = "always",
        config: Mapping[str, str] | None = None,
        replicaof: RedisServer | None = None,
    ):
        self.replicaof = replicaof  # started as a replica of that server (Sentinel may move it later)
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.config = dict(config or {})
        self.proc: subprocess.Popen[bytes] | None = None
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
        extra = [a for k, v in self.config.items() for a in (f"--{k}", v)]
        return [
            REDIS_SERVER_BIN,
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self.log_path),
            *(["--replicaof", HOST, str(self.replicaof.port)] if self.replicaof is not None else []),
            *extra,
        ]  # fmt: skip

    def env(self) -> dict[str, str] | None:
        """The process' environment (None: this process' own)."""
        return None

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
                    self.port = free_port()
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        with open(self.data_dir / "redis.stdout", "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env()
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
                last = self.command("PING", timeout=0.5)
                if last == b"PONG":
                    return
            except (OSError, RedisReplyError) as e:
                last = e
            if time.monotonic() > deadline:
                if self.proc is not None:
                    kill_process(self.proc)
                raise RuntimeError(
                    f"redis-server on port {self.port} not ready within {timeout}s ({last!r}):\n{self.log()}"
                )
            time.sleep(0.01)

    def _reap(self, timeout: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_process(self.proc)
        self.paused = False
        if self in LIVE_REDIS:
            LIVE_REDIS.remove(self)
        return self.proc.returncode

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout`) and reap, paused or not; the AOF stays in data_dir."""
        if self.proc is not None:
            stop_process(self.proc, timeout)
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL (kill -9) and reap; what was fsynced (everything acked, with appendfsync always) stays."""
        if self.proc is not None:
            kill_process(self.proc)
        return self._reap()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers."""
        if self.proc is not None:
            _signal(self.proc, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.proc is not None:
            _signal(self.proc, signal.SIGCONT)
        self.paused = False

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients (redis-py)
    def client(self, *, decode: bool = False, timeout: float = 5.0) -> redis.Redis:
        """A redis.Redis on this server with redis-py's usual replies (INFO parsed into dicts, SET -> True),
        no retries; close it (or use it as a context manager)."""
        return _redis(
            self.port, decode=decode, timeout=timeout, raw=False, password=self.password, host=self.host
        )

    def command(self, *args: Any, decode: bool = False, timeout: float = 5.0) -> Any:
        """One command on a fresh connection: command("HGETALL", key). Replies as Redis sends them: status
        replies -> str, integers -> int, bulk strings -> bytes (str with decode=True), nil -> None,
        arrays -> list. An error reply raises RedisReplyError (errors nested in arrays, e.g. from EXEC, are
        returned as RedisReplyError); no connection, a timeout or -LOADING raise OSError."""
        with (
            _as_oserror(),
            _redis(
                self.port, decode=decode, timeout=timeout, raw=True, password=self.password, host=self.host
            ) as r,
        ):
            return r.execute_command(*args)

    def pipeline(self, *commands: tuple[Any, ...], decode: bool = False, timeout: float = 5.0) -> list[Any]:
        """Several commands on one connection in order (MULTI/EXEC work); errors are returned, not raised."""
        with (
            _as_oserror(),
            _redis(
                self.port, decode=decode, timeout=timeout, raw=True, password=self.password, host=self.host
            ) as r,
        ):
            pipe = r.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            return pipe.execute(raise_on_error=False)

    def ping(self, timeout: float = 1.0) -> bool:
        try:
            return self.command("PING", timeout=timeout) == b"PONG"
        except (OSError, RedisReplyError):
            return False

    def keys(self, pattern: str = "*") -> list[str]:
        return sorted(self.command("KEYS", pattern, decode=True))

    def hgetall(self, key: str | bytes) -> dict[bytes, bytes]:
        flat = self.command("HGETALL", key)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def dbsize(self) -> int:
        return int(self.command("DBSIZE"))

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


# ------------------------------------------------------------------ redis-sentinel
REDIS_SENTINEL_BIN = (
    os.environ.get("REDIS_SENTINEL_BIN") or shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
)


class SentinelServer(RedisServer):
    """One redis-sentinel on 127.0.0.1 watching `primary` under `master`, with a config file of its own in
    `data_dir` (Sentinel rewrites it as it learns the replicas, the other sentinels and failovers)."""

    def __init__(
        self,
        data_dir: Path | str,
        primary: RedisServer,
        *,
        master: str = "fleetmq",
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 10000,
        autostart: bool = True,
    ):
        self.primary, self.master, self.quorum = primary, master, quorum
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        super().__init__(data_dir, autostart=autostart, appendonly=False)

    @property
    def conf_path(self) -> Path:
        return self.data_dir / "sentinel.conf"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def argv(self) -> list[str]:
        if not self.conf_path.exists():  # (kept across restarts: what it learnt stays)
            m = self.master
            self.conf_path.write_text(
                f"port {self.port}\nbind {HOST}\nprotected-mode no\ndaemonize no\n"
                f"dir {self.data_dir}\nlogfile {self.log_path}\n"
                f"sentinel monitor {m} {HOST} {self.primary.port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {m} {self.down_after_ms}\n"
                f"sentinel failover-timeout {m} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {m} 1\n"
            )
        return [REDIS_SENTINEL_BIN, str(self.conf_path)]

    def primary_port(self) -> int | None:
        """The port of the primary this sentinel names now."""
        reply = self.command("SENTINEL", "get-master-addr-by-name", self.master)
        return int(reply[1]) if reply else None


class ReplicatedRedis:
    """A primary with `replicas` replicas and `sentinels` sentinels, every one a real process on loopback
    (what a fleet's `store: {sentinel: ...}` points at). `servers[0]` starts as the primary; after a
    failover `primary()` says which one is."""

    def __init__(
        self,
        base_dir: Path | str,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master: str = "fleetmq",
        down_after_ms: int = 2000,
        appendonly: bool = True,
        appendfsync: str = "always",
    ):
        base = Path(base_dir)
        self.master = master
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        try:
            disk = {"appendonly": appendonly, "appendfsync": appendfsync}
            primary = RedisServer(base / "redis-0", **disk)
            self.servers.append(primary)
            for i in range(1, replicas + 1):
                self.servers.append(RedisServer(base / f"redis-{i}", replicaof=primary, **disk))
            self.wait_synced(replicas)
            for i in range(sentinels):
                self.sentinels.append(
                    SentinelServer(
                        base / f"sentinel-{i}",
                        primary,
                        master=master,
                        quorum=sentinels // 2 + 1,
                        down_after_ms=down_after_ms,
                    )
                )
            wait_until(
                lambda: all(self._knows_all(s, replicas, sentinels) for s in self.sentinels),
                timeout=30,
                msg="every sentinel sees every replica and sentinel",
            )
        except BaseException:
            self.stop()
            raise

    def _knows_all(self, s: SentinelServer, replicas: int, sentinels: int) -> bool:
        info = dict(zip(*[iter(s.command("SENTINEL", "master", self.master, decode=True))] * 2, strict=True))
        return int(info["num-slaves"]) >= replicas and int(info["num-other-sentinels"]) >= sentinels - 1

    def store(self, **extra: Any) -> dict[str, Any]:
        """The broker config's store for this deployment."""
        return {
            "kind": "redis",
            "sentinel": {"nodes": [s.address for s in self.sentinels], "master": self.master},
            **extra,
        }

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        for s in self.sentinels:
            if s.alive() and not s.paused:
                with contextlib.suppress(OSError, RedisReplyError):
                    port = s.primary_port()
                    return next(r for r in self.servers if r.port == port)
        raise RuntimeError("no sentinel answers")

    def wait_synced(self, n: int | None = None, timeout: float = 30.0) -> None:
        """Until the primary has `n` (default: every other live server) replicas online and caught up."""
        want = n if n is not None else sum(1 for r in self.servers if r.alive()) - 1

        def synced() -> bool:
            try:
                rep = (
                    self.primary().info("replication")
                    if self.sentinels
                    else self.servers[0].info("replication")
                )
            except (OSError, RuntimeError):
                return False
            offset = int(rep.get("master_repl_offset", "0"))
            online = [
                v for k, v in rep.items() if k.startswith("slave") and k[5:].isdigit() and "state=online" in v
            ]
            caught_up = [
                v for v in online if int(dict(kv.split("=") for kv in v.split(","))["offset"]) >= offset
            ]
            return len(caught_up) >= want

        wait_until(synced, timeout=timeout, msg=f"{want} replicas in sync")

    def wait_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Until the sentinels name another primary than `old`, and it says it is one."""

        def moved() -> bool:
            try:
                new = self.primary()
                return new is not old and new.info("replication").get("role") == "master"
            except (OSError, RuntimeError):
                return False

        wait_until(moved, timeout=timeout, msg="a failover")
        return self.primary()

    def stop(self) -> None:
        for p in [*self.sentinels, *self.servers]:
            p.stop()


# ------------------------------------------------------------------ Redis Cluster
REDIS_CLI_BIN = os.environ.get("REDIS_CLI_BIN") or shutil.which("redis-cli") or "/usr/bin/redis-cli"


class RedisCluster:
    """A Redis Cluster of `shards` primaries with `replicas` replicas each, every node a redis-server on
    loopback (cluster-enabled, AOF fsync always, cluster-node-timeout `node_timeout_ms`), created with
    `redis-cli --cluster create`, as an operator would."""

    def __init__(
        self,
        base_dir: Path | str,
        *,
        shards: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        appendonly: bool = True,
        appendfsync: str = "always",
    ):
        base = Path(base_dir)
        self.servers: list[RedisServer] = []
        try:
            for i in range(shards * (1 + replicas)):
                self.servers.append(
                    RedisServer(
                        base / f"node-{i}",
                        appendonly=appendonly,
                        appendfsync=appendfsync,
                        config={
                            "cluster-enabled": "yes",
                            "cluster-config-file": "nodes.conf",
                            "cluster-node-timeout": str(node_timeout_ms),
                            "cluster-port": str(free_port()),  # (the bus; port + 10000 may be taken)
                            "repl-diskless-sync-delay": "0",
                        },
                    )
                )
            out = subprocess.run(
                [REDIS_CLI_BIN, "--cluster", "create", *(f"{HOST}:{r.port}" for r in self.servers),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            wait_until(self.healthy, timeout=30, msg="cluster_state:ok on every node")
            self.wait_synced()
        except BaseException:
            self.stop()
            raise

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok and every slot is served."""
        try:
            for r in self.servers:
                if r.alive() and not r.paused:
                    info = r.command("CLUSTER", "INFO", decode=True)
                    if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                        return False
            return True
        except (OSError, RedisReplyError):
            return False

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Until every live replica's link to its primary is up (a replica that never synced cannot take
        over)."""

        def synced() -> bool:
            try:
                reps = [r.info("replication") for r in self.servers if r.alive() and not r.paused]
            except OSError:
                return False
            return all(i.get("role") == "master" or i.get("master_link_status") == "up" for i in reps)

        wait_until(synced, timeout=timeout, msg="every replica in sync")

    def store(self, **extra: Any) -> dict[str, Any]:
        """The broker config's store for this cluster (every node listed; any one would do)."""
        return {"kind": "redis", "cluster": {"nodes": [f"{HOST}:{r.port}" for r in self.servers]}, **extra}

    def primaries(self) -> list[RedisServer]:
        return [r for r in self.servers if r.alive() and r.info("replication").get("role") == "master"]

    def shards(self) -> list[tuple[list[tuple[int, int]], int | None]]:
        """(slot ranges, port of the online primary or None) per shard, as a live node sees it."""
        viewer = next(r for r in self.servers if r.alive() and not r.paused)
        out = []
        for shard in viewer.command("CLUSTER", "SHARDS", decode=True):
            info = dict(zip(shard[::2], shard[1::2], strict=True))
            ranges = list(zip(info["slots"][::2], info["slots"][1::2], strict=True))
            nodes = [dict(zip(n[::2], n[1::2], strict=True)) for n in info["nodes"]]
            primary = next(
                (n["port"] for n in nodes if n["role"] == "master" and n["health"] == "online"), None
            )
            out.append(([(int(a), int(b)) for a, b in ranges], primary))
        return out

    def primary_of(self, key: str) -> RedisServer:
        """The server whose slots hold `key` now."""
        slot = int(self.servers[0].command("CLUSTER", "KEYSLOT", key))
        for ranges, port in self.shards():
            if port is not None and any(a <= slot <= b for a, b in ranges):
                return next(r for r in self.servers if r.port == port)
        raise RuntimeError(f"no primary serves slot {slot}")

    def wait_failover(self, old: RedisServer, timeout: float = 30.0) -> None:
        """Until every slot has an online primary other than `old` and the cluster is whole again."""

        def moved() -> bool:
            try:
                shards = self.shards()
            except (OSError, RedisReplyError, StopIteration):
                return False
            served = all(port is not None and port != old.port for ranges, port in shards if ranges)
            return served and self.healthy()

        wait_until(moved, timeout=timeout, msg="a replica took over the killed primary's slots")

    def stop(self) -> None:
        for r in self.servers:
            r.stop()


@atexit.register
def _kill_leftovers() -> None:
    for rs in list(LIVE_REDIS):
        with contextlib.suppress(Exception):
            rs.kill()
