"""Right after Redis restarts, a node's pooled connections are all dead: the first operation that finds
one drops them all, and a CONNECT (a claim may safely run twice) is retried on a fresh connection, so
clients connecting then are not refused."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fleetmq.broker.server import WATCH_INTERVAL

from tests.integration import harness, mqttraw
from tests.integration.fleet_support import raw_connect
from tests.integration.harness import BrokerProc, uid
from tests.support import RedisServer, free_port, wait_port, wait_until

pytestmark = pytest.mark.redis


def test_connects_after_a_redis_restart_are_not_refused(fleet, redis_server):
    (bp,) = fleet(1)

    def connect(_: int) -> int:
        c, ack = raw_connect(bp, uid("after"), 5, check=False)
        c.close()
        return ack.reason

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(connect, range(32))) == {0}  # the pool now holds several connections
        redis_server.kill()
        redis_server.start()
        wait_until(redis_server.ping, timeout=10, msg="redis back")
        reasons = list(pool.map(connect, range(32)))
    assert reasons == [0] * 32, reasons


@contextlib.contextmanager
def waiting_for_redis(tmp_path, node_id: str) -> Iterator[tuple[BrokerProc, RedisServer]]:
    """A node started before its Redis (not started either), once it says it waits for it; both stopped
    after."""
    rs = RedisServer(tmp_path / "redis", autostart=False)
    try:
        bp = harness.start_fleetmq(
            tmp_path / "node",
            {"node_id": node_id, "store": {"kind": "redis", "url": rs.url}},
            wait_listeners=False,
        )
        try:
            wait_until(lambda: "opening the session store failed" in bp.log(), timeout=10, msg="the log line")
            yield bp, rs
        finally:
            bp.stop()
    finally:
        rs.stop()


def test_node_started_before_its_redis_waits_for_it_alive_and_unready(tmp_path):
    """A broker pod of a new fleet may start before its Redis: it stays up (healthz 200, readyz 503, no
    listener yet) and serves as soon as Redis answers, instead of exiting into CrashLoopBackOff."""
    with waiting_for_redis(tmp_path, "early") as (bp, rs):
        assert bp.http_get("/healthz")[0] == 200
        assert bp.http_get("/readyz")[0] == 503
        time.sleep(1.5)  # a few more attempts: still alive, still waiting
        assert bp.proc.poll() is None, bp.log()
        assert bp.metric("fleetmq_store_errors_total") >= 2

        rs.start()
        wait_port(bp.host, bp.port, 15, bp.proc)
        wait_until(lambda: bp.http_get("/readyz")[0] == 200, timeout=5, msg="ready once Redis answers")
        topic = uid("early/")
        sub, ack = raw_connect(bp, uid("s-"), 5, clean=False)
        assert not ack.session_present
        sub.subscribe([(topic, 1)])
        pub, _ = raw_connect(bp, uid("p-"), 5)
        pub.publish(topic, "hello", qos=1)
        pub.expect(mqttraw.PUBACK)
        got = sub.expect(mqttraw.PUBLISH)
        assert got.payload == b"hello"


def test_a_config_changed_while_the_node_waits_for_its_redis_applies_once_it_serves(tmp_path):
    """A new fleet's broker pods wait for their Redis, and meanwhile the operator renders the config again
    (a second zone) and the kubelet brings the file. The watcher started only once the node listened and
    took the file as it found it then, so the pods ran their first config for good (CI on the real node:
    ConfigApplied 0/3 for 5 minutes, the README's `kubectl wait` timed out). Changes are now seen from the
    file as it was read."""
    with waiting_for_redis(tmp_path, "changed-early") as (bp, rs):
        second = free_port()
        harness.rewrite(bp, lambda cfg: cfg["listeners"].append(
            {"name": "second", "zone": "default", "bind": f"127.0.0.1:{second}", "protocol": "tcp"}))  # fmt: skip
        time.sleep(2 * WATCH_INTERVAL)  # (the watcher, were it running, would have seen it by now)
        rs.start()
        wait_port(bp.host, bp.port, 15, bp.proc)
        wait_port(bp.host, second, 10, bp.proc)  # the changed config applied
        c = mqttraw.RawClient(bp.host, second, version=5, timeout=5)
        assert c.connect(uid("s-")).reason == 0
        c.close()


def test_node_started_while_its_redis_is_a_replica_waits_instead_of_exiting(tmp_path):
    """A node restarting during a failover finds its store answering but read-only (the old primary,
    now a replica): joining the fleet failed, and the node exited with status 1, over and over (chaos
    --store sentinel, seed 44: 70 exits). It waits for the store like one that does not answer yet."""
    rs = RedisServer(tmp_path / "redis")
    try:
        rs.command("REPLICAOF", "127.0.0.1", "1")  # a replica of nobody: every write refused (READONLY)
        bp = harness.start_fleetmq(
            tmp_path / "node",
            {"node_id": "during-failover", "store": {"kind": "redis", "url": rs.url}},
            wait_listeners=False,
        )
        try:
            wait_until(lambda: "joining the fleet failed" in bp.log(), timeout=15, msg="the log line")
            time.sleep(1.5)
            assert bp.proc.poll() is None, bp.log()
            assert bp.http_get("/readyz")[0] == 503
            rs.command("REPLICAOF", "NO", "ONE")  # the failover ends: writable again
            wait_port(bp.host, bp.port, 15, bp.proc)
            wait_until(lambda: bp.http_get("/readyz")[0] == 200, timeout=10, msg="ready once writable")
            c, ack = raw_connect(bp, uid("s-"), 5)
            assert ack.reason == 0
            c.close()
        finally:
            bp.stop()
    finally:
        rs.stop()
