"""The custom resources' models: BrokerFleet, MqttZone, MqttBridge, MqttUser (group fleetmq.io, v1alpha1).

One module per resource (fleet, zone, bridge, user), the Kubernetes core types they carry (core), the pod
templates (pod), and what they share (base). The zone and bridge settings are not retyped: every field
that configures a broker is derived (derive) from the broker's own models (ZoneSettings, AclRule,
ListenerConfig, BridgeConfig, RedisStoreConfig, EventLogConfig), carrying their descriptions, defaults,
ranges and enums, under camelCase names grouped as users read them. crdgen turns these models into the
CRDs in crds/.
"""

from .base import (
    API_VERSION,
    GROUP,
    VERSION,
    Condition,
    CrdModel,
    ObjectRef,
    SecretKeyRef,
    SecretRef,
    fleet_ref,
)
from .bridge import MqttBridgeSpec, MqttBridgeStatus
from .fleet import (
    AutoscalingSpec,
    BrokerFleetSpec,
    BrokerFleetStatus,
    DisruptionSpec,
    MetricsSpec,
    RebalanceSpec,
    RedisSpec,
    RolloutSpec,
    RolloutStatus,
    SchedulingSpec,
    ServiceSpec,
)
from .pod import BROKER_NAMES, OPERATOR_LABELS, OPERATOR_PREFIX, REDIS_NAMES, PodTemplate
from .user import MqttUserSpec, MqttUserStatus
from .zone import ACCESS_FIELDS, OPERATOR_SET_FIELDS, ZONE_GROUPS, ListenerSpec, MqttZoneSpec, MqttZoneStatus

__all__ = [
    "ACCESS_FIELDS",
    "API_VERSION",
    "BROKER_NAMES",
    "GROUP",
    "OPERATOR_LABELS",
    "OPERATOR_PREFIX",
    "OPERATOR_SET_FIELDS",
    "REDIS_NAMES",
    "VERSION",
    "ZONE_GROUPS",
    "AutoscalingSpec",
    "BrokerFleetSpec",
    "BrokerFleetStatus",
    "Condition",
    "CrdModel",
    "DisruptionSpec",
    "ListenerSpec",
    "MetricsSpec",
    "MqttBridgeSpec",
    "MqttBridgeStatus",
    "MqttUserSpec",
    "MqttUserStatus",
    "MqttZoneSpec",
    "MqttZoneStatus",
    "ObjectRef",
    "PodTemplate",
    "RebalanceSpec",
    "RedisSpec",
    "RolloutSpec",
    "RolloutStatus",
    "SchedulingSpec",
    "SecretKeyRef",
    "SecretRef",
    "ServiceSpec",
    "fleet_ref",
]
