"""Generate crds/ from the pydantic models (`python -m fleetmq.operator.crdgen [--check] [DIR]`).

Pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined, Optional[X] as
nullable X, exclusive bounds in OpenAPI v3 form, defaults from default factories (so nested defaults apply),
titles dropped. The CRDs are never edited by hand; a test fails when crds/ or the Helm chart's copy
(charts/fleetmq/crds/, which Helm installs before the chart's templates) differs from this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .crds import (
    GROUP,
    VERSION,
    BrokerFleetSpec,
    BrokerFleetStatus,
    MqttBridgeSpec,
    MqttBridgeStatus,
    MqttUserSpec,
    MqttUserStatus,
    MqttZoneSpec,
    MqttZoneStatus,
)

CRD_DIR = Path(__file__).resolve().parent.parent / "crds"
CHART_CRD_DIR = CRD_DIR.parent / "charts" / "fleetmq" / "crds"


class _Schema(GenerateJsonSchema):
    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        """Evaluate default factories: `session: {}` in the CRD makes the apiserver fill nested defaults."""
        factory = schema.get("default_factory")
        if factory is None:
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        return value


_DROP = {"title"}


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """Turn one pydantic JSON Schema node into an apiextensions.k8s.io/v1 structural schema node."""
    if isinstance(node, list):
        return [structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}  # the field's description/default win over the model's
    out: dict[str, Any] = {}
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        branches = [b for b in any_of if b.get("type") != "null"]
        if len(branches) < len(any_of):
            out["nullable"] = True
        if node.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [structural(b, defs) for b in branches]
        elif len(branches) == 1:
            inner = structural(branches[0], defs)
            node = {**inner, **node}
        else:
            raise ValueError(f"cannot express a union in a structural schema: {any_of}")
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {k: structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            if value is False:
                continue  # unknown fields are pruned by the apiserver anyway
            if value is True:  # a model that keeps what it does not know (extra="allow")
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
            out[key] = structural(value, defs)
        elif key == "description" and isinstance(value, str):
            out[key] = " ".join(value.split())  # a docstring's line breaks are not kubectl explain's
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        elif key in ("minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum", "default"):
            out[key] = value
        else:
            out[key] = structural(value, defs) if isinstance(value, dict | list) else value
    if "properties" in out:
        out.setdefault("type", "object")
    if out.get("nullable") and out.get("default", 0) is None:
        del out["default"]  # "default: null" is how pydantic says optional; the CRD just omits it
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema: JsonSchemaValue = model.model_json_schema(by_alias=True, schema_generator=_Schema)
    defs = schema.pop("$defs", {})
    return structural(schema, defs)  # type: ignore[no-any-return]


def _crd(
    kind: str,
    plural: str,
    short: list[str],
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    *,
    scale: bool = False,
    description: str,
) -> dict[str, Any]:
    spec_schema = model_schema(spec)
    spec_schema.pop("description", None)
    schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {**spec_schema, "description": " ".join((spec.__doc__ or "").split())},
            "status": model_schema(status),
        },
    }
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["fleetmq", "all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _cond(type_: str) -> str:
    return f'.status.conditions[?(@.type=="{type_}")].status'


def crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD manifest."""
    fleet = _crd(
        "BrokerFleet",
        "brokerfleets",
        ["bf", "fleet"],
        BrokerFleetSpec,
        BrokerFleetStatus,
        [
            {"name": "Ready", "type": "string", "jsonPath": _cond("Ready")},
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas", "priority": 1},
            {"name": "Zones", "type": "integer", "jsonPath": ".status.zoneCount"},
            {"name": "Connections", "type": "integer", "jsonPath": ".status.connections"},
            {"name": "Sessions", "type": "integer", "jsonPath": ".status.sessions", "priority": 1},
            {"name": "Store", "type": "string", "jsonPath": _cond("StoreReady"), "priority": 1},
            {"name": "Primary", "type": "string", "jsonPath": ".status.store.primary", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        scale=True,
        description="A fleet of fleetmq MQTT broker pods whose sessions live in one Redis.",
    )
    zone = _crd(
        "MqttZone",
        "mqttzones",
        ["mz", "zone"],
        MqttZoneSpec,
        MqttZoneStatus,
        [
            {"name": "Fleet", "type": "string", "jsonPath": ".spec.fleetRef.name"},
            {"name": "Accepted", "type": "string", "jsonPath": _cond("Accepted")},
            {"name": "Applied", "type": "string", "jsonPath": _cond("Applied")},
            {"name": "Generation", "type": "integer", "jsonPath": ".metadata.generation", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        description="An MQTT zone: listeners and the session, keep-alive, limit and access settings of "
        "their clients, served by a BrokerFleet.",
    )
    bridge = _crd(
        "MqttBridge",
        "mqttbridges",
        ["mb", "bridge"],
        MqttBridgeSpec,
        MqttBridgeStatus,
        [
            {"name": "Fleet", "type": "string", "jsonPath": ".spec.fleetRef.name"},
            {"name": "Remote", "type": "string", "jsonPath": ".spec.remote.host"},
            {"name": "Connected", "type": "string", "jsonPath": _cond("Connected")},
            {"name": "Leader", "type": "string", "jsonPath": ".status.leader"},
            {"name": "Queue", "type": "integer", "jsonPath": ".status.queueMessages"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        description="A bridge from a BrokerFleet to a remote MQTT broker: local topics forwarded there, remote "
        "subscriptions published here, with the fleet's delivery guarantees.",
    )
    user = _crd(
        "MqttUser",
        "mqttusers",
        ["mu", "mqttuser"],
        MqttUserSpec,
        MqttUserStatus,
        [
            {"name": "Fleet", "type": "string", "jsonPath": ".spec.fleetRef.name"},
            {"name": "Username", "type": "string", "jsonPath": ".status.username"},
            {"name": "Zones", "type": "string", "jsonPath": ".spec.zones", "priority": 1},
            {"name": "Accepted", "type": "string", "jsonPath": _cond("Accepted")},
            {"name": "Applied", "type": "string", "jsonPath": _cond("Applied")},
            {"name": "Secret", "type": "string", "jsonPath": ".status.secretName", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        description="An MQTT user of a BrokerFleet's zones: password from a Secret (or generated into one), "
        "its own ACL rules, and the common name of its client certificate; applied live.",
    )
    return {
        "fleetmq.io_brokerfleets.yaml": fleet,
        "fleetmq.io_mqttbridges.yaml": bridge,
        "fleetmq.io_mqttusers.yaml": user,
        "fleetmq.io_mqttzones.yaml": zone,
        "kopf.dev_clusterkopfpeerings.yaml": _peering("ClusterKopfPeering", "Cluster"),
        "kopf.dev_kopfpeerings.yaml": _peering("KopfPeering", "Namespaced"),
    }


def owned() -> list[dict[str, Any]]:
    """fleetmq's own CRDs (not kopf's peering ones, which come with the chart)."""
    return [crd for crd in crds().values() if crd["spec"]["group"] == GROUP]


def _peering(kind: str, scope: str) -> dict[str, Any]:
    """kopf's peering resources: replicas of the operator (--peering NAME) elect one active among them."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Operator replicas announce themselves here; the highest priority one "
                            "is active (kopf peering).",
                            "properties": {
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


HEADER = "# Generated by `python -m fleetmq.operator.crdgen` from operator/crds/: do not edit.\n"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a default shared by two fields is written twice, not as a YAML anchor


def render() -> dict[str, str]:
    return {
        name: HEADER + yaml.dump(crd, Dumper=_Dumper, sort_keys=False, width=110)
        for name, crd in crds().items()
    }


def stale(directory: Path = CRD_DIR) -> list[str]:
    """Files of `directory` that differ from the generated CRDs."""
    return [
        name
        for name, text in render().items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetmq.operator.crdgen", description=__doc__)
    p.add_argument(
        "directories",
        nargs="*",
        type=Path,
        default=[CRD_DIR, CHART_CRD_DIR],
        help="default: crds/ and the chart's",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a directory is stale")
    args = p.parse_args(argv)
    if args.check:
        bad = [d / name for d in args.directories for name in stale(d)]
        for path in bad:
            print(f"stale: {path} (run `make crds`)", file=sys.stderr)
        return 1 if bad else 0
    for directory in args.directories:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in render().items():
            (directory / name).write_text(text)
            print(directory / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
