"""Will messages, v5 Will Delay Interval."""

from __future__ import annotations

import time

import pytest

from tests.integration.harness import uid

pytestmark = pytest.mark.generic


@pytest.mark.parametrize("version", [3, 4, 5])
def test_will_on_abnormal_close(broker, clients, raw_clients, version):
    t = uid("will/")
    sub = clients(version=4)
    sub.subscribe(t, 1)
    c = raw_clients(broker, version=version)
    c.connect(uid("w"), will={"topic": t, "payload": b"gone", "qos": 1})
    c.close()  # no DISCONNECT
    (msg,) = sub.wait_for(1, timeout=5)
    assert (msg.topic, msg.payload) == (t, b"gone")


@pytest.mark.parametrize("version", [3, 4, 5])
def test_no_will_on_normal_disconnect(broker, clients, raw_clients, version):
    t = uid("will/")
    sub = clients(version=4)
    sub.subscribe(t, 1)
    c = raw_clients(broker, version=version)
    c.connect(uid("w"), will={"topic": t, "payload": b"gone", "qos": 1})
    c.disconnect()
    time.sleep(0.3)  # let the broker process the DISCONNECT and the close
    pub = clients(version=4)
    pub.publish(t, b"sentinel", 1)
    m, before = sub.wait_topic(t)
    assert m.payload == b"sentinel" and before == []


def test_v5_disconnect_with_will_message_reason(broker, clients, raw_clients):
    """v5 DISCONNECT reason 0x04 (Disconnect with Will Message) still publishes the will."""
    t = uid("will/")
    sub = clients(version=5)
    sub.subscribe(t, 1)
    c = raw_clients(broker, version=5)
    c.connect(uid("w"), will={"topic": t, "payload": b"asked", "qos": 1})
    c.disconnect(reason=0x04)
    (msg,) = sub.wait_for(1)
    assert msg.payload == b"asked"


def test_retained_will(broker, clients, raw_clients):
    t = uid("will/")
    c = raw_clients(broker, version=4)
    c.connect(uid("w"), will={"topic": t, "payload": b"offline", "qos": 1, "retain": True})
    c.close()
    time.sleep(0.3)
    sub = clients(version=4)
    sub.subscribe(t, 1)
    (msg,) = sub.wait_for(1)
    assert (msg.payload, msg.retain) == (b"offline", True)
    sub.publish(t, b"", 1, retain=True)


def _delayed_will(broker, clients, raw_clients, cid: str, *, payload=b"late", delay=2, expiry=30):
    """A v5 watcher of a fresh topic, and a raw v5 client `cid` whose session lasts `expiry` s after it
    disconnects, with a QoS 1 will on that topic `delay` s late: (watcher, client)."""
    t = uid("will/")
    sub = clients(version=5)
    sub.subscribe(t, 1)
    c = raw_clients(broker, version=5)
    will = {"topic": t, "payload": payload, "qos": 1, "props": {"will_delay_interval": delay}}
    c.connect(cid, clean=True, props={"session_expiry_interval": expiry}, will=will)
    return sub, c


def test_v5_will_delay_published_after_delay(broker, clients, raw_clients):
    sub, c = _delayed_will(broker, clients, raw_clients, uid("w"))
    t0 = time.monotonic()
    c.close()
    assert sub.drain(1.2) == []  # not before the delay
    (msg,) = sub.wait_for(1, timeout=4)
    elapsed = time.monotonic() - t0
    assert msg.payload == b"late"
    assert 1.5 <= elapsed <= 4.5, elapsed


def test_v5_will_delay_cancelled_by_reconnect(broker, clients, raw_clients):
    cid = uid("w")
    sub, c = _delayed_will(broker, clients, raw_clients, cid)
    c.close()
    time.sleep(0.5)
    c2 = raw_clients(broker, version=5)
    ack = c2.connect(cid, clean=False, props={"session_expiry_interval": 30})
    assert ack.session_present
    assert sub.drain(3.0) == []
    c2.disconnect()


def test_v5_will_delay_longer_than_session_expiry(broker, clients, raw_clients):
    """The will is published when the session ends, even if the will delay is longer."""
    sub, c = _delayed_will(broker, clients, raw_clients, uid("w"), payload=b"ended", delay=60, expiry=1)
    c.close()
    (msg,) = sub.wait_for(1, timeout=4)
    assert msg.payload == b"ended"
