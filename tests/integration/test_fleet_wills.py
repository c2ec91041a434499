"""A node dies: the fleet lets go of its sessions and publishes its clients' wills after their delay."""

from __future__ import annotations

import time

import pytest

from tests.support import wait_until

from .fleet_support import will_client
from .harness import MOSQUITTO, Client, uid

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")

# cluster.HEARTBEAT_TTL (5 s) + cluster.REAP_INTERVAL (1 s) + slack
DETECT = 10.0


def session_keys(redis_server, cid: str) -> list[str]:
    return redis_server.keys(f"fmq:{{{cid}}}:*")


def test_wills_of_a_killed_node_are_published(fleet, redis_server):
    a, b = fleet(2)
    topic = uid("will/")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(topic + "/#", 1)
    # no delay: published as soon as the fleet notices the node is gone
    now = will_client(a, uid("now"), topic + "/now", b"gone")
    # delay 2 s, persistent session: published 2 s after the node is released
    later = will_client(a, uid("later"), topic + "/later", b"late", delay=2)
    # delay 3 s, but the client comes back on B before: no will
    back_id = uid("back")
    back = will_client(a, back_id, topic + "/back", b"never", delay=3)
    a.kill()
    t_kill = time.monotonic()
    for c in (now, later, back):
        c.stop()
    got, _ = watcher.wait_topic(topic + "/now", timeout=DETECT)
    t_now = time.monotonic() - t_kill
    assert got.payload == b"gone"
    # the delayed-will client reconnects on B within its delay
    back2 = Client(b.host, b.port, back_id, version=5, clean=False, session_expiry=60)
    assert back2.session_present
    got, before = watcher.wait_topic(topic + "/later", timeout=5)
    t_later = time.monotonic() - t_kill
    assert got.payload == b"late"
    assert t_later - t_now >= 1.5, "the will delay was not honoured"
    time.sleep(3.5)
    assert not [m for m in before + watcher.drain() if m.topic == topic + "/back"], (
        "will of a client that came back"
    )
    back2.disconnect()
    watcher.disconnect()


def test_clean_sessions_of_a_killed_node_end(fleet, redis_server):
    a, b = fleet(2)
    topic = uid("gone/")
    cid = uid("clean")
    c = Client(a.host, a.port, cid, version=4, clean=True)
    c.subscribe(topic, 1)
    persistent = uid("pers")
    p = Client(a.host, a.port, persistent, version=4, clean=False)
    p.subscribe(topic, 1)
    wait_until(lambda: session_keys(redis_server, cid), timeout=5, msg="clean session in Redis")
    a.kill()
    for x in (c, p):
        x.stop()
    wait_until(
        lambda: not session_keys(redis_server, cid), timeout=DETECT, msg="clean session of the dead node gone"
    )
    # the persistent one waits for its client, with its expiry as TTL, and still gets messages
    assert session_keys(redis_server, persistent)
    ttl = redis_server.command("PTTL", f"fmq:{{{persistent}}}:m")
    assert ttl > 0, "a released persistent session must expire with its expiry interval"
    pub = Client(b.host, b.port, uid("pub"), version=4)
    pub.publish(topic, b"for-the-absent", 1)
    pub.disconnect()
    p2 = Client(b.host, b.port, persistent, version=4, clean=False)
    assert p2.session_present
    got = p2.wait_for(1, timeout=5)
    assert [m.payload for m in got] == [b"for-the-absent"]
    p2.disconnect()


def test_delayed_will_of_a_parked_session_survives_its_node(fleet, redis_server):
    """A client drops off A with a 4 s will delay; A dies before it: another node publishes the will."""
    a, b = fleet(2)
    topic = uid("pw/")
    watcher = Client(b.host, b.port, uid("watch"), version=5)
    watcher.subscribe(topic + "/#", 1)
    parked = will_client(a, uid("parked"), topic + "/w", b"still-due", delay=4)
    # a second client that comes back (on B) before its delay: its will must never appear
    back_id = uid("back")
    back = will_client(a, back_id, topic + "/back", b"never", delay=4)
    parked.stop()  # abnormal close: A parks the sessions, their wills wait for their delay
    back.stop()
    t_close = time.monotonic()
    time.sleep(0.5)
    a.kill()
    back2 = Client(b.host, b.port, back_id, version=5, clean=False, session_expiry=60)
    assert back2.session_present
    got, before = watcher.wait_topic(topic + "/w", timeout=DETECT + 4)
    waited = time.monotonic() - t_close
    assert got.payload == b"still-due"
    assert waited >= 3.5, f"the will went out after {waited:.1f}s, before its 4 s delay"
    time.sleep(1.0)
    assert not [m for m in before + watcher.drain() if m.topic == topic + "/back"], (
        "will of a client that came back"
    )
    back2.disconnect()
    watcher.disconnect()
