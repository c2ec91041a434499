"""The managed Redis' start script (operator/redis.sh) run for real, without Kubernetes: each "pod" is a
process on loopback started by the script with the environment its container gets, the password in a
file, the machine's redis-server and redis-cli.

Sentinel: three servers and three sentinels form a primary with two replicas; the primary killed, the
sentinels promote a replica and the old primary, started again through the script, rejoins as a replica
of the new one; a sentinel started afresh finds the current primary; a stopping primary hands over first
(prestop); a broker's StoreConnections reaches it all through the config the operator renders. Sentinels
whose view is stale (the one that led a failover replaced before they heard of it: they name the old
primary, a replica now or down) mislead no starting sentinel or server: each follows the promoted one.
Cluster: six servers, the create step forms 3 shards with a replica each, a second run does nothing, a
killed primary's replica takes over and the restarted node rejoins from its nodes.conf.

FLEETMQ_REDIS_SH_PATH=DIR runs the script with the sh, sed, grep, timeout... found in DIR (say, busybox's
applets linked there beside redis-server and redis-cli: what redis:7-alpine has) instead of /usr/bin:/bin.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import redis
from fleetmq.broker.config import RedisStoreConfig
from fleetmq.broker.store.connections import StoreConnections

from tests.support import HOST, RedisServer, free_port, wait_until

from .support import PASSWORD, ScriptedRedis, free_cluster_port, run_script

pytestmark = pytest.mark.redis

MASTER = "edge"


def role(server: RedisServer) -> list:
    return server.command("ROLE", decode=True)


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "auth" / "password"
    path.parent.mkdir()
    path.write_text(PASSWORD)
    return path


# ------------------------------------------------------------------------------------------- sentinel
class SentinelDeployment:
    """What the sentinel mode's two StatefulSets run: 3 Redis servers and 3 sentinels.

    `down_after_ms` is at least 2 s (the operator's default is 5 s): at 1 s, in 1 of 5 runs, every
    sentinel judged the replica it had just promoted down a second after switching to it, and failed
    it over again to the other replica."""

    def __init__(
        self, base: Path, password_file: Path, servers: int = 3, sentinels: int = 3, down_after_ms: int = 2000
    ):
        self.base = base
        self.server_ports = [free_port() for _ in range(servers)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.common = {
            "REDIS_PASSWORD_FILE": str(password_file),
            "REDIS_MODE": "sentinel",
            "REDIS_BIND": HOST,
            "REDIS_NODES": " ".join(f"{HOST}:{p}" for p in self.server_ports),
            "SENTINEL_NODES": " ".join(f"{HOST}:{p}" for p in self.sentinel_ports),
            "SENTINEL_MASTER": MASTER,
            "SENTINEL_DOWN_AFTER_MS": str(down_after_ms),
            "SENTINEL_FAILOVER_TIMEOUT_MS": "6000",
        }
        self.servers = [
            ScriptedRedis(base / f"redis-{i}", port, "server", self.server_env(i))
            for i, port in enumerate(self.server_ports)
        ]
        self.sentinels = [
            ScriptedRedis(base / f"sentinel-{i}", port, "sentinel", self.sentinel_env(i))
            for i, port in enumerate(self.sentinel_ports)
        ]

    def server_env(self, i: int) -> dict[str, str]:
        port = self.server_ports[i]
        return {
            **self.common,
            "REDIS_SELF": f"{HOST}:{port}",
            "REDIS_PORT": str(port),
            "REDIS_DATA_DIR": str(self.base / f"redis-{i}"),  # the PersistentVolumeClaim
            "REDIS_CONF_DIR": str(self.base / f"conf-redis-{i}"),  # the pod's emptyDir
        }

    def sentinel_env(self, i: int) -> dict[str, str]:
        port = self.sentinel_ports[i]
        return {
            **self.common,
            "SENTINEL_SELF": f"{HOST}:{port}",
            "SENTINEL_PORT": str(port),
            "REDIS_CONF_DIR": str(self.base / f"conf-sentinel-{i}"),
        }

    def named_primary(self, sentinel: RedisServer) -> str | None:
        reply = sentinel.command("SENTINEL", "get-master-addr-by-name", MASTER, decode=True)
        return f"{reply[0]}:{reply[1]}" if reply else None

    def master_fields(self, sentinel: RedisServer) -> dict[str, str]:
        info = sentinel.command("SENTINEL", "master", MASTER, decode=True)
        return dict(zip(info[::2], info[1::2], strict=True))

    def replace_sentinel(self, i: int) -> ScriptedRedis:
        """Sentinel i's pod replaced: killed, its config (the pod's emptyDir) gone; not started again yet."""
        sentinel = self.sentinels[i]
        sentinel.kill()
        for f in Path(sentinel.environment["REDIS_CONF_DIR"]).glob("*"):
            f.unlink()
        return sentinel

    def primaries(self) -> set[str | None]:
        return {self.named_primary(s) for s in self.sentinels if s.alive()}

    def server_at(self, address: str) -> ScriptedRedis:
        return next(s for s in self.servers if s.address == address)

    def probe(self, command: str, server: ScriptedRedis) -> int:
        return run_script(command, server.environment, timeout=30).returncode

    def stop(self) -> None:
        for p in [*self.sentinels, *self.servers]:
            p.stop()


@pytest.fixture
def sentinel_deployment(tmp_path, password_file):
    d = SentinelDeployment(tmp_path, password_file)
    try:
        yield d
    finally:
        d.stop()


def test_sentinel_bootstrap_failover_and_rejoin(sentinel_deployment, tmp_path, password_file):
    d = sentinel_deployment
    # the pods start in any order (Parallel): replicas first, then pod 0, then the sentinels
    for server in reversed(d.servers):
        server.start()
    for sentinel in d.sentinels:
        sentinel.start()
    first, *replicas = d.servers
    wait_until(lambda: role(first)[0] == "master" and len(role(first)[2]) == 2, timeout=20, msg="2 replicas")
    for r in replicas:
        assert role(r)[:2] == ["slave", HOST] and role(r)[2] == first.port
    wait_until(lambda: d.primaries() == {first.address}, timeout=20, msg="sentinels name pod 0")

    def knows_all(s: RedisServer) -> bool:
        info = s.command("SENTINEL", "master", MASTER, decode=True)
        fields = dict(zip(info[::2], info[1::2], strict=True))
        return fields["num-slaves"] == "2" and fields["num-other-sentinels"] == "2"

    wait_until(lambda: all(knows_all(s) for s in d.sentinels), timeout=30, msg="sentinels see everyone")
    for server in d.servers:
        wait_until(lambda s=server: d.probe("ready", s) == 0, timeout=20, msg=f"{server.address} ready")
        assert d.probe("live", server) == 0
    for sentinel in d.sentinels:
        assert d.probe("sentinel-ready", sentinel) == 0 and d.probe("sentinel-live", sentinel) == 0

    # the password is required by servers and sentinels alike, and is in no config a probe could leak
    for p in [first, d.sentinels[0]]:
        with redis.Redis(host=HOST, port=p.port) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    for conf in tmp_path.glob("conf-*/*.conf"):
        assert conf.stat().st_mode & 0o077 == 0, f"{conf} is readable by others"

    first.command("SET", "fmq:{c}:m", "kept")
    assert first.command("WAIT", "2", "5000") == 2

    # the primary dies: the sentinels promote a replica; pod 0, started again, follows the new primary
    first.kill()
    (promoted, *_) = wait_until(lambda: d.primaries() - {first.address, None}, timeout=30, msg="a failover")
    new = d.server_at(promoted)  # (the other sentinels may name pod 0 for a moment longer)
    assert new is not first and role(new)[0] == "master"
    first.start()
    assert role(first)[0] == "slave" and role(first)[2] == new.port, role(first)
    wait_until(lambda: first.command("GET", "fmq:{c}:m") == b"kept", timeout=20, msg="pod 0 in sync")
    assert "replica of" in first.log() and f"{HOST}:{new.port}" in first.log()
    wait_until(lambda: d.probe("ready", first) == 0, timeout=20, msg="pod 0 ready again")

    # a sentinel starting afresh (its pod replaced) asks the others: it watches the new primary, not pod 0
    d.sentinels[0].kill()
    for f in Path(d.sentinels[0].environment["REDIS_CONF_DIR"]).glob("*"):
        f.unlink()
    d.sentinels[0].start()
    assert d.named_primary(d.sentinels[0]) == new.address
    wait_until(lambda: d.probe("sentinel-ready", d.sentinels[0]) == 0, timeout=20, msg="sentinel ready")

    # a broker reaches the primary through the sentinels with the password files of the rendered config
    cfg = RedisStoreConfig(
        kind="redis",
        sentinel={
            "nodes": [s.address for s in d.sentinels],
            "master": MASTER,
            "password_file": str(password_file),
        },
        password_file=str(password_file),
        wait_replicas=1,
    )

    async def through_the_broker_client() -> tuple[bytes, list[str]]:
        conns = StoreConnections(cfg, "test")
        try:
            value = await conns.redis.get("fmq:{c}:m")
            return value, conns.primaries()
        finally:
            await conns.close()

    assert asyncio.run(through_the_broker_client()) == (b"kept", [new.address])

    # a primary being stopped (preStop) asks the sentinels to promote a replica before it goes
    wait_until(lambda: all(d.probe("ready", s) == 0 for s in d.servers), timeout=30, msg="all in sync")
    out = run_script("prestop", new.environment)
    assert out.returncode == 0, out.stderr
    assert role(new)[0] == "slave", out.stderr
    wait_until(lambda: d.primaries() - {new.address, None}, timeout=20, msg="the planned failover")
    assert (
        d.probe("prestop", d.servers[1] if new is not d.servers[1] else d.servers[2]) == 0
    )  # replicas: no-op


def test_a_stopping_primary_hands_over_without_losing_an_acknowledged_write(sentinel_deployment):
    """A writer sends to the primary and counts a write acknowledged when WAIT 1 says a replica has it (what
    a broker with waitReplicas 1 does) while the primary's preStop hands over. Every acknowledged write must
    be on the new primary: found when a replica was promoted while the old primary still took writes that
    the other replica acknowledged (the real node's e2e lost one acked message that way)."""
    d = sentinel_deployment
    for server in d.servers:
        server.start()
    for sentinel in d.sentinels:
        sentinel.start()
    first = d.servers[0]
    wait_until(lambda: role(first)[0] == "master" and len(role(first)[2]) == 2, timeout=20, msg="2 replicas")
    wait_until(lambda: d.primaries() == {first.address}, timeout=20, msg="sentinels name pod 0")
    acked: list[int] = []
    stop = threading.Event()

    def write() -> None:
        with redis.Redis(host=HOST, port=first.port, password=PASSWORD, socket_timeout=10) as r:
            n = 0
            while not stop.is_set():
                try:
                    r.rpush("acked", n)
                    if r.execute_command("WAIT", 1, 1000) >= 1:
                        acked.append(n)
                except redis.RedisError:  # READONLY once it is a replica: nothing more lands here
                    return
                n += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_until(lambda: len(acked) > 200, timeout=10, msg="writes flowing")
    out = run_script("prestop", first.environment, timeout=60)
    assert out.returncode == 0, out.stderr
    stop.set()
    writer.join(15)
    new = d.server_at(d.named_primary(d.sentinels[0]))
    assert new is not first and role(first)[0] == "slave", out.stderr
    wait_until(lambda: all(role(r)[0] == "master" or r.info("replication").get("master_link_status") == "up"
                           for r in d.servers), timeout=20, msg="every replica linked")  # fmt: skip
    stored = {int(v) for v in new.command("LRANGE", "acked", 0, -1, decode=True)}
    lost = [n for n in acked if n not in stored]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged writes lost in the handover: {lost[:10]}"


def linked_to(replica: RedisServer, primary: RedisServer) -> bool:
    try:
        r = role(replica)
    except OSError:  # a sentinel moving a server ends its clients' connections (CLIENT KILL TYPE normal)
        return False
    return r[0] == "slave" and r[2] == primary.port and r[3] == "connected"


def stale_sentinel_views(d: SentinelDeployment) -> tuple[ScriptedRedis, ScriptedRedis, ScriptedRedis]:
    """The race behind a flaky run, made deterministic: the sentinel that led a failover is replaced before
    its hello reached the others, so they still name the old primary, now a replica of the promoted one.
    Every sentinel first learns of one failover (configuration epoch 1, later than a new sentinel's 0), then
    sentinel 0 is replaced and the next failover is done by hand, as its leader would have. The deployment's
    down-after is long enough that the sentinels left do nothing about it while a test runs. Returns the old
    primary they name, the promoted one (no sentinel knows it is the primary) and the third server."""
    for server in d.servers:
        server.start()
    for sentinel in d.sentinels:
        sentinel.start()

    def knows_all(s: RedisServer) -> bool:
        fields = d.master_fields(s)
        return fields["num-slaves"] == "2" and fields["num-other-sentinels"] == "2"

    wait_until(lambda: all(knows_all(s) for s in d.sentinels), timeout=30, msg="sentinels see everyone")
    assert d.sentinels[0].command("SENTINEL", "FAILOVER", MASTER) == b"OK"

    def failed_over() -> bool:
        (named, *more) = d.primaries()
        return (
            not more
            and named != d.servers[0].address
            and all(d.master_fields(s)["config-epoch"] == "1" for s in d.sentinels)
            and all(d.master_fields(s)["flags"] == "master" for s in d.sentinels)  # the failover ended
        )

    wait_until(failed_over, timeout=30, msg="every sentinel knows the first failover")
    stale = d.server_at(d.named_primary(d.sentinels[1]))
    promoted, third = (s for s in d.servers if s is not stale)
    wait_until(lambda: linked_to(promoted, stale) and linked_to(third, stale), timeout=20, msg="linked")

    d.replace_sentinel(0)

    def fail_over() -> bool:
        try:
            promoted.command("REPLICAOF", "NO", "ONE")
            for replica in (stale, third):
                replica.command("REPLICAOF", HOST, str(promoted.port))
        except OSError:  # (as in linked_to)
            return False
        return True

    wait_until(fail_over, timeout=10, msg="a failover by hand")
    # the sentinels left go by what each server said at their last INFO (every 10 s): until they hear the old
    # primary say it is a replica they may move a server back to it (+convert-to-slave, +fix-slave-config);
    # after, a primary that says it is a replica is no primary they force their view of, so no sentinel does
    wait_until(lambda: all(d.master_fields(s)["role-reported"] == "slave" for s in d.sentinels[1:]), timeout=30,
               msg="the sentinels left hear the old primary is a replica")  # fmt: skip
    wait_until(fail_over, timeout=10, msg="a failover by hand")  # again, in case one of them did
    wait_until(lambda: linked_to(stale, promoted) and linked_to(third, promoted), timeout=20, msg="relinked")
    for s in d.sentinels[1:]:  # what a fresh server or sentinel finds: a view naming a replica
        assert d.named_primary(s) == stale.address and d.master_fields(s)["config-epoch"] == "1"
    return stale, promoted, third


@pytest.fixture
def stale_deployment(tmp_path, password_file):
    d = SentinelDeployment(tmp_path, password_file, down_after_ms=120_000)
    try:
        yield d
    finally:
        d.stop()


def test_a_fresh_sentinel_follows_the_primary_not_a_stale_view(stale_deployment):
    """The sentinels left name the old primary (a replica now, then down): a sentinel started afresh
    watches the promoted one, and their hellos (an epoch as late as its own) do not move it back."""
    d = stale_deployment
    stale, promoted, _ = stale_sentinel_views(d)
    fresh = d.sentinels[0]
    fresh.start()
    assert d.named_primary(fresh) == promoted.address, fresh.log()
    # once it has heard a hello from each of the others (that is how it knows them) it still does
    wait_until(lambda: d.master_fields(fresh)["num-other-sentinels"] == "2", timeout=20, msg="hellos heard")
    assert d.named_primary(fresh) == promoted.address, fresh.log()
    assert d.master_fields(fresh)["config-epoch"] == "1"
    wait_until(lambda: d.probe("sentinel-ready", fresh) == 0, timeout=20, msg="sentinel ready")

    # the old primary down: the same
    stale.kill()
    d.replace_sentinel(0)
    fresh.start()
    assert d.named_primary(fresh) == promoted.address, fresh.log()
    wait_until(lambda: d.master_fields(fresh)["num-other-sentinels"] == "2", timeout=20, msg="hellos heard")
    assert d.named_primary(fresh) == promoted.address, fresh.log()


def test_a_starting_server_follows_the_primary_not_a_stale_view(stale_deployment):
    """The sentinels name the old primary, a replica now: restarting, it does not become a second primary,
    and a restarting replica does not replicate it; with no master anywhere (a failover to come) a starting
    server looks again until one is."""
    d = stale_deployment
    stale, promoted, third = stale_sentinel_views(d)
    promoted.command("SET", "fmq:{c}:m", "after")
    assert promoted.command("WAIT", "2", "5000") == 2

    stale.kill()
    stale.start()
    assert role(stale)[0] == "slave" and role(stale)[2] == promoted.port, stale.log()
    assert "following" in stale.log() and promoted.address in stale.log()
    wait_until(lambda: stale.command("GET", "fmq:{c}:m") == b"after", timeout=20, msg="old primary in sync")

    third.kill()
    third.start()
    assert role(third)[0] == "slave" and role(third)[2] == promoted.port, third.log()

    # no master: the one the sentinels name is down and the promoted one is (for now) a replica
    stale.kill()
    promoted.command("REPLICAOF", HOST, str(stale.port))
    third.kill()
    failed: list[Exception] = []

    def start() -> None:
        try:
            third.start(timeout=30)
        except Exception as e:  # reported below
            failed.append(e)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    wait_until(lambda: "looking again" in third.log() or not starting.is_alive(), timeout=20, msg="a look")
    assert "looking again" in third.log(), third.log()
    promoted.command("REPLICAOF", "NO", "ONE")
    starting.join(30)
    assert not starting.is_alive() and not failed, failed
    assert role(third)[0] == "slave" and role(third)[2] == promoted.port, third.log()
    wait_until(lambda: third.command("GET", "fmq:{c}:m") == b"after", timeout=20, msg="third in sync")


# ------------------------------------------------------------------------------------------- cluster
def test_cluster_create_once_failover_and_rejoin(tmp_path, password_file):
    ports = [free_cluster_port() for _ in range(6)]
    nodes = " ".join(f"{HOST}:{p}" for p in ports)
    common = {
        "REDIS_PASSWORD_FILE": str(password_file),
        "REDIS_MODE": "cluster",
        "REDIS_BIND": HOST,
        "REDIS_NODES": nodes,
        "CLUSTER_NODE_TIMEOUT_MS": "1000",
        "CLUSTER_REPLICAS": "1",
    }
    servers = [
        ScriptedRedis(
            tmp_path / f"redis-{i}",
            port,
            "server",
            {
                **common,
                "REDIS_SELF": f"{HOST}:{port}",
                "REDIS_PORT": str(port),
                "REDIS_CONF_DIR": str(tmp_path / f"conf-{i}"),
                "REDIS_DATA_DIR": str(tmp_path / f"redis-{i}"),
            },
        )
        for i, port in enumerate(ports)
    ]
    try:
        for s in servers:
            s.start()
        assert all(run_script("ready", s.environment).returncode == 1 for s in servers)  # not formed yet
        out = run_script("cluster-create", common, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        for s in servers:
            assert "cluster_state:ok" in s.command("CLUSTER", "INFO", decode=True)
            assert run_script("ready", s.environment).returncode == 0
        roles = [role(s)[0] for s in servers]
        assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
        again = run_script("cluster-create", common)
        assert again.returncode == 0 and "the cluster is formed" in again.stderr, again.stderr

        from redis.cluster import ClusterNode, RedisCluster

        client = RedisCluster(
            startup_nodes=[ClusterNode(HOST, p) for p in ports], password=PASSWORD, decode_responses=True
        )
        try:
            for i in range(30):
                client.set(f"fmq:{{client-{i}}}:m", str(i))
            primary = next(s for s in servers if role(s)[0] == "master" and s.dbsize() > 0)
            replica_of_it = next(s for s in servers if role(s)[0] == "slave" and role(s)[2] == primary.port)
            # (a replica's first sync can outlast one WAIT on a loaded machine, and a 5 s WAIT raced the
            # client's own 5 s socket timeout in a full make test: ask in shorter rounds)
            wait_until(lambda: primary.command("WAIT", "1", "1000") == 1, timeout=30,
                       msg="a replica acknowledged the writes")  # fmt: skip

            primary.kill()
            wait_until(lambda: role(replica_of_it)[0] == "master", timeout=30, msg="the replica takes over")
            primary.start()  # from its nodes.conf: it rejoins, as a replica of the node that replaced it
            wait_until(lambda: role(primary)[0] == "slave" and role(primary)[2] == replica_of_it.port,
                       timeout=30, msg="the old primary rejoins as a replica")  # fmt: skip
            wait_until(lambda: run_script("ready", primary.environment).returncode == 0, timeout=30,
                       msg="rejoined node ready")  # fmt: skip
            assert [client.get(f"fmq:{{client-{i}}}:m") for i in range(30)] == [str(i) for i in range(30)]
        finally:
            client.close()

        # every pod comes back at once, each with a new address (its DNS name, here its REDIS_NODES entry,
        # follows; nodes.conf still has the old ones): the readiness probes introduce the nodes again
        for s in servers:
            s.stop()
        moved = [f"127.0.0.{10 + i}:{p}" for i, p in enumerate(ports)]
        for s, address in zip(servers, moved, strict=True):
            ip = address.rpartition(":")[0]
            s.environment |= {
                "REDIS_NODES": " ".join(moved),
                "REDIS_SELF": address,
                "REDIS_BIND": ip,
                "REDIS_LOCAL": ip,
            }
            s.start()

        def probes_pass() -> bool:  # what the kubelet does every few seconds
            return all(run_script("ready", s.environment).returncode == 0 for s in servers)

        wait_until(probes_pass, timeout=60, interval=1, msg="the cluster whole again at the new addresses")
    finally:
        for s in servers:
            s.stop()
