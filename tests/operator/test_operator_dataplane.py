"""Data plane from the control plane: the ConfigMap the operator rendered runs real brokers, and an
MqttZone change made through the apiserver reaches them live, with the operator reporting what they run.

The broker runs the rendered file unchanged (the test picks free ports for the zone's listener and the
fleet's metrics port, and points the fleet at a real redis-server on loopback), so its config hash is the
one the operator expects. A new ConfigMap version is copied to the broker's config file, as the kubelet
does for a mounted ConfigMap; the broker's file watch picks it up.
"""

from __future__ import annotations

import pytest
import yaml
from fleetmq.operator import metrics, render

from tests.integration.harness import uid
from tests.integration.mqttraw import PUBACK, PUBLISH, RawClient
from tests.support import free_port

from .conftest import fleet, wait_for, zone
from .support import readyz, start_pod

pytestmark = pytest.mark.redis


def test_zone_change_through_the_apiserver_reaches_running_brokers(
    k, run_operator, redis_server, tmp_path, control_plane, kube_namespace
):
    mqtt_port, metrics_port = free_port(), free_port()
    run_operator()
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port}))
    k.apply(zone(listeners=[{"name": "mqtt", "port": mqtt_port}], session={"maxInflight": 2}))

    def rendered() -> tuple[str, str]:
        cm = k.get("configmap", "edge-config")
        return cm["metadata"]["annotations"][render.A_CONFIG_HASH], cm["data"][render.CONFIG_KEY]

    # the config with the zone in it (the fleet alone may have been rendered first)
    first_hash, text = wait_for(
        lambda: "external" in yaml.safe_load((r := rendered())[1])["zones"] and r, msg="rendered config"
    )
    config_path = tmp_path / "broker.yaml"
    config_path.write_text(text)
    bp = start_pod(config_path, "edge-0", mqtt_port, metrics_port, tmp_path)
    try:
        assert readyz(metrics_port)["config_hash"] == first_hash
        st = wait_for(lambda: (s := k.get("brokerfleet", "edge")["status"])["zones"]["external"].get(
            "appliedGeneration") == 1 and s, msg="fleet reports generation 1 applied")  # fmt: skip
        assert st["pods"][0]["name"] == "edge-0" and st["pods"][0]["configHash"] == first_hash
        cond = k.condition("brokerfleet", "edge", "ConfigApplied")
        assert cond["status"] == "True", cond
        wait_for(
            lambda: k.condition("mqttzone", "external", "Applied").get("status") == "True", msg="zone applied"
        )
        assert k.get("mqttzone", "external")["status"]["podGenerations"] == {"edge-0": 1}

        topic = uid("live/")
        sub = RawClient("127.0.0.1", mqtt_port, version=5, timeout=5)
        sub.connect(uid("s"))
        sub.subscribe([(topic, 1)])
        pub = RawClient("127.0.0.1", mqtt_port, version=5, timeout=5)
        pub.connect(uid("p"))
        for i in range(6):
            pub.publish(topic, b"%d" % i, qos=1)
        assert len(pub.recv_n(6, timeout=5, ptype=PUBACK)) == 6
        first = [p for p in sub.recv_all(0.5) if p.type == PUBLISH]
        assert [p.payload for p in first] == [b"0", b"1"]  # the zone's window of 2 is full

        k.patch("mqttzone", "external", {"spec": {
            "session": {"maxInflight": 4},
            "acl": [{"permission": "deny", "action": "publish", "filter": topic}],
        }})  # fmt: skip
        new_hash, text = wait_for(lambda: (r := rendered())[0] != first_hash and r, msg="re-rendered")
        assert yaml.safe_load(text)["zones"]["external"]["max_inflight"] == 4
        config_path.write_text(text)  # what the kubelet does with a mounted ConfigMap
        wait_for(lambda: readyz(metrics_port)["config_hash"] == new_hash, msg="broker applied the new config")
        # the same connections: the window grew, the ACL refuses
        more = [p for p in sub.recv_all(1.0) if p.type == PUBLISH]
        assert [p.payload for p in more] == [b"2", b"3"]
        pub.publish(topic, b"denied", qos=1)
        assert pub.expect(PUBACK, timeout=5).reason == 0x87

        st = wait_for(lambda: (s := k.get("brokerfleet", "edge")["status"])["zones"]["external"].get(
            "appliedGeneration") == 2 and s, msg="fleet reports generation 2 applied")  # fmt: skip
        assert st["connections"] == 2 and st["pods"][0]["configHash"] == new_hash
        wait_for(lambda: k.get("mqttzone", "external")["status"].get("podGenerations") == {"edge-0": 2},
                 msg="zone reports generation 2 on every pod")  # fmt: skip
        assert k.condition("mqttzone", "external", "Applied")["status"] == "True"
        if control_plane.controllers:  # kwok runs pod edge-0: ready, and it reports the rendered config
            wait_for(
                lambda: k.condition("brokerfleet", "edge", "Ready").get("status") == "True", msg="fleet ready"
            )
            ready = {"fleet_namespace": kube_namespace, "fleet": "edge"}
            wait_for(lambda: metrics.REGISTRY.get_sample_value("fleetmq_operator_fleet_ready", ready) == 1,
                     msg="fleet_ready 1")  # fmt: skip
        assert bp.alive()
        sub.close()
        pub.close()
    finally:
        bp.stop()
