"""Issue 28: connections per user, counted over the whole fleet (max_connections_per_user, an MqttUser's
max_connections). Broker processes on one redis-server; the count lives in Redis, so a user's clients
spread over nodes count together, a reconnect or a takeover does not count twice, and the connections of a
node that died (or restarted under the same name) stop counting once its heartbeat lapses."""

from __future__ import annotations

import pytest

from tests.integration.fleet_support import sha
from tests.integration.harness import MOSQUITTO, BrokerProc, uid
from tests.integration.mqttraw import RawClient
from tests.support import wait_until

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")

REFUSED = {5: 0x97, 4: 3}  # quota exceeded; MQTT 3.1.1 has no such code: server unavailable


@pytest.fixture
def connect():
    made: list[RawClient] = []

    def make(bp: BrokerProc, cid: str, username: str | None, version: int = 5) -> tuple[RawClient, int]:
        c = RawClient(bp.host, bp.port, version=version, timeout=5.0)
        made.append(c)
        return c, c.connect(cid, check=False, username=username).reason

    yield make
    for c in made:
        c.close()


@pytest.mark.parametrize("version", [5, 4])
def test_a_users_connections_count_over_the_fleet_and_a_freed_one_is_given_back(fleet, connect, version):
    a, b = fleet(2, zone_overrides={"max_connections_per_user": 2})
    user = uid("dev")
    _, rc = connect(a, uid("c1"), user, version)
    assert rc == 0
    two, rc = connect(b, uid("c2"), user, version)
    assert rc == 0
    for node in (a, b):  # a third, on either node: the user has its two in the fleet
        _, rc = connect(node, uid("c3"), user, version)
        assert rc == REFUSED[version]
    assert a.metric("fleetmq_quota_refusals_total", quota="connections") == 1
    assert b.metric("fleetmq_quota_refusals_total", quota="connections") == 1
    _, rc = connect(a, uid("other"), uid("someone"), version)
    assert rc == 0, "another user has quotas of its own"
    _, rc = connect(a, uid("anon"), None, version)
    assert rc == 0, "a client without a username is not counted"
    two.close()

    def third_connects() -> bool:
        return connect(a, uid("c3"), user, version)[1] == 0

    wait_until(third_connects, timeout=5, interval=0.3, msg="the closed connection is given back")


def test_a_reconnect_and_a_takeover_elsewhere_do_not_count_twice(fleet, connect):
    a, b = fleet(2, zone_overrides={"max_connections_per_user": 1})
    user, cid = uid("dev"), uid("same")
    _, rc = connect(a, cid, user)
    assert rc == 0
    _, rc = connect(a, cid, user)
    assert rc == 0, "a takeover on the same node"
    _, rc = connect(b, cid, user)
    assert rc == 0, "a takeover from another node"
    _, rc = connect(a, uid("second"), user)
    assert rc == 0x97, "the taken-over connections were not counted as well"


def test_an_mqttusers_quota_replaces_the_zones(fleet, connect):
    [a] = fleet(1, zone_overrides={"max_connections_per_user": 3,
                                   "user_quotas": {"sensor": {"max_connections": 1}}})  # fmt: skip
    assert connect(a, uid("s1"), "sensor")[1] == 0
    assert connect(a, uid("s2"), "sensor")[1] == 0x97
    for i in range(3):
        assert connect(a, uid(f"o{i}"), "operator")[1] == 0
    assert connect(a, uid("o4"), "operator")[1] == 0x97


def test_a_dead_nodes_connections_stop_counting_and_a_restart_inherits_none(fleet, connect):
    """kill -9 leaves the dead node's entries in Redis: they stop counting once its heartbeat lapses (5 s).
    A node restarted under the same name is another run of it: its earlier run's entries do not count."""
    a, b = fleet(2, zone_overrides={"max_connections_per_user": 2})
    user = uid("dev")
    assert connect(a, uid("a1"), user)[1] == 0
    assert connect(a, uid("a2"), user)[1] == 0
    assert connect(b, uid("b1"), user)[1] == 0x97
    a.kill()
    wait_until(lambda: connect(b, uid("b1"), user)[1] == 0, timeout=15, interval=0.5, msg="a's lapse")
    assert connect(b, uid("b2"), user)[1] == 0
    assert connect(b, uid("b3"), user)[1] == 0x97

    c, d = fleet(2, zone_overrides={"max_connections_per_user": 1})
    other = uid("dev")
    assert connect(c, uid("c1"), other)[1] == 0
    c.kill()
    c.restart()  # at once: its heartbeat key never lapsed, but it names the new run
    wait_until(lambda: connect(d, uid("d1"), other)[1] == 0, timeout=5, interval=0.3, msg="a new run")


def test_a_count_whose_reply_was_lost_is_neither_doubled_nor_lost(fleet, redis_proxy, connect):
    """Redis ran the count, its reply never came: sent again, it finds the client's own entry (one
    connection, not two); a give-back whose reply was lost is sent again too."""
    [a] = fleet(1, redis_url=redis_proxy.url, zone_overrides={"max_connections_per_user": 1})
    [b] = fleet(1, zone_overrides={"max_connections_per_user": 1})
    user = uid("dev")
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("conntake"))
    one, rc = connect(a, uid("one"), user)
    assert lost.wait(5), "the count never went through the proxy"
    assert rc == 0
    assert connect(b, uid("two"), user)[1] == 0x97, "counted once, still held"
    lost = redis_proxy.lose_reply(b"EVALSHA", sha("connfree"))
    one.close()
    assert lost.wait(5), "the give-back never went through the proxy"
    wait_until(
        lambda: connect(b, uid("two"), user)[1] == 0, timeout=10, interval=0.3, msg="given back in the end"
    )
