"""The Redis test harness itself (tests/support.py and the redis_server fixture); no broker needed."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.integration import mqttraw
from tests.support import LIVE_REDIS, RedisReplyError, RedisServer

pytestmark = pytest.mark.redis


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_command_and_resp_types(redis_server):
    rs = redis_server
    assert rs.alive() and rs.ping()
    assert rs.url == f"redis://127.0.0.1:{rs.port}/0"
    assert rs in LIVE_REDIS
    assert rs.command("SET", "s:{c1}", b"\x00bin\xff") == b"OK"  # a simple string, as redis-py returns it
    assert rs.command("GET", "s:{c1}") == b"\x00bin\xff"  # bulk string, bytes by default
    assert rs.command("GET", "missing") is None  # nil bulk
    assert rs.command("INCRBY", "n", 41) == 41  # integer
    assert rs.command("HSET", "h", "a", "1", "b", "2") == 2
    assert rs.hgetall("h") == {b"a": b"1", b"b": b"2"}
    assert rs.command("RPUSH", "l", "x", "y", "z") == 3
    assert rs.command("LRANGE", "l", 0, -1, decode=True) == ["x", "y", "z"]  # array
    assert rs.keys() == ["h", "l", "n", "s:{c1}"]
    assert rs.dbsize() == 4
    with pytest.raises(RedisReplyError, match="WRONGTYPE"):
        rs.command("LRANGE", "h", 0, -1)
    replies = rs.pipeline(("MULTI",), ("INCR", "n"), ("LPUSH", "h", "x"), ("EXEC",))
    assert replies[:3] == [b"OK", b"QUEUED", b"QUEUED"]
    assert replies[3][0] == 42 and isinstance(replies[3][1], RedisReplyError)
    assert rs.commandstats()["rpush"] == 1
    assert rs.info("persistence")["aof_enabled"] == "1"
    rs.flushall()
    assert rs.dbsize() == 0


def test_stop_then_start_keeps_data_same_port(redis_server):
    rs = redis_server
    port, url, old_pid = rs.port, rs.url, rs.pid
    rs.command("SET", "k", "before-stop")
    rs.command("RPUSH", "q:{c}", "m1", "m2")
    assert rs.stop() == 0
    assert not rs.alive() and not _pid_running(old_pid) and rs not in LIVE_REDIS
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    rs.start()
    assert rs.port == port and rs.url == url and rs.pid != old_pid
    assert rs.command("GET", "k") == b"before-stop"
    assert rs.command("LRANGE", "q:{c}", 0, -1) == [b"m1", b"m2"]


def test_kill9_then_start_keeps_fsynced_writes(redis_server):
    rs = redis_server
    for i in range(50):
        rs.command("RPUSH", "acked", i)
    rs.command("SET", "last", "written-just-before-kill")
    old_pid = rs.pid
    assert rs.kill() == -9
    assert not _pid_running(old_pid)
    rs.start()
    assert rs.command("LLEN", "acked") == 50
    assert rs.command("GET", "last") == b"written-just-before-kill"


def test_pause_and_resume(redis_server):
    rs = redis_server
    rs.command("SET", "k", "v")
    rs.pause()
    assert rs.alive() and rs.paused
    t0 = time.monotonic()
    with pytest.raises(OSError):  # the kernel accepts the connection, nobody answers
        rs.command("GET", "k", timeout=0.2)
    assert time.monotonic() - t0 < 2
    assert not rs.ping(timeout=0.1)
    rs.resume()
    assert not rs.paused
    assert rs.command("GET", "k") == b"v"


def test_stop_while_paused_and_no_leftover_process(tmp_path):
    rs = RedisServer(tmp_path / "r")
    pid = rs.pid
    rs.pause()
    t0 = time.monotonic()
    rs.stop()
    assert time.monotonic() - t0 < 5
    assert not _pid_running(pid) and rs not in LIVE_REDIS
    with RedisServer(tmp_path / "r", port=rs.port) as again:  # same dir and port, data kept
        assert again.dbsize() == 0
        again.command("SET", "x", 1)
        pid = again.pid
    assert not _pid_running(pid)


# ------------------------------------------------------------------ BrokerProc lifecycle and the fleet fixture
def test_broker_kill_pause_resume_restart(start_broker, raw_clients):
    from tests.integration.harness import LIVE_BROKERS

    bp = start_broker()
    ports, mport, first_pid = dict(bp.ports), bp.metrics_port, bp.pid
    bp.pause()
    c = raw_clients(bp)
    c.send(mqttraw.connect("paused"))
    assert c.recv(timeout=0.2) is None  # accepted by the kernel, no CONNACK while stopped
    bp.resume()
    assert c.expect(mqttraw.CONNACK).reason == 0
    assert bp.http_get("/healthz")[0] == 200
    assert bp.kill() == -9
    assert not bp.alive() and not _pid_running(first_pid) and bp in LIVE_BROKERS
    bp.restart()
    assert bp.alive() and bp.pid != first_pid
    assert bp.ports == ports and bp.metrics_port == mport
    assert "harness: restart" in bp.log()
    raw_clients(bp).connect("after-restart")
    second_pid = bp.pid
    bp.restart()  # a running broker is stopped first
    assert bp.alive() and bp.pid != second_pid and not _pid_running(second_pid)
    bp.pause()
    bp.stop()  # resumes a paused broker before SIGTERM, so this is quick
    assert not bp.alive() and bp not in LIVE_BROKERS


def test_fleet_nodes_share_redis(fleet, redis_server, raw_clients):
    import yaml

    try:
        nodes = fleet(2, zone_overrides={"max_inflight": 7})
    except RuntimeError as e:
        if "redis store is not available" in str(e):
            pytest.skip("the broker has no redis store yet")
        raise
    assert len({n.port for n in nodes}) == 2 and len({n.metrics_port for n in nodes}) == 2
    for i, n in enumerate(nodes):
        cfg = yaml.safe_load(n.config_path.read_text())
        assert cfg["node_id"] == f"node-{i}"
        assert cfg["store"] == {"kind": "redis", "url": redis_server.url}
        assert cfg["zones"]["default"]["max_inflight"] == 7
        raw_clients(n).connect(f"fleet-{i}")
