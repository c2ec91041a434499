"""Shared pytest configuration and the integration-test fixtures.

FLEETMQ_TEST_BROKER=mosquitto runs the tests marked `generic` against mosquitto (the others are skipped);
by default the tests run against `python -m fleetmq.broker`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import uuid

import pytest

from tests import kubeapi
from tests.integration import harness
from tests.integration.harness import LIVE_BROKERS, MOSQUITTO, BrokerProc, ClientFactory
from tests.support import (
    LIVE_REDIS,
    REDIS_SENTINEL_BIN,
    REDIS_SERVER_BIN,
    RedisCluster,
    RedisServer,
    ReplicatedRedis,
    redis_server_available,
)


# tryfirst: the envtest and helm marks are set before `-m` selects (scripts/test.sh runs those once built)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "control_plane" in fixtures:
            item.add_marker(pytest.mark.envtest)
        if "helm" in fixtures:
            item.add_marker(pytest.mark.helm)
    if not MOSQUITTO:
        return
    skip = pytest.mark.skip(reason="fleetmq-specific test (FLEETMQ_TEST_BROKER=mosquitto)")
    for item in items:
        if "integration" in item.nodeid and "generic" not in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.failed and rep.when in ("call", "setup"):
        for bp in list(LIVE_BROKERS):
            log = bp.log()
            tail = log[-8000:]
            rep.sections.append(
                (f"{bp.kind} broker pid {bp.pid} port {bp.port} log (tail)", tail or "<empty>")
            )
        for rs in list(LIVE_REDIS):
            rep.sections.append((f"redis-server pid {rs.pid} port {rs.port} log (tail)", rs.log()[-4000:]))
        if "control_plane" in getattr(item, "fixturenames", ()):
            for p in list(kubeapi.LIVE_PROCS):
                rep.sections.append((f"{p.name} pid {p.pid} log (tail)", p.log(3000) or "<empty>"))
    return rep


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """CA, server (127.0.0.1) and client certificates: {"server": (crt, key), "client": (crt, key), "ca"}."""
    from tests.integration.pki import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def _module_broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("broker")
    holder: list[BrokerProc] = []

    def get() -> BrokerProc:
        if holder and not holder[-1].alive():
            holder[-1].stop()  # it died during an earlier test (which failed on its own)
        if not holder or not holder[-1].alive():
            holder.append(harness.start_mosquitto(workdir) if MOSQUITTO else harness.start_fleetmq(workdir))
        return holder[-1]

    yield get
    for bp in holder:
        bp.stop()


@pytest.fixture
def broker(_module_broker) -> BrokerProc:
    """The default broker (zone "default", EMQX defaults), shared by the tests of a module;
    restarted if an earlier test killed it. Tests use unique client ids and topics."""
    return _module_broker()


@pytest.fixture
def start_broker(tmp_path, request):
    """Factory: start_broker(config=None, *, zone_overrides=None, extra_args=()) -> BrokerProc.

    A fleetmq broker with its own config (zone "default" + overrides); stopped at teardown."""
    for store in ("redis_proxy", "replicated_redis", "redis_cluster"):
        if store in request.fixturenames:
            request.getfixturevalue(store)
    started: list[BrokerProc] = []

    def start(config: dict | None = None, *, zone_overrides: dict | None = None, extra_args=()):
        if MOSQUITTO:
            pytest.skip("needs a fleetmq broker with a specific config")
        bp = harness.start_fleetmq(
            tmp_path / f"b{len(started)}", config, zone_overrides=zone_overrides, extra_args=extra_args
        )
        started.append(bp)
        return bp

    yield start
    for bp in started:
        bp.stop()


@pytest.fixture
def clients(broker):
    """Factory of connected paho clients on the default broker: clients(client_id=None, version=4, ...)."""
    f = ClientFactory(broker)
    yield f
    f.close_all()


@pytest.fixture
def client_factory():
    """Factory of paho clients for any broker: client_factory(broker=bp, version=5, ...)."""
    factories: dict[int, ClientFactory] = {}

    def make(client_id: str | None = None, *, broker: BrokerProc, **kw):
        f = factories.setdefault(id(broker), ClientFactory(broker))
        return f(client_id, **kw)

    yield make
    for f in factories.values():
        f.close_all()


@pytest.fixture
def raw_clients():
    """Factory of harness RawClient sockets closed at teardown: raw_clients(broker, version=5)."""
    from tests.integration.mqttraw import RawClient

    made: list[RawClient] = []

    def make(bp: BrokerProc, version: int = 4, timeout: float = 5.0) -> RawClient:
        c = RawClient(bp.host, bp.port, version=version, timeout=timeout)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture(autouse=True)
def _no_leaked_threads(request):
    if "integration" not in request.node.nodeid:
        yield
        return
    before = set(threading.enumerate())
    yield
    leaked = []
    for t in threading.enumerate():
        if t not in before and t.is_alive() and t.name.startswith("paho-"):
            with contextlib.suppress(RuntimeError):
                t.join(2)
            if t.is_alive():
                leaked.append(t.name)
    assert not leaked, f"leaked client threads: {leaked}"


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server (RedisServer) on a free 127.0.0.1 port with a fresh data dir (AOF, fsync always),
    answering PING; stopped at teardown (killed by pid if SIGTERM does not end it)."""
    if not redis_server_available():
        pytest.fail(f"redis-server not found at {REDIS_SERVER_BIN}: run `make deps` or set REDIS_SERVER_BIN")
    rs = RedisServer(tmp_path / "redis")
    yield rs
    rs.stop()


@pytest.fixture
def fleet(redis_server, tmp_path, request):
    """Factory: fleet(n, zone_overrides=None, config=None, *, extra_args=(), redis_url=None, wrap=())
    -> list[BrokerProc] (`wrap`: harness.start_fleetmq's).

    The stores a test also uses (`redis_proxy`, `replicated_redis`, `redis_cluster`) are set up first, so
    they stop after the nodes: a node stopping can still store what it parks (it would wait out its
    shutdown timeout otherwise).

    Starts n fleetmq nodes sharing `redis_server` (through `redis_url`, a redis_proxy, if given): each gets its own listener/metrics ports, config file and
    log under tmp_path/node-<i>, `node_id: node-<i>` and `store: {kind: redis, url: redis_server.url}`
    (other keys of config["store"], e.g. wait_replicas, are kept; a config["store"] naming sentinels or a
    cluster is used as it is). Node numbers continue across calls.
    BrokerProc.kill()/pause()/resume()/restart() act on one node. All nodes stopped at teardown."""
    for store in ("redis_proxy", "replicated_redis", "redis_cluster"):
        if store in request.fixturenames:
            request.getfixturevalue(store)
    started: list[BrokerProc] = []

    def start(
        n: int,
        zone_overrides: dict | None = None,
        config: dict | None = None,
        *,
        extra_args=(),
        redis_url: str | None = None,
        wrap=(),
    ) -> list[BrokerProc]:
        if MOSQUITTO:
            pytest.skip("needs fleetmq broker nodes sharing Redis")
        nodes: list[BrokerProc] = []
        for _ in range(n):
            i = len(started)
            cfg = copy.deepcopy(config) if config else {}
            cfg["node_id"] = f"node-{i}"
            if not {"sentinel", "cluster"} & set(cfg.get("store", {})):  # (those name their own servers)
                url = redis_url or redis_server.url  # another address (a redis_proxy) reaches the same server
                cfg["store"] = {**cfg.get("store", {}), "kind": "redis", "url": url}
            bp = harness.start_fleetmq(
                tmp_path / f"node-{i}", cfg, zone_overrides=zone_overrides, extra_args=extra_args, wrap=wrap
            )
            started.append(bp)
            nodes.append(bp)
        return nodes

    yield start
    if redis_server.paused:
        redis_server.resume()  # so the nodes can finish their shutdown writes
    for bp in started:
        bp.stop()


@pytest.fixture
def replicated_redis(tmp_path):
    """A primary, two replicas and three sentinels (tests/support.ReplicatedRedis: redis-server and
    redis-sentinel processes on free 127.0.0.1 ports, AOF fsync always, down-after 2 s); stopped at
    teardown. `replicated_redis.store(wait_replicas=1)` is a fleet's store config for it."""
    if not redis_server_available() or not os.access(REDIS_SENTINEL_BIN, os.X_OK):
        pytest.fail(f"redis-server or {REDIS_SENTINEL_BIN} missing: run `make deps`")
    rr = ReplicatedRedis(tmp_path / "sentinel")
    yield rr
    rr.stop()


@pytest.fixture
def redis_cluster(tmp_path):
    """A Redis Cluster of 3 primaries and 3 replicas (tests/support.RedisCluster: redis-server processes
    on free 127.0.0.1 ports, created with redis-cli --cluster create, node timeout 2 s); stopped at
    teardown. `redis_cluster.store(wait_replicas=1)` is a fleet's store config for it."""
    if not redis_server_available():
        pytest.fail(f"redis-server not found at {REDIS_SERVER_BIN}: run `make deps`")
    rc = RedisCluster(tmp_path / "cluster")
    yield rc
    rc.stop()


@pytest.fixture
def service():
    """The platform's HTTP auth service (tests/integration/authservice.AuthService: answers per username,
    an ACL endpoint, records requests, can be slowed and stopped); stopped at teardown."""
    from tests.integration.authservice import AuthService

    s = AuthService()
    yield s
    s.stop()


@pytest.fixture
def redis_proxy(redis_server):
    """A RedisProxy (tests/redisproxy.py) in front of `redis_server`: nodes given its url reach Redis
    through it, and the test puts faults at chosen points. Closed at teardown."""
    from tests.redisproxy import RedisProxy

    proxy = RedisProxy(redis_server.port)
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """A real control plane for the session (tests/kubeapi.ControlPlane): etcd + kube-apiserver with RBAC,
    plus kube-controller-manager, kube-scheduler and kwok fake nodes when those were built (`make envtest`;
    `control_plane.controllers` says). Skipped when the binaries are missing, except in CI (CI=true),
    where that is a failure."""
    in_ci = os.environ.get("CI", "").lower() in ("true", "1")
    missing = kubeapi.missing_binaries(controllers=in_ci)
    if missing:
        msg = (
            f"control plane binaries missing in {kubeapi.bin_dir()}: {', '.join(missing)}; run `make envtest`"
        )
        if in_ci:
            pytest.fail(msg)
        pytest.skip(msg)
    cp = kubeapi.ControlPlane(tmp_path_factory.mktemp("kube"))
    cp.start(controllers=kubeapi.controllers_available())
    yield cp
    cp.stop()


@pytest.fixture
def kube_namespace(control_plane, request):
    """A fresh namespace (name from the test's name), deleted (without waiting) at teardown."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")
    name = f"{base[:50].strip('-')}-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
