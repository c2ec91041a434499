"""spec.api on a real kube-apiserver: the operator renders the management API into the brokers' config and
pods, puts a Service in front of it and generates an admin key; a broker running what it rendered, with
the Secret as the kubelet would mount it, answers the key."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from fleetmq.broker import apikeys
from fleetmq.operator import render

from tests.integration.harness import _wait_port
from tests.support import free_port

from .conftest import fleet, wait_for, zone
from .support import config_with_zone, secret_bytes, start_pod

pytestmark = pytest.mark.redis


def test_spec_api_gets_its_service_a_generated_admin_key_and_the_brokers_serve_it(
    k, run_operator, redis_server, tmp_path
):
    mqtt_port, metrics_port, api_port = free_port(), free_port(), free_port()
    run_operator()
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port},
                  api={"enabled": True, "port": api_port}))  # fmt: skip
    k.apply(zone(listeners=[{"name": "mqtt", "port": mqtt_port}]))
    secret = wait_for(lambda: secret_bytes(k, "edge-api-keys"), msg="the generated keys Secret")
    admin = secret[render.API_ADMIN_KEY].decode()
    keys_file = secret["keys.yaml"].decode()
    assert admin.startswith("fmq_admin_") and admin not in keys_file
    assert [(x.name, x.role) for x in apikeys.parse(keys_file)] == [("admin", "admin")]
    owner = k.get("secret", "edge-api-keys")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("BrokerFleet", "edge")
    assert "Created Secret edge-api-keys with an admin API key" in k("get", "events", "-o", "json").stdout

    svc = wait_for(lambda: k.get("service", "edge-api"), msg="the API's Service")
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": api_port, "targetPort": "api", "protocol": "TCP"}
    ]
    pod = k.get("statefulset", "edge")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "api", "containerPort": api_port, "protocol": "TCP"} in container["ports"]
    (volume,) = [v["secret"] for v in pod["volumes"] if v["name"] == "api-keys"]
    assert (volume["secretName"], volume["items"]) == (
        "edge-api-keys",
        [{"key": "keys.yaml", "path": "keys.yaml"}],
    )
    text = config_with_zone(k)
    assert yaml.safe_load(text)["api"] == {
        "bind": f"0.0.0.0:{api_port}",
        "keys_file": "/etc/fleetmq/api/keys.yaml",
    }
    assert admin not in text

    # a broker "pod" running the rendered config, the keys Secret mounted where the kubelet puts it
    base = tmp_path / "etc-fleetmq"
    (base / "api").mkdir(parents=True)
    (base / "api" / "keys.yaml").write_text(keys_file)
    config = tmp_path / "broker.yaml"
    config.write_text(text.replace(render.CONFIG_DIR + "/", f"{base}/"))
    bp = start_pod(config, "edge-0", mqtt_port, metrics_port, tmp_path)
    try:
        _wait_port(bp, api_port)
        req = urllib.request.Request(f"http://127.0.0.1:{api_port}/api/v1/nodes",
                                     headers={"Authorization": f"Bearer {admin}"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as r:
            assert [n["node"] for n in json.loads(r.read())["data"]] == ["edge-0"]
    finally:
        bp.stop()

    # turned off: the Service goes (the Secret stays, owned by the fleet: the operator deletes no Secret)
    k.apply(fleet(replicas=1, redis={"url": redis_server.url}, metrics={"port": metrics_port},
                  api={"enabled": False, "port": api_port}))  # fmt: skip
    wait_for(lambda: k.get("service", "edge-api") is None, msg="the API's Service deleted")
    assert "api" not in yaml.safe_load(k.get("configmap", "edge-config")["data"][render.CONFIG_KEY])


def test_spec_api_with_its_own_keys_secret_mounts_that_one(k, run_operator):
    run_operator()
    k.apply(fleet(api={"enabled": True, "keysSecretRef": {"name": "my-keys", "key": "api.yaml"}}))
    k.apply(zone())
    sts = wait_for(lambda: k.get("statefulset", "edge"), msg="the StatefulSet")
    (volume,) = [v["secret"] for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys"]
    assert (volume["secretName"], volume["items"]) == ("my-keys", [{"key": "api.yaml", "path": "keys.yaml"}])
    assert k.get("secret", "edge-api-keys") is None  # none generated
