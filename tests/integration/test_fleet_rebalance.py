"""A rebalance order (broker/rebalance.py), as the operator writes it after a scale-up: the node tells that
many of its clients to use another server, paced, once, and reports how far it got."""

from __future__ import annotations

import threading
import time

from broker.rebalance import Order, Progress
from broker.store import keys
from tests.integration import mqttraw
from tests.integration.fleet_support import raw_connect
from tests.integration.harness import uid
from tests.support import wait_until


def _progress(redis_server, node: str) -> Progress | None:
    raw = redis_server.command("HGET", keys.nodeinfo(node), "rebalance")
    return Progress.parse(raw) if raw else None


def _order(redis_server, node: str, order: Order) -> None:
    redis_server.command("SET", keys.rebalance(node), order.encode(), "PX", 60_000)


def test_a_rebalance_order_moves_that_many_clients_paced_and_once(fleet, redis_server):
    """40 clients on node a (30 MQTT 5, 10 MQTT 3.1.1); an order to move 20 at 10/s: 20 are let go over
    about two seconds (v5: DISCONNECT 0x9C Use another server; v3: closed), no more while the order stays
    (it is read again with every heartbeat), and each finds its session on node b. A second order, with
    a new id, moves its own count; one past its time, or malformed, moves nobody."""
    a, b = fleet(2)
    cids = [(uid("rb5-"), 5) for _ in range(30)] + [(uid("rb3-"), 4) for _ in range(10)]
    clients = {cid: raw_connect(a, cid, v)[0] for cid, v in cids}
    closed: dict[str, tuple[float, list[int]]] = {}
    lock = threading.Lock()

    def watch(cid: str) -> None:
        try:
            ok, seen = clients[cid].wait_closed(25)
        except (OSError, ValueError):  # closed here, at the end
            return
        if ok:
            with lock:
                closed[cid] = (time.monotonic(), [p.reason for p in seen if p.type == mqttraw.DISCONNECT])

    threads = [threading.Thread(target=watch, args=(cid,), daemon=True) for cid, _ in cids]
    for t in threads:
        t.start()

    _order(redis_server, "node-0", Order("one", count=20, rate=10, until=time.time() + 30))
    wait_until(lambda: len(closed) >= 20, timeout=10, msg="20 clients let go")
    wait_until(lambda: (p := _progress(redis_server, "node-0")) is not None and p.done, timeout=5)
    assert _progress(redis_server, "node-0") == Progress("one", 20, 20, True)
    time.sleep(2.5)  # two more heartbeats read the same order
    assert len(closed) == 20, f"{len(closed)} let go for an order of 20"
    times = sorted(t for t, _ in closed.values())
    assert times[-1] - times[0] >= 19 / 10 * 0.8, f"not paced: {times[-1] - times[0]:.2f}s"
    version = dict(cids)
    for cid, (_, reasons) in closed.items():
        assert reasons == ([0x9C] if version[cid] == 5 else []), (cid, reasons)
        clients[cid].close()
        again, ack = raw_connect(b, cid, version[cid])
        assert ack.session_present, f"{cid}: its session did not move to node b"
        again.close()

    _order(redis_server, "node-0", Order("expired", count=5, rate=10, until=time.time() - 1))
    redis_server.command("SET", keys.rebalance("node-0"), b"{not json", "PX", 60_000)
    time.sleep(2.5)
    assert len(closed) == 20 and _progress(redis_server, "node-0").id == "one"
    assert "not a rebalance order" in a.log()

    _order(redis_server, "node-0", Order("two", count=5, rate=10, until=time.time() + 30))
    wait_until(lambda: len(closed) >= 25, timeout=10, msg="5 more let go")
    time.sleep(2.5)
    assert len(closed) == 25
    assert _progress(redis_server, "node-0") == Progress("two", 5, 5, True)
    for cid in set(clients) - set(closed):  # the others were left alone (their watchers saw nothing)
        clients[cid].close()
