"""HTTP authentication on a real broker process, against an auth service the test runs, slows and stops."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from .authservice import AuthService
from .harness import MOSQUITTO, passwd, uid
from .mqttraw import PUBACK, RawClient

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")

V311, V5 = 4, 5


def http_zone(service: AuthService, tmp_path, **extra: object) -> dict[str, object]:
    key = tmp_path / "api-key"
    key.write_text("k-123\n")
    users = tmp_path / "users"
    passwd(users, "bob", "builder")
    return {
        "users_file": str(users),
        "acl_default": "deny",
        "acl": [{"permission": "allow", "action": "all", "filter": "bob/#"}],
        "authentication": [{"mechanism": "http", "url": service.url, "header_files": {"X-Api-Key": str(key)},
                            "timeout": "1s", **extra}],
    }  # fmt: skip


@pytest.mark.parametrize("version", [V311, V5])
def test_allow_deny_and_ignore_then_the_users_file(start_broker, raw_clients, service, tmp_path, version):
    bp = start_broker(zone_overrides=http_zone(service, tmp_path))
    bad, denied = (0x86, 0x87) if version == V5 else (4, 0x80)
    alice = raw_clients(bp, version)
    cid = uid("a")
    alice.connect(cid, username="alice", password=b"anything the service accepts")
    assert service.requests[-1] == {"clientid": cid, "username": "alice", "password": "anything the service accepts",
                                    "peerhost": "127.0.0.1", "api_key": "k-123"}  # fmt: skip
    assert alice.subscribe([("alice/x", 1), ("carol/x", 1)]).codes == [
        1,
        denied,
    ]  # (its rules, then the zone's)
    root = raw_clients(bp, version)
    root.connect(uid("r"), username="root", password=b"x")
    assert root.subscribe([("anything/at/all", 0)]).codes == [0]
    assert (
        raw_clients(bp, version).connect(uid("m"), check=False, username="mallory", password=b"x").reason
        == bad
    )
    # the service ignores bob: the users file decides
    raw_clients(bp, version).connect(uid("b"), username="bob", password=b"builder")
    assert (
        raw_clients(bp, version).connect(uid("b"), check=False, username="bob", password=b"nope").reason
        == bad
    )
    for result, n in (("allow", 2), ("deny", 1)):
        assert bp.metric("fleetmq_authentications_total", mechanism="http", result=result) == n


def test_a_stopped_or_slow_service_refuses_in_time_and_other_zones_go_on(start_broker, service, tmp_path):
    bp = start_broker({
        "listeners": [{"name": "http", "bind": "127.0.0.1:0", "zone": "default"},
                      {"name": "open", "bind": "127.0.0.1:0", "zone": "open"}],
        "zones": {"default": http_zone(service, tmp_path), "open": {}},
    })  # fmt: skip
    service.delay = 3.0  # slower than the 1 s timeout
    results: list[tuple[int, float]] = []

    def connect(n: int) -> None:
        with RawClient(bp.host, bp.ports["http"], version=V5, timeout=10) as c:
            t0 = time.monotonic()
            ack = c.connect(uid("s"), check=False, timeout=10, username="alice", password=b"x")
            results.append((ack.reason, time.monotonic() - t0))

    slow = [threading.Thread(target=connect, args=(i,)) for i in range(5)]
    for t in slow:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    with RawClient(bp.host, bp.ports["open"], version=V5) as other:
        other.connect(uid("o"))
        other.publish("t", b"x", qos=1, packet_id=1)
        other.expect(PUBACK)
    assert time.monotonic() - t0 < 1.0, "a zone without the service waited for it"
    for t in slow:
        t.join(15)
    assert [r for r, _ in results] == [0x88] * 5 and max(s for _, s in results) < 2.5, results

    service.stop()  # gone: refused at once
    port = service.port
    for _ in range(3):
        with RawClient(bp.host, bp.ports["http"], version=V5) as c:
            t0 = time.monotonic()
            assert c.connect(uid("s"), check=False, username="alice", password=b"x").reason == 0x88
            assert time.monotonic() - t0 < 2.0
    assert bp.metric("fleetmq_authentications_total", mechanism="http", result="unavailable") == 8
    # (nothing listens on the port now: not a hang, a refusal)
    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))


def test_a_cached_answer_serves_a_thousand_reconnects_with_two_requests_at_most(
    start_broker, service, tmp_path
):
    bp = start_broker(zone_overrides=http_zone(service, tmp_path, cache_ttl="30s"))
    cid = uid("loop")
    for _ in range(1000):
        with RawClient(bp.host, bp.port, version=V5) as c:
            c.connect(cid, username="alice", password=b"same-password")
            c.disconnect()
    assert len(service.requests) <= 2, len(service.requests)
    with RawClient(bp.host, bp.port, version=V5) as c:  # other credentials are asked for again
        c.connect(cid, username="alice", password=b"another-password")
    assert len(service.requests) <= 3
