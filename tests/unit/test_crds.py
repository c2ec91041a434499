"""The CRDs: generated from the broker's own models, structural, and in step with crds/."""

from __future__ import annotations

import pytest
import yaml
from fleetmq.broker.config import ListenerConfig
from fleetmq.broker.zones import ZoneSettings
from fleetmq.operator import crdgen, crds
from pydantic import ValidationError


def _spec_schema(plural: str) -> dict:
    crd = crdgen.crds()[f"fleetmq.io_{plural}.yaml"]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crds_dir_is_up_to_date():
    stale = crdgen.stale()
    assert not stale, f"crds/ is stale ({stale}): run `make crds`"


def test_every_zone_setting_has_a_home_in_the_mqttzone_spec():
    """Adding a field to ZoneSettings fails here until the CRD says where it lives."""
    mapped = set(crds.ACCESS_FIELDS) | set(crds.OPERATOR_SET_FIELDS)
    for fields in crds.ZONE_GROUPS.values():
        mapped |= set(fields)
    assert mapped == set(ZoneSettings.model_fields)


def test_zone_fields_carry_the_broker_models_descriptions_defaults_and_ranges():
    spec = _spec_schema("mqttzones")["properties"]
    inflight = spec["session"]["properties"]["maxInflight"]
    source = ZoneSettings.model_fields["max_inflight"]
    assert inflight["description"] == source.description
    assert (inflight["default"], inflight["minimum"], inflight["maximum"]) == (32, 0, 65535)
    backoff = spec["keepalive"]["properties"]["backoff"]
    assert backoff["minimum"] == 0 and backoff["exclusiveMinimum"] is True
    retry = spec["session"]["properties"]["retryInterval"]
    assert retry["x-kubernetes-int-or-string"] is True and retry["default"] == "30s"
    assert spec["session"]["default"] == {}  # so the apiserver fills the nested defaults
    protocol = spec["listeners"]["items"]["properties"]["protocol"]
    assert protocol["enum"] == ["tcp", "ws", "tls", "wss"]
    assert protocol["default"] == ListenerConfig.model_fields["protocol"].default
    assert spec["acl"]["items"]["properties"]["action"]["enum"] == ["publish", "subscribe", "all"]


def _walk(node, path="spec"):
    yield path, node
    if isinstance(node, dict):
        for key in ("properties",):
            for name, child in (node.get(key) or {}).items():
                yield from _walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("plural", ["mqttzones", "brokerfleets"])
def test_schemas_are_structural_and_described(plural):
    for path, node in _walk(_spec_schema(plural)):
        assert "$ref" not in node and "title" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if path.count(".") and not path.endswith("{}") and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description (kubectl explain)"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{path}: only int-or-string may use anyOf"


def test_fleet_crd_has_scale_status_printer_columns_and_short_names():
    crd = crdgen.crds()["fleetmq.io_brokerfleets.yaml"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")] == [
        "Ready",
        "Replicas",
        "Zones",
        "Connections",
        "Age",
    ]
    assert "bf" in crd["spec"]["names"]["shortNames"]
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["redis"][
        "x-kubernetes-validations"
    ]
    assert any("managed" in r["rule"] and "url" in r["rule"] for r in rules)


def test_written_files_are_yaml_crds():
    for path in sorted(crdgen.CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert doc["kind"] == "CustomResourceDefinition"


def test_zone_spec_validates_like_the_broker():
    spec = crds.MqttZoneSpec.model_validate(
        {"fleetRef": {"name": "edge"}, "session": {"maxInflight": 5, "retryInterval": "2m"}}
    )
    settings = spec.zone_settings()
    assert settings.max_inflight == 5 and settings.retry_interval == 120.0
    with pytest.raises(ValidationError):
        crds.MqttZoneSpec.model_validate({"fleetRef": {"name": "edge"}, "session": {"maxInflight": 70000}})
    with pytest.raises(ValidationError):
        crds.MqttZoneSpec.model_validate({"fleetRef": {"name": "edge"}, "session": {"max_inflightt": 1}})
