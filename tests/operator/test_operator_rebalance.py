"""A rebalance from the control plane to the data plane: the operator reads the broker "pods'" reports,
orders the busy ones to let clients go, steers new connections away from them meanwhile, and records
the outcome in the fleet's status and events.

The pods are kwok's (Ready, as the StatefulSet made them); the brokers are real processes running the
rendered config under the pods' names (each on its own ports), on a real redis-server.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml
from fleetmq.operator import render

from tests.integration import mqttraw
from tests.integration.harness import uid
from tests.integration.mqttraw import RawClient
from tests.support import free_port

from .conftest import fleet, wait_for, zone
from .support import start_pod

pytestmark = pytest.mark.redis


def serving(k, pod: str) -> str | None:
    return ((k.get("pod", pod) or {}).get("metadata", {}).get("labels") or {}).get("fleetmq.io/serving")


def test_a_requested_rebalance_moves_the_busy_pods_excess_to_the_empty_one(
    k, run_operator, redis_server, tmp_path, control_plane
):
    if not control_plane.controllers:
        pytest.skip("needs kwok's Ready pods (make envtest)")
    run_operator()
    k.apply(fleet(replicas=3, redis={"url": redis_server.url},
                  rebalance={"evictionRate": 10, "minConnections": 5}))  # fmt: skip
    k.apply(zone(listeners=[{"name": "mqtt", "port": 1883}]))
    cm = wait_for(
        lambda: (
            "external"
            in yaml.safe_load((c := k.get("configmap", "edge-config"))["data"][render.CONFIG_KEY])["zones"]
            and c
        ),
        msg="rendered config",
    )
    base = yaml.safe_load(cm["data"][render.CONFIG_KEY])
    ports: dict[str, int] = {}
    brokers = []
    for i in range(3):
        pod = f"edge-{i}"
        ports[pod] = free_port()
        cfg = json.loads(json.dumps(base))
        for lst in cfg["listeners"]:
            lst["bind"] = f"127.0.0.1:{ports[pod]}"
        cfg["metrics"]["bind"] = f"127.0.0.1:{free_port()}"
        path = tmp_path / f"{pod}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        brokers.append(
            start_pod(path, pod, ports[pod], int(cfg["metrics"]["bind"].rsplit(":", 1)[1]), tmp_path)
        )
    try:
        clients: dict[str, tuple[str, RawClient]] = {}
        for pod in ("edge-0", "edge-1"):
            for _ in range(30):
                cid = uid("rb-")
                c = RawClient("127.0.0.1", ports[pod], version=5, timeout=5)
                c.connect(cid, clean=False, props={"session_expiry_interval": 600})
                clients[cid] = (pod, c)
        closed: dict[str, list[int]] = {}
        lock = threading.Lock()

        def watch(cid: str, c: RawClient) -> None:
            try:
                ok, seen = c.wait_closed(60)
            except (OSError, ValueError):
                return
            if ok:
                with lock:
                    closed[cid] = [p.reason for p in seen if p.type == mqttraw.DISCONNECT]

        for cid, (_, c) in clients.items():
            threading.Thread(target=watch, args=(cid, c), daemon=True).start()
        wait_for(lambda: k.get("brokerfleet", "edge")["status"].get("connections") == 60, timeout=60,
                 msg="the fleet's status counts 60 connections")  # fmt: skip
        wait_for(lambda: all(serving(k, f"edge-{i}") == "true" for i in range(3)), msg="every pod serving")

        k.patch("brokerfleet", "edge", {"metadata": {"annotations": {"fleetmq.io/rebalance": "first"}}})
        st = wait_for(lambda: (r := k.get("brokerfleet", "edge")["status"].get("rebalance") or {}).get("id") and r,
                      msg="a rebalance started")  # fmt: skip
        assert st["reason"] == "Requested" and st["requested"] == "first", st
        assert {p: v["asked"] for p, v in st["pods"].items()} == {"edge-0": 10, "edge-1": 10}, st
        if st["phase"] == "Running":  # the busy pods take no new connections meanwhile
            assert serving(k, "edge-2") == "true"
        st = wait_for(lambda: (r := k.get("brokerfleet", "edge")["status"]["rebalance"])["phase"] == "Completed"
                      and r, timeout=60, msg="the rebalance completed")  # fmt: skip
        assert st["moved"] == 20 and st["finishedAt"], st
        wait_for(lambda: len(closed) == 20, timeout=10, msg="20 clients let go")
        time.sleep(3)  # (the orders are withdrawn: no pod lets more go)
        assert len(closed) == 20 and all(r == [0x9C] for r in closed.values()), closed
        assert sorted(clients[cid][0] for cid in closed) == ["edge-0"] * 10 + ["edge-1"] * 10
        wait_for(lambda: all(serving(k, f"edge-{i}") == "true" for i in range(3)), msg="serving again")
        events = json.loads(k("get", "events", "-o", "json").stdout)["items"]
        reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "edge"]
        assert "RebalanceStarted" in reasons and "RebalanceCompleted" in reasons, reasons

        for cid in closed:  # what a Service would do: the clients reconnect to a pod that serves
            clients[cid][1].close()
            again = RawClient("127.0.0.1", ports["edge-2"], version=5, timeout=5)
            ack = again.connect(cid, clean=False, props={"session_expiry_interval": 600})
            assert ack.session_present, f"{cid}: its session did not follow it"
            clients[cid] = ("edge-2", again)
        wait_for(lambda: [p.get("connections") for p in k.get("brokerfleet", "edge")["status"]["pods"]]
                 == [20, 20, 20], timeout=60, msg="20 connections on each pod")  # fmt: skip
        k.patch("brokerfleet", "edge", {"metadata": {"annotations": {"fleetmq.io/rebalance": "second"}}})
        st = wait_for(lambda: (r := k.get("brokerfleet", "edge")["status"]["rebalance"])["requested"] == "second"
                      and r, msg="the second request seen")  # fmt: skip
        assert st["phase"] == "Balanced" and st["pods"] == {} and st["moved"] == 0, st
        for _, c in clients.values():
            c.close()
    finally:
        for bp in brokers:
            bp.stop()
