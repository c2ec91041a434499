"""Runs a Node on asyncio: MQTT listeners, the /metrics + /healthz + /readyz endpoint, graceful drain."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from . import __version__, http, poller
from .api.app import Api
from .api.local import LocalApi
from .apikeys import ApiKeys
from .auth import UsersFileError, UsersFilePending
from .codec import RC
from .config import BrokerConfig, ConfigError, ListenerConfig, parse_bind
from .connection import Connection, ProxiedTlsListener, ProxyGate, Site, WriteBudget, WsConnection
from .limiter import Pacer
from .metrics import Metrics
from .node import Node
from .poller import PolledServer, Poller, listening_sockets
from .rebalance import Order, Progress
from .reclaim import Reclaimer, malloc_trim
from .store.base import SessionStore
from .store.memory import MemoryStore

log = logging.getLogger("fleetmq.server")

BACKLOG = 4096


def tls_context(listener: ListenerConfig) -> ssl.SSLContext:
    """TLS 1.2+ with the listener's certificate; client certificates verified against cafile if asked."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_certificates(ctx, listener)
    if listener.cafile:
        ctx.verify_mode = ssl.CERT_REQUIRED if listener.verify_peer else ssl.CERT_OPTIONAL
    return ctx


def load_certificates(ctx: ssl.SSLContext, listener: ListenerConfig) -> None:
    """(Re)load a listener's files into its context: new handshakes use them, open connections go on."""
    assert listener.certfile and listener.keyfile
    ctx.load_cert_chain(listener.certfile, listener.keyfile)
    if listener.cafile:
        ctx.load_verify_locations(listener.cafile)


def tls_files(listener: ListenerConfig) -> list[str]:
    return [f for f in (listener.certfile, listener.keyfile, listener.cafile) if f]


def make_store(config: BrokerConfig) -> SessionStore:
    if config.store.kind == "memory":
        return MemoryStore()
    from .store.redis_store import RedisStore

    return RedisStore.from_config(config.store, config.node_id)


WATCH_INTERVAL = 1.0


class Listening(Protocol):
    """An open listener: an asyncio.Server, or a ProxiedTlsListener."""

    @property
    def sockets(self) -> Sequence[socket.socket]: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


def _stamp(path: str) -> tuple[float, int, int] | None:
    try:
        st = os.stat(path)  # follows the symlinks a kubelet swaps when a ConfigMap changes
    except OSError:
        return None
    return st.st_mtime, st.st_size, st.st_ino


class Server:
    def __init__(
        self,
        config: BrokerConfig,
        reload: Callable[[], BrokerConfig] | None = None,
        watch: str | None = None,
        worker_socket: str | None = None,
    ) -> None:
        self.config = config
        # a worker of `--workers N`: listeners shared with SO_REUSEPORT, HTTP on a socket for the supervisor
        self._worker_socket = worker_socket
        self._reload = reload  # reads and validates the config file again
        self._watch = watch  # the file whose changes trigger a reload
        self.metrics = Metrics()
        self._proxy_logged = -1e9  # when a refused PROXY header was last logged (monotonic)
        self.node = Node(config, make_store(config), self.metrics, evict=self._rebalance)
        # what this node tells the management API of any node about its own connections
        self.local_api = LocalApi(self.node)
        if self.node.cluster is not None:
            self.node.cluster.answer = self.local_api.answer
        self._api: web.AppRunner | None = None
        self.connections: set[Connection] = set()
        buffers = config.write_buffers
        self.write_budget = WriteBudget(buffers.node, buffers.connection)
        self.listeners: dict[str, Listening] = {}
        self._tls: dict[str, ssl.SSLContext] = {}  # of the open tls/wss listeners, by name
        self._poller: Poller | None = None  # the epoll set of the connections not on the loop's transports
        self._http: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        #: a config waiting for its users files to arrive (UsersFilePending): their changes are watched
        self._pending: BrokerConfig | None = None
        self.ready = False
        #: the watched files as they were when the config was read, not when watching starts: a node
        #: waits for its store before it listens, and a ConfigMap changed meanwhile must still apply
        self._stamps = {path: _stamp(path) for path in self._watched()}

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        log.info("fleetmq %s, per-message path %s", __version__, self.metrics.path)
        # HTTP first: /healthz answers (and /readyz says not ready) while the node waits for its store
        if self._worker_socket:
            self._http = await http.serve(self._route, unix=self._worker_socket)
        elif self.config.metrics.bind:
            host, port = parse_bind(self.config.metrics.bind)
            self._http = await http.serve(self._route, host=host, port=port)
            log.info("metrics on http://%s:%d/metrics", host, port)
        await self.node.start()
        for listener in self.config.listeners:
            await self._open_listener(listener)
        self.node.spawn(Reclaimer(self.connections, malloc_trim()).run())
        if self.config.api.bind:
            await self._start_api(self.config.api.bind, self.config.api.keys_file)
        self.ready = True

    async def _start_api(self, bind: str, keys_file: str | None) -> None:
        """The management API and console; with --workers every worker serves it (SO_REUSEPORT), each
        answering for the whole fleet."""
        keys = ApiKeys(keys_file)
        if keys.error:
            log.error("management API keys: %s (no key is accepted until it is fixed)", keys.error)
        runner = web.AppRunner(Api(self.node, keys, self.local_api).app(), access_log=None)
        await runner.setup()
        host, port = parse_bind(bind)
        await web.TCPSite(
            runner, host, port, reuse_address=True, reuse_port=bool(self._worker_socket)
        ).start()
        self._api = runner
        log.info("management API on http://%s:%d/api/v1 (%d keys)", host, port, len(keys))

    async def _open_listener(self, listener: ListenerConfig) -> None:
        host, port = listener.address
        loop = asyncio.get_running_loop()
        by_cert = listener.peer_cert_as_username == "cn"
        site = Site(
            partial(self.node.channel, listener.zone),
            listener.name,
            self.connections,
            by_cert,
            self.write_budget,
        )
        if listener.protocol in ("ws", "wss"):
            connection: Callable[[], Connection] = partial(WsConnection, site, listener.path)
        else:
            connection = partial(Connection, site)
        factory: Callable[[], asyncio.Protocol] = connection
        refused = partial(self._proxy_refused, listener.name)
        if listener.proxy_protocol:
            factory = partial(ProxyGate, connection, listener.proxy_protocol_timeout, refused)
        ctx = tls_context(listener) if listener.protocol in ("tls", "wss") else None
        if ctx is not None:
            self._tls[listener.name] = ctx
        server: Listening
        if ctx is not None and listener.proxy_protocol:  # the header comes before the TLS handshake
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server(
                (host, port), family=family, backlog=BACKLOG, reuse_port=self._worker_socket is not None
            )
            timeout = listener.proxy_protocol_timeout
            server = ProxiedTlsListener(sock, connection, ctx, timeout, refused)
        elif ctx is None and self._polled(listener):
            sockets = listening_sockets(host, port, BACKLOG, reuse_port=self._worker_socket is not None)
            if self._poller is None:
                self._poller = Poller(loop)
            server = PolledServer(self._poller, sockets, factory)
        else:
            server = await loop.create_server(
                factory,
                host,
                port,
                reuse_address=True,
                reuse_port=self._worker_socket is not None,
                backlog=BACKLOG,
                ssl=ctx,
            )
        for sock in server.sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.listeners[listener.name] = server
        log.info(
            "listener %s (%s, zone %s, %s transport) on %s:%d",
            listener.name,
            listener.protocol,
            listener.zone,
            "epoll" if isinstance(server, PolledServer) else "the event loop's",
            host,
            port,
        )

    def _polled(self, listener: ListenerConfig) -> bool:
        """Whether `listener`'s connections are the poller's (config: transport)."""
        if listener.transport == "loop":
            return False
        if not poller.AVAILABLE:
            if listener.transport == "epoll":
                log.warning("listener %s: no epoll on this platform, the event loop's transports instead",
                            listener.name)  # fmt: skip
            return False
        return True

    def _proxy_refused(self, listener: str, why: str) -> None:
        """A connection closed for its PROXY header: counted, and logged at most once a second."""
        self.metrics.proxy_refused[listener] += 1
        now = time.monotonic()
        if now - self._proxy_logged >= 1.0:
            self._proxy_logged = now
            log.warning("listener %s: closed a connection without a valid PROXY header: %s", listener, why)

    async def serve_forever(self) -> None:
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        watcher = None
        if self._reload is not None:
            loop.add_signal_handler(signal.SIGHUP, lambda: self.node.spawn(self.reload(force=True)))
            watcher = loop.create_task(self._watch_files())
        await self._stopping.wait()
        if watcher is not None:
            watcher.cancel()
        await self.drain()

    def _watched(self) -> list[str]:
        """The config file, and the users and certificate files it names (mounted Secrets change on their
        own: a rotated certificate or a new user needs no restart)."""
        configs = [self.config] if self._pending is None else [self.config, self._pending]
        files = {z.users_file for c in configs for z in c.zones.values() if z.users_file}
        files.update(f.path for c in configs for z in c.zones.values() for f in z.users_files)
        files.update(f for lst in self.config.listeners for f in tls_files(lst))
        return [self._watch, *sorted(files)] if self._watch else sorted(files)

    async def _watch_files(self) -> None:
        last = self._stamps
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = {path: _stamp(path) for path in self._watched()}
            changed = [p for p, st in now.items() if st is not None and st != last.get(p)]
            last = now
            if changed:
                # a users file alone changes no config hash: re-apply anyway so its users count
                await self.reload(force=changed != [self._watch])

    async def reload(self, force: bool = False) -> bool:
        """Apply a changed config file live; an invalid one is refused whole (the last good one stays).

        ``force`` re-applies an unchanged config too, re-reading its users and certificate files (SIGHUP,
        edits of those files).
        """
        assert self._reload is not None
        try:
            new = self._reload()
            if new.store != self.config.store:
                log.warning("store settings changed in the config file: they apply at the next restart")
                new = new.model_copy(update={"store": self.config.store})
            if not force and new.config_hash() == self.node.config_hash:
                return True
            self.node.apply_config(new)
        except UsersFilePending as e:
            self._pending = new
            log.info("config waits for its users files, keeping the one it runs: %s", e)
            return False
        except (ConfigError, UsersFileError) as e:
            self.metrics.config_reload_errors += 1
            log.error("config reload refused, keeping the last good config:\n%s", e)
            return False
        for conn in list(self.connections):
            if conn.channel is not None:
                conn.channel.apply_zone()
        await self._apply_listeners(new)
        self.config = new
        self._pending = None
        if force:
            self._reload_certificates()
        await self.node.bridges_applied()  # (a bridge added or changed: its forwards routed by now)
        log.info("config %s applied", new.config_hash())
        return True

    def _reload_certificates(self) -> None:
        for lst in self.config.listeners:
            ctx = self._tls.get(lst.name)
            if ctx is None:
                continue
            try:
                tls_context(lst)  # the files as a whole first: a half-rotated pair must not go live
                load_certificates(ctx, lst)
            except (OSError, ssl.SSLError) as e:
                self.metrics.config_reload_errors += 1
                log.error(
                    "listener %s: certificate files not reloaded, the previous ones stay: %s", lst.name, e
                )

    async def _apply_listeners(self, new: BrokerConfig) -> None:
        """Open added listeners; close removed or changed ones (their clients get 0x8B and reconnect)."""
        old = {lst.name: lst for lst in self.config.listeners}
        wanted = {lst.name: lst for lst in new.listeners}
        for name, lst in old.items():
            if wanted.get(name) == lst:
                continue
            server = self.listeners.pop(name, None)
            self._tls.pop(name, None)
            if server is not None:
                server.close()
            for conn in list(self.connections):
                if conn.listener == name and conn.channel is not None:
                    conn.channel.kick(RC.SERVER_SHUTTING_DOWN, "listener_removed")
            log.info("listener %s closed", name)
        for name, lst in wanted.items():
            if old.get(name) != lst:
                try:
                    await self._open_listener(lst)
                except (OSError, NotImplementedError) as e:
                    self.metrics.config_reload_errors += 1
                    log.error("cannot open listener %s: %s", name, e)

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    async def drain(self, timeout: float | None = None) -> None:
        """Graceful stop: refuse new clients (not ready, listeners closed), hand the bridges over, let the
        connected clients go (paced: `shutdown.eviction_rate`), commit pending writes."""
        shutdown = self.config.shutdown
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (shutdown.timeout if timeout is None else timeout)
        log.info("draining: %d connections", len(self.connections))
        self.ready = False
        for server in self.listeners.values():
            server.close()
        await self.node.hand_over_bridges()
        if shutdown.eviction_rate:
            evicted = await self._evict(shutdown.eviction_rate, deadline)
            log.info("eviction: %d connections told to use another server", evicted)
        for conn in list(self.connections):  # (all at once, or those left at the deadline)
            if conn.channel is not None:
                conn.channel.kick(RC.SERVER_SHUTTING_DOWN, "server_shutdown")
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        try:
            await asyncio.wait_for(self.node.committer.drain(), max(0.1, deadline - loop.time()))
        except TimeoutError:
            log.warning("session store writes still pending at shutdown")
        self.node.cm.shutdown()
        for server in self.listeners.values():
            await server.wait_closed()
        if self._http is not None:
            await self._http.cleanup()
        if self._api is not None:
            await self._api.cleanup()
        await self.node.stop()
        if self._poller is not None:
            self._poller.close()
            self._poller = None
        log.info("stopped")

    async def _evict(self, rate: float, deadline: float, progress: Progress | None = None) -> int:
        """Tell connected clients, `rate` a second, to use another server (MQTT 5 0x9C; v3 clients are
        closed): they reconnect to the other nodes a few at a time, and their sessions move with them.
        All of them, or as many as a rebalance order asks for (`progress`: its count so far). Returns how
        many were told before the deadline."""
        loop = asyncio.get_running_loop()
        pacer = Pacer(rate)
        evicted = 0
        limit = progress.count if progress is not None else None
        for conn in list(self.connections):
            if evicted == limit:
                break
            now = loop.time()
            wait = pacer.delay(now)
            if now + wait >= deadline:
                break
            if wait:
                await asyncio.sleep(wait)
            if conn.channel is not None and conn in self.connections:
                conn.channel.kick(RC.USE_ANOTHER_SERVER, "evicted")
                pacer.went(loop.time())
                evicted += 1
                if progress is not None:
                    progress.evicted = evicted
        return evicted

    async def _rebalance(self, order: Order, progress: Progress) -> None:
        deadline = asyncio.get_running_loop().time() + max(0.0, order.until - time.time())
        await self._evict(order.rate, deadline, progress)

    # -- HTTP: /metrics, /healthz, /readyz --------------------------------------------------------
    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            registry = CollectorRegistry()
            registry.register(self.metrics.collector())
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            info: dict[str, Any] = {
                "ready": self.ready,
                "node_id": self.node.node_id,
                "pid": os.getpid(),
                "config_hash": self.node.config_hash,
                "connections": len(self.node.cm.channels),
                "listeners": sorted(self.listeners),
            }
            status = "200 OK" if self.ready else "503 Service Unavailable"
            return status, "application/json", json.dumps(info).encode() + b"\n"
        return "404 Not Found", "text/plain", b"not found\n"


async def run(
    config: BrokerConfig,
    reload: Callable[[], BrokerConfig] | None = None,
    watch: str | None = None,
    worker_socket: str | None = None,
) -> None:
    server = Server(config, reload, watch, worker_socket)
    await server.start()
    await server.serve_forever()
