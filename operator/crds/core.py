"""Kubernetes core types as the CRDs carry them: what a platform team sets on the pods the operator runs
(tolerations, spread, environment, volumes, sidecars...).

Types fleetmq does not interpret deeply (affinity, volumes, containers, valueFrom) are kept as given, with
the keys that must be there checked here; the API server validates the rest when the operator applies the
StatefulSet (an error there is said in the fleet's Degraded condition).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from .base import CrdModel, cel

#: a resource quantity (1, "100m", "128Mi")
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        }
    ),
]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: a label or annotation key: an optional DNS subdomain prefix and a name
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
#: an object kept as given (affinity, valueFrom)
KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class KubeModel(BaseModel):
    """A Kubernetes object whose required keys are checked here and the rest kept as given."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class LabelSelectorRequirement(CrdModel):
    """One requirement of a label selector."""

    key: str = Field(min_length=1, max_length=316, description="Label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In and NotIn need values; Exists and DoesNotExist take none."
    )
    values: list[str] | None = Field(None, max_length=64, description="Label values (In, NotIn).")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                    "message": "In and NotIn need values; Exists and DoesNotExist take none",
                }
            ]
        },
    )


class LabelSelector(CrdModel):
    """Which pods a constraint counts (a Kubernetes LabelSelector)."""

    matchLabels: dict[str, str] | None = Field(None, description="Labels the pods have.")
    matchExpressions: list[LabelSelectorRequirement] | None = Field(
        None, max_length=16, description="Requirements the pods' labels meet (ANDed)."
    )


class IPBlock(CrdModel):
    """Addresses a network policy admits (a Kubernetes IPBlock)."""

    cidr: str = Field(min_length=1, description="CIDR admitted, e.g. 10.0.0.0/8.")
    except_: list[str] | None = Field(None, alias="except", description="CIDRs within it that are not.")


class NetworkPolicyPeer(CrdModel):
    """Who may connect (a Kubernetes NetworkPolicyPeer): pods by labels, in namespaces by labels (both:
    those pods in those namespaces; podSelector alone: in the fleet's namespace), or addresses."""

    podSelector: LabelSelector | None = Field(None, description="Pods admitted.")
    namespaceSelector: LabelSelector | None = Field(None, description="Namespaces whose pods are admitted.")
    ipBlock: IPBlock | None = Field(None, description="Addresses admitted (not with the selectors).")

    model_config = cel(
        {
            "rule": "has(self.ipBlock) != (has(self.podSelector) || has(self.namespaceSelector))",
            "message": "set ipBlock, or podSelector and/or namespaceSelector",
        }
    )


class Toleration(CrdModel):
    """A node taint the pods tolerate (a Kubernetes Toleration)."""

    key: str | None = Field(
        None,
        max_length=316,
        pattern=QUALIFIED_NAME,
        description="Taint key tolerated; unset with operator Exists tolerates every taint.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        None, description="Equal (default): the taint's value is `value`; Exists: any value."
    )
    value: str | None = Field(None, max_length=63, description="Taint value tolerated (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect tolerated; unset: every effect."
    )
    tolerationSeconds: int | None = Field(
        None,
        description="With effect NoExecute: how long a pod stays on a node after the taint appears "
        "(unset: for ever; 0 or less: evicted at once).",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    "message": "a toleration with operator Exists has no value",
                },
                {
                    "rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                    "message": "a toleration without key needs operator Exists",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds needs effect NoExecute",
                },
            ]
        },
    )


class TopologySpreadConstraint(CrdModel):
    """How the pods spread over a topology domain (a Kubernetes TopologySpreadConstraint)."""

    maxSkew: int = Field(ge=1, description="Most pods a domain may have more than the emptiest one.")
    topologyKey: str = Field(
        min_length=1,
        max_length=316,
        pattern=QUALIFIED_NAME,
        description="Node label whose values are domains.",
    )
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="DoNotSchedule keeps a pod pending rather than exceed maxSkew; ScheduleAnyway prefers."
    )
    labelSelector: LabelSelector | None = Field(
        None,
        description="Pods counted; default: the pods of this StatefulSet (the operator's selector labels).",
    )
    minDomains: int | None = Field(
        None, ge=1, description="Domains counted at least (whenUnsatisfiable DoNotSchedule only)."
    )
    nodeAffinityPolicy: Literal["Honor", "Ignore"] | None = Field(
        None, description="Whether the pods' node affinity and selector limit the domains (default Honor)."
    )
    nodeTaintsPolicy: Literal["Honor", "Ignore"] | None = Field(
        None, description="Whether tainted nodes the pods do not tolerate count (default Ignore)."
    )
    matchLabelKeys: list[str] | None = Field(
        None,
        max_length=16,
        description="Pod label keys whose values narrow the pods counted (e.g. pod-template-hash).",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minDomains) || self.whenUnsatisfiable == 'DoNotSchedule'",
                    "message": "minDomains needs whenUnsatisfiable DoNotSchedule",
                }
            ]
        },
    )


class Affinity(CrdModel):
    """Node and pod (anti-)affinity, as in a Kubernetes pod spec."""

    nodeAffinity: KubeObject | None = Field(None, description="Nodes the pods prefer or need (NodeAffinity).")
    podAffinity: KubeObject | None = Field(None, description="Pods to be near (PodAffinity).")
    podAntiAffinity: KubeObject | None = Field(None, description="Pods to be apart from (PodAntiAffinity).")


class ConfigRef(CrdModel):
    """A ConfigMap or Secret of the same namespace whose keys become environment variables."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object in this namespace.")
    optional: bool | None = Field(None, description="Start the container without it when it is missing.")


class EnvFromSource(CrdModel):
    """Every key of a ConfigMap or Secret as an environment variable."""

    prefix: str | None = Field(None, max_length=253, description="Prepended to each key.")
    configMapRef: ConfigRef | None = Field(None, description="The ConfigMap (exclusive with secretRef).")
    secretRef: ConfigRef | None = Field(None, description="The Secret (exclusive with configMapRef).")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.configMapRef) != has(self.secretRef)",
                    "message": "envFrom: set exactly one of configMapRef or secretRef",
                }
            ]
        },
    )


class EnvVar(CrdModel):
    """An environment variable: a value, or valueFrom (a Kubernetes EnvVarSource: a key of a Secret or
    ConfigMap, a field of the pod, a resource of the container)."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME, description="Variable name.")
    value: str | None = Field(None, description="Its value ($(VAR) references expand).")
    valueFrom: KubeObject | None = Field(
        None, description="Where its value comes from (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "an env entry has value or valueFrom, not both",
                }
            ]
        },
    )


class Volume(KubeModel):
    """A volume of the pods (a Kubernetes Volume: configMap, secret, emptyDir, csi, projected, ...)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Volume name in the pod.")


class VolumeMount(CrdModel):
    """Where a volume of `volumes` appears in the pods' main container."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="A volume of `volumes`.")
    mountPath: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path.")
    readOnly: bool | None = Field(None, description="Mount read-only.")
    subPath: str | None = Field(None, description="Path inside the volume (default: its root).")
    subPathExpr: str | None = Field(None, description="subPath with $(VAR) references expanded.")
    mountPropagation: Literal["None", "HostToContainer", "Bidirectional"] | None = Field(
        None, description="How mounts propagate between host and container (default None)."
    )


class Container(KubeModel):
    """A container of your own in the pods (a Kubernetes Container: command, ports, resources, ...). Not
    made to follow the restricted Pod Security Standard: its securityContext is yours to set."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Container name.")
    image: str = Field(min_length=1, description="Container image.")
