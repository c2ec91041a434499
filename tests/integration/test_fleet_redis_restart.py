"""Right after Redis restarts, a node's pooled connections are all dead: the first operation that finds
one drops them all, and a CONNECT (a claim may safely run twice) is retried on a fresh connection, so
clients connecting then are not refused."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.harness import uid
from tests.integration.test_fleet_support import raw_connect
from tests.support import wait_until

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
