"""fleetmq operations: metrics, health endpoints, config validation, zones on listeners, SIGTERM drain,
takeover reason codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from tests.integration import mqttraw as m
from tests.integration.harness import HOST, uid
from tests.support import free_port, wait_until


def test_health_endpoints(broker):
    assert broker.http_get("/healthz")[0] == 200
    assert broker.http_get("/readyz")[0] == 200


def test_metrics_connections_sessions_messages(broker, clients):
    base_recv = broker.metric("fleetmq_messages_received_total", zone="default")
    base_conn = broker.metric("fleetmq_connections", zone="default")
    names = {k.partition("{")[0] for k in broker.metrics()}
    for name in (
        "fleetmq_connections",
        "fleetmq_sessions",
        "fleetmq_inflight_messages",
        "fleetmq_mqueue_messages",
        "fleetmq_messages_received_total",
        "fleetmq_messages_delivered_total",
        "fleetmq_messages_dropped_total",
        "fleetmq_keepalive_timeouts_total",
    ):
        assert name in names, f"{name} missing from /metrics"

    t = uid("met/")
    sub = clients(version=4)
    sub.subscribe(t, 1)
    pub = clients(version=5)
    for q in (0, 1, 2):
        pub.publish(t, b"x", q)
    sub.wait_for(3)
    assert broker.metric("fleetmq_connections", zone="default") - base_conn == 2
    assert broker.metric("fleetmq_sessions", zone="default", state="online") >= 2
    assert broker.metric("fleetmq_messages_received_total", zone="default") - base_recv == 3
    assert broker.metric("fleetmq_messages_received_total", zone="default", qos="2") >= 1

    persistent = clients(uid("off"), version=4, clean=False)
    persistent.subscribe(uid("off/"), 1)
    before_off = broker.metric("fleetmq_sessions", state="offline")
    persistent.disconnect()
    wait_until(
        lambda: broker.metric("fleetmq_sessions", state="offline") - before_off == 1, 3, msg="offline +1"
    )
    wait_until(
        lambda: broker.metric("fleetmq_connections", zone="default") - base_conn == 2, 3, msg="connections"
    )


def test_malformed_packet_counted(broker, raw_clients):
    before = broker.metric("fleetmq_disconnects_total", reason="malformed_packet")
    c = raw_clients(broker, version=5)
    c.connect(uid("mal"))
    c.send(m.subscribe(1, [("x", 0)], version=5, flags=0))
    closed, seen = c.wait_closed(3)
    assert closed and [p.reason for p in seen if p.type == m.DISCONNECT] == [0x81]
    wait_until(
        lambda: broker.metric("fleetmq_disconnects_total", reason="malformed_packet") - before == 1,
        3,
        msg="malformed_packet disconnect counted",
    )


def test_v5_takeover_sends_0x8e(broker, raw_clients):
    cid = uid("to")
    before = broker.metric("fleetmq_session_events_total", event="takenover")
    first = raw_clients(broker, version=5)
    first.connect(cid, clean=False, props={"session_expiry_interval": 60})
    second = raw_clients(broker, version=5)
    assert second.connect(cid, clean=False, props={"session_expiry_interval": 60}).session_present
    closed, seen = first.wait_closed(3)
    assert closed
    assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x8E]
    wait_until(
        lambda: broker.metric("fleetmq_session_events_total", event="takenover") - before == 1,
        3,
        msg="takenover",
    )


def refused(tmp_path, cfg: dict) -> str:
    """The broker started with `cfg` refuses to start: its stderr."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "fleetmq.broker", "--config", str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    return r.stderr


def test_bad_config_field_names_path(tmp_path):
    cfg = {
        "node_id": "bad",
        "store": {"kind": "memory"},
        "zones": {"external": {"max_inflight": -1}},
        "listeners": [
            {"name": "mqtt", "zone": "external", "bind": f"{HOST}:{free_port()}", "protocol": "tcp"}
        ],
    }
    stderr = refused(tmp_path, cfg)
    assert "zones.external.max_inflight" in stderr, stderr


def test_unknown_zone_in_listener_rejected(tmp_path):
    cfg = {
        "zones": {"external": {}},
        "listeners": [{"name": "mqtt", "zone": "nope", "bind": f"{HOST}:{free_port()}", "protocol": "tcp"}],
    }
    stderr = refused(tmp_path, cfg)
    assert "listeners" in stderr and "nope" in stderr, stderr


def test_listen_shorthand(tmp_path):
    port = free_port()
    log = open(tmp_path / "listen.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetmq.broker", "--listen", f"{HOST}:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:

        def up():
            try:
                c = m.RawClient(HOST, port, version=4, timeout=1)
            except OSError:
                assert proc.poll() is None, (tmp_path / "listen.log").read_text()
                return None
            return c

        c = wait_until(up, 15, interval=0.1, msg="--listen port")
        with c:
            assert c.connect(uid("l")).reason == 0
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_zones_bound_to_listeners(start_broker, client_factory, raw_clients):
    b = start_broker(
        {
            "zones": {"narrow": {"max_inflight": 1}, "wide": {"max_inflight": 3}},
            "listeners": [
                {"name": "narrow", "zone": "narrow", "bind": f"{HOST}:0", "protocol": "tcp"},
                {"name": "wide", "zone": "wide", "bind": f"{HOST}:0", "protocol": "tcp"},
            ],
        }
    )
    t = uid("z/")
    subs = {}
    for name in ("narrow", "wide"):
        c = m.RawClient(HOST, b.ports[name], version=4)
        subs[name] = c
        c.connect(uid(name))
        c.subscribe([(t, 1)])
    try:
        pub = client_factory(broker=b, version=4)
        for i in range(5):
            pub.publish(t, str(i).encode(), 1)
        for name, window in (("narrow", 1), ("wide", 3)):
            got = subs[name].recv_n(window)
            got += subs[name].recv_all(0.4)
            assert len(got) == window, (name, got)
        # the publisher is on the first listener (b.port) too
        assert b.metric("fleetmq_connections", zone="narrow") == 2
        assert b.metric("fleetmq_connections", zone="wide") == 1
    finally:
        for c in subs.values():
            c.close()


def test_sigterm_drains(start_broker, raw_clients):
    b = start_broker()
    v5 = [raw_clients(b, version=5) for _ in range(2)]
    for c in v5:
        c.connect(uid("dr"))
    v4 = raw_clients(b, version=4)
    v4.connect(uid("dr"))
    t0 = time.monotonic()
    os.kill(b.pid, signal.SIGTERM)
    for c in v5:
        closed, seen = c.wait_closed(5)
        assert closed
        assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x8B], seen
    closed, seen = v4.wait_closed(5)
    assert closed and not seen
    rc = b.proc.wait(10)
    assert rc == 0, f"exit code {rc}"
    assert time.monotonic() - t0 < 5


def test_server_receive_maximum_exceeded(start_broker, raw_clients):
    b = start_broker(zone_overrides={"receive_maximum": 5, "max_awaiting_rel": 100})
    c = raw_clients(b, version=5)
    ack = c.connect(uid("srm"))
    assert ack.props.get("receive_maximum") == 5
    t = uid("srm/")
    for pid in range(1, 6):
        c.publish(t, b"x", qos=2, packet_id=pid)
    assert all(p.reason < 0x80 for p in c.recv_n(5, ptype=m.PUBREC))
    c.publish(t, b"x", qos=1, packet_id=6)  # the 6th unacknowledged QoS>0 PUBLISH
    closed, seen = c.wait_closed(3)
    assert closed
    assert [p.reason for p in seen if p.type == m.DISCONNECT] == [0x93], seen
