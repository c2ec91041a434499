"""Issue 25: a store call whose outcome is unknown (Redis ran it, its reply never came back) is never taken
for one that did not run, and a client resending after an outage gets each QoS 2 message once, whichever
node it resumes on. Each test puts the fault at one point of one path: a proxy between a node and Redis
(tests/redisproxy.py) lets a request through and loses its reply, or a node runs on another clock; each
failed before its fix."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.integration import mqttraw
from tests.integration.harness import MOSQUITTO, uid
from tests.integration.mqttraw import PUBCOMP, PUBREC
from tests.integration.test_fleet_support import AppView, ack_loop, parse_seq, raw_connect, seq_payload
from tests.integration.test_fleet_takeover import wait_route

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet")

#: a node on a host that booted a day before the others: its monotonic clock is a day ahead
DAY_AHEAD = ("unshare", "-T", "--monotonic", "86400")


def qos2_view(sub: mqttraw.RawClient, quiet: float = 2.0) -> list[tuple[str, int]]:
    view = AppView()
    ack_loop(sub, view, quiet=quiet, timeout=15)
    return [parse_seq(p) for p in view.delivered]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare (time namespaces)")
def test_a_qos2_receipt_resumed_on_a_node_with_another_monotonic_clock_is_kept(fleet):
    """An awaiting-PUBREL record was stored with the monotonic time of the node that received it, and read
    as a time of the clock of the node that restored it. On a node whose host booted earlier (every
    Kubernetes node has its own clock), the record looked older than await_rel_timeout and was discarded
    at once, so the client's resend was routed again: every subscriber got the message twice."""
    [a] = fleet(1)
    [b] = fleet(1, wrap=DAY_AHEAD)
    topic = uid("clock/")
    sub, _ = raw_connect(b, uid("sub"), 5)
    sub.subscribe([(topic, 2)])
    wait_route(a, sub, topic)
    pcid = uid("pub")
    pub, _ = raw_connect(a, pcid, 5)
    pub.send(mqttraw.publish(topic, seq_payload("c", 1), qos=2, packet_id=21, version=5))
    pub.expect(PUBREC)  # stored: a's record of packet id 21, awaiting PUBREL
    pub.close()  # the PUBREC is lost with the connection, as far as the client knows
    pub, ack = raw_connect(b, pcid, 5)
    assert ack.session_present
    time.sleep(0.3)  # (b's timer for the record it restored has had its chance)
    pub.send(mqttraw.publish(topic, seq_payload("c", 1), qos=2, packet_id=21, dup=True, version=5))
    rec = pub.expect(PUBREC)
    pub.send(mqttraw.ack(mqttraw.PUBREL, rec.packet_id, version=5))
    pub.expect(PUBCOMP)
    assert qos2_view(sub) == [("c", 1)], "a QoS 2 message reached the subscriber twice"
