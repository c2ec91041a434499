"""What the resources' models share: the API group and version, the base model, references to objects
of the namespace, and status conditions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.config import JsonDict

GROUP = "fleetmq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class CrdModel(BaseModel):
    """camelCase fields as the CRD spells them; unknown ones are refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def cel(*rules: JsonDict) -> ConfigDict:
    """A CrdModel's config with CEL rules the API server checks (x-kubernetes-validations); the model's
    own validators tell pydantic the same."""
    return ConfigDict(
        extra="forbid", populate_by_name=True, json_schema_extra={"x-kubernetes-validations": list(rules)}
    )


def doc(model: type[BaseModel]) -> str:
    """A model's docstring as one line, for the description of a field of that type (kubectl explain)."""
    return " ".join((model.__doc__ or "").split())


class ObjectRef(CrdModel):
    """A reference to an object in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object in this namespace.")


class FleetMember(BaseModel):
    """The fleetRef of an MqttZone, MqttBridge or MqttUser spec alone (the rest ignored): which fleet an
    object belongs to is known even when the rest of its spec is invalid, so that fleet can say why."""

    model_config = ConfigDict(extra="ignore")

    fleetRef: ObjectRef


def fleet_ref(obj: Mapping[str, Any] | None) -> str | None:
    """The BrokerFleet an MqttZone, MqttBridge or MqttUser object names (None: none, or not valid)."""
    try:
        return FleetMember.model_validate((obj or {}).get("spec") or {}).fleetRef.name
    except ValidationError:
        return None


class SecretRef(CrdModel):
    """A Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")


class SecretKeyRef(CrdModel):
    """One key of a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")
    key: str = Field("password", min_length=1, description="Key of the Secret holding the password.")


class UsersSecretRef(CrdModel):
    """The users file in a Secret of the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")
    key: str = Field("users", min_length=1, description="Key of the Secret holding the users file.")


class Condition(CrdModel):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Ready, Progressing, ConfigApplied, Degraded, StoreReady, Accepted or Applied."
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    observedGeneration: int | None = Field(None, description="The generation the condition is about.")
    lastTransitionTime: str = Field(description="When status last changed (RFC 3339).")
