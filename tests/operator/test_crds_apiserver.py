"""The generated CRDs in a real kube-apiserver: defaults, kubectl explain, and bad specs refused."""

from __future__ import annotations

import json

import pytest

from .conftest import fleet, wait_for, zone


def test_explain_shows_the_broker_models_descriptions(k):
    # the apiserver publishes a new CRD's OpenAPI a moment after it is established
    out = wait_for(lambda: (o := k("explain", "mqttzone.spec.session.maxInflight", check=False).stdout)
                   and "Inflight Window length" in o and o, msg="kubectl explain")  # fmt: skip
    assert "FIELD: maxInflight <integer>" in out
    out = k("explain", "brokerfleet.spec.redis").stdout
    assert "managed" in out and "secretRef" in out


def test_defaults_are_filled_by_the_apiserver(k):
    k.apply(fleet())
    k.apply(zone(session={"maxInflight": 7}))
    z = k.get("mqttzone", "external")
    assert z["spec"]["session"]["maxInflight"] == 7
    assert z["spec"]["session"]["retryInterval"] == "30s"  # default of the broker's model
    assert z["spec"]["keepalive"]["backoff"] == 0.75
    assert z["spec"]["listeners"][0]["protocol"] == "tcp"
    assert z["spec"]["authentication"]["allowAnonymous"] is True
    f = k.get("brokerfleet", "edge")
    assert f["spec"]["metrics"]["port"] == 9100 and f["spec"]["terminationGracePeriodSeconds"] == 30
    header = k("get", "brokerfleets").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "REPLICAS", "ZONES", "CONNECTIONS", "AGE"]
    assert k("get", "mz").stdout.splitlines()[0].split()[:4] == ["NAME", "FLEET", "ACCEPTED", "APPLIED"]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (zone(session={"maxInflight": 70000}), "should be less than or equal to 65535"),
        (zone(session={"retryInterval": "soon"}), "spec.session.retryInterval"),
        (zone(listeners=[{"name": "m", "port": 1883, "protocol": "quic"}]), 'Unsupported value: "quic"'),
        (zone(listeners=[{"name": "m", "port": 8883, "protocol": "tls"}]), "a tls or wss listener needs tlsSecretRef"),
        (zone(listeners=[{"name": "m", "port": 1883}, {"name": "m", "port": 1884}]), "Duplicate value"),
        (zone(listeners=[{"name": "a", "port": 1883}, {"name": "b", "port": 1883}]), "listener ports must be unique"),
        (zone(listeners=[{"name": "Bad_Name", "port": 1883}]), "spec.listeners[0].name"),
        (zone(authentication={"allowAnonymous": False}), "allowAnonymous: false needs usersSecretRef"),
        (zone(acl=[{"permission": "maybe", "filter": "#"}]), 'Unsupported value: "maybe"'),
        (fleet(redis={"managed": True, "url": "redis://x:6379/0"}), "set exactly one of managed: true or url"),
        (fleet(redis={"managed": False}), "set exactly one of managed: true or url"),
        (fleet(replicas=-1), "should be greater than or equal to 0"),
    ],
    ids=[
        "inflight-range", "duration-pattern", "protocol-enum", "tls-needs-secret", "listener-names-unique",
        "ports-unique", "listener-name-pattern", "anonymous-needs-users", "acl-enum", "redis-both",
        "redis-neither", "replicas-range",
    ],
)  # fmt: skip
def test_bad_specs_are_refused_with_a_useful_message(k, obj, message):
    out = k.apply(obj, check=False)
    assert out.returncode != 0, f"accepted: {obj}"
    assert message in out.stderr, out.stderr


def test_unknown_fields_are_refused_by_strict_validation(k):
    out = k("apply", "--validate=strict", "-f", "-", input=json.dumps(zone(sesion={})), check=False)
    assert out.returncode != 0 and 'unknown field "spec.sesion"' in out.stderr
