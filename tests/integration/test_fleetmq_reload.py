"""Live zone changes: the broker watches its config file (and reloads on SIGHUP); no reconnect needed."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support import free_port, wait_until

from .harness import MOSQUITTO, rewrite, uid
from .mqttraw import DISCONNECT, PUBACK, PUBLISH, RawClient

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")


def config_hash(bp) -> str:
    return json.loads(bp.http_get("/readyz")[1])["config_hash"]


def test_max_inflight_and_acl_change_live(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_inflight": 2})
    before = config_hash(bp)
    topic = uid("live/")
    sub = raw_clients(bp, 4)
    sub.connect(uid("s"))
    sub.subscribe([(topic, 1)])
    pub = raw_clients(bp, 5)
    pub.connect(uid("p"))
    for i in range(6):
        pub.publish(topic, b"%d" % i, qos=1)
    assert len(pub.recv_n(6, timeout=5, ptype=PUBACK)) == 6
    first = [p for p in sub.recv_all(0.5) if p.type == PUBLISH]
    assert [p.payload for p in first] == [b"0", b"1"]  # the window of 2 is full; nothing is acked

    def change(cfg):
        cfg["zones"]["default"]["max_inflight"] = 4
        cfg["zones"]["default"]["acl"] = [{"permission": "deny", "action": "publish", "filter": topic}]

    rewrite(bp, change)
    wait_until(lambda: config_hash(bp) != before, timeout=5, msg="config reloaded")
    # the same connections: the window grew (two more queued messages arrive), the ACL now refuses
    more = [p for p in sub.recv_all(1.0) if p.type == PUBLISH]
    assert [p.payload for p in more] == [b"2", b"3"]
    pub.publish(topic, b"denied", qos=1)
    assert pub.expect(PUBACK, timeout=5).reason == 0x87
    assert bp.metric("fleetmq_zone_config_info", zone="default", config_hash=config_hash(bp)) == 1


def test_invalid_file_keeps_last_good_config(start_broker, raw_clients):
    bp = start_broker(zone_overrides={"max_inflight": 3})
    before = config_hash(bp)
    rewrite(bp, lambda cfg: cfg["zones"]["default"].update(max_inflight=-1))
    os.kill(bp.pid, signal.SIGHUP)
    wait_until(lambda: bp.metric("fleetmq_config_reload_errors_total") >= 1, timeout=5, msg="reload refused")
    assert "zones.default.max_inflight" in bp.log()
    assert bp.alive() and config_hash(bp) == before
    c = raw_clients(bp, 5)
    assert c.connect(uid("still")).reason == 0


def test_listeners_open_and_close_live(start_broker, raw_clients):
    bp = start_broker()
    port = free_port()
    rewrite(bp, lambda cfg: cfg["listeners"].append({"name": "extra", "zone": "default",
                                                       "bind": f"127.0.0.1:{port}", "protocol": "tcp"}))  # fmt: skip

    def connects() -> bool:
        try:
            c = RawClient("127.0.0.1", port, version=5, timeout=2)
        except OSError:
            return False
        c.close()
        return True

    wait_until(connects, timeout=5, msg="new listener open")
    client = RawClient("127.0.0.1", port, version=5)
    client.connect(uid("x"))
    rewrite(bp, lambda cfg: cfg["listeners"].pop())
    closed, seen = client.wait_closed(timeout=5)
    assert closed
    assert [p.reason for p in seen if p.type == DISCONNECT] == [0x8B]
    wait_until(lambda: not connects(), timeout=5, msg="removed listener closed")
    assert raw_clients(bp, 5).connect(uid("main")).reason == 0  # the other listener is untouched
