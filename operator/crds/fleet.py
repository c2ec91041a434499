"""BrokerFleet: the broker pods, their Redis (managed or existing), Services, metrics, rebalancing."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from fleetmq.broker.config import EventLogConfig, RedisClusterConfig, RedisStoreConfig, SentinelConfig
from fleetmq.broker.zones import parse_duration
from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from .base import Condition, CrdModel, SecretKeyRef, cel, doc
from .core import NetworkPolicyPeer, Quantity
from .derive import derive
from .pod import BrokerPodTemplate, RedisPodTemplate

_BROKER_REQUESTS: dict[str, int | str] = {"cpu": "100m", "memory": "128Mi"}


class ResourcesSpec(CrdModel):
    """CPU and memory of each broker container (a Kubernetes ResourceRequirements)."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: _BROKER_REQUESTS.copy(), description="Resources reserved."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource ceilings.")


class GuaranteedResources(CrdModel):
    """CPU and memory of a container, reserved and capped alike (requests == limits): a pod whose every
    container is so has the Guaranteed QoS class, the last one evicted when its node runs short."""

    cpu: Quantity = Field("250m", description="CPU reserved and capped.")
    memory: Quantity = Field("256Mi", description="Memory reserved and capped.")

    def requirements(self) -> dict[str, dict[str, int | str]]:
        """As a Kubernetes ResourceRequirements."""
        both: dict[str, int | str] = {"cpu": self.cpu, "memory": self.memory}
        return {"requests": dict(both), "limits": dict(both)}


class SentinelResources(GuaranteedResources):
    """CPU and memory of a sentinel, reserved and capped alike (requests == limits: Guaranteed QoS)."""

    cpu: Quantity = Field("50m", description="CPU reserved and capped.")
    memory: Quantity = Field("64Mi", description="Memory reserved and capped.")


class SetupResources(GuaranteedResources):
    """CPU and memory of the Job that forms a managed Redis Cluster (requests == limits)."""

    cpu: Quantity = Field("50m", description="CPU reserved and capped.")
    memory: Quantity = Field("64Mi", description="Memory reserved and capped.")


class SchedulingSpec(CrdModel):
    """How pods spread over nodes, so one node failure takes one of them."""

    antiAffinity: Literal["preferred", "required", "none"] = Field(
        "preferred", description="Pod anti-affinity between pods of the fleet of one kind over topologyKey."
    )
    topologyKey: str = Field(
        "kubernetes.io/hostname", description="Node label that anti-affinity spreads over."
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods need.")


HOST_PORT = r"^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$"
HostPort = Annotated[str, Field(pattern=HOST_PORT, max_length=260)]


class ExternalSentinelSpec(CrdModel):
    """An existing Redis replicated and watched by Sentinel: the brokers ask its sentinels for the primary."""

    nodes: list[HostPort] = Field(
        min_length=1, max_length=16, description=SentinelConfig.model_fields["nodes"].description
    )
    master: str = Field(min_length=1, description=SentinelConfig.model_fields["master"].description)
    secretRef: SecretKeyRef | None = Field(
        None,
        description="Secret key (default 'password') with the sentinels' own password, if they require one "
        "(the Redis password is redis.secretRef). Mounted into the broker pods as a file.",
    )


class ExternalClusterSpec(CrdModel):
    """An existing Redis Cluster: sessions spread over its shards by their hash tag."""

    nodes: list[HostPort] = Field(
        min_length=1, max_length=64, description=RedisClusterConfig.model_fields["nodes"].description
    )


REDIS_MODES = ("sentinel", "cluster", "standalone")
#: replicas per primary when redis.replicas is unset
DEFAULT_REPLICAS = {"sentinel": 2, "cluster": 1, "standalone": 0}


def _replicas_cel(obj: str) -> str:
    """CEL: the replicas per primary of `obj` (a RedisSpec), its default when unset."""
    return (
        f"(has({obj}.replicas) ? {obj}.replicas : "
        f"({obj}.mode == 'sentinel' ? 2 : ({obj}.mode == 'cluster' ? 1 : 0)))"
    )


def _same_cel(field: str) -> str:
    """CEL: an optional field of the redis spec is as it was (both unset counts)."""
    return f"(has(self.{field}) ? self.{field} : '') == (has(oldSelf.{field}) ? oldSelf.{field} : '')"


class RedisNetworkPolicySpec(CrdModel):
    """Who may reach the managed Redis: a NetworkPolicy admits only the fleet's brokers, its Redis pods
    (replication, sentinels, the cluster's setup Job) and the operator and pipeline pods of the operator's
    namespace, plus allowFrom. It holds where the cluster's network plugin enforces NetworkPolicies."""

    enabled: bool = Field(True, description="Render the NetworkPolicy.")
    allowFrom: list[NetworkPolicyPeer] = Field(
        default_factory=list, max_length=16, description="More peers admitted (a debugging pod, an exporter)."
    )


class RedisSpec(CrdModel):
    """Where the fleet keeps its sessions: a Redis the operator runs (managed: true; highly available by
    default) or an existing one (url, sentinel or cluster)."""

    managed: bool = Field(
        False,
        description="Run a Redis for this fleet: with mode sentinel (the default) a primary with replicas "
        "and sentinels that fail over, with mode cluster a Redis Cluster, with mode standalone (for "
        "development) one server. Exclusive with url, sentinel and cluster.",
    )
    mode: Literal["sentinel", "cluster", "standalone"] = Field(
        "sentinel",
        description="Topology of the managed Redis. It cannot change on an existing fleet: sessions are not "
        "moved between topologies.",
    )
    replicas: int | None = Field(
        None,
        ge=0,
        le=10,
        description="Replicas of each primary of the managed Redis: default 2 with mode sentinel (at least "
        "1), 1 with mode cluster (fixed once the cluster is formed), 0 with standalone.",
    )
    shards: int = Field(
        3, ge=3, le=100, description="Primaries of a managed Redis Cluster (mode cluster); fixed once formed."
    )
    sentinels: int = Field(
        3, ge=3, le=9, description="Sentinels of a managed Redis in mode sentinel: odd, a majority decides."
    )
    storage: str = Field(
        "1Gi",
        max_length=32,
        pattern=r"^([0-9]+(\.[0-9]+)?([KMGTPE]i?)?)?$",
        description="Size of the PersistentVolumeClaim of each managed Redis server, where its append-only "
        'file lives; "" for an emptyDir (development only: a server\'s data goes with its pod). Fixed once '
        "the fleet exists.",
    )
    storageClassName: str | None = Field(
        None,
        max_length=253,
        description="StorageClass of those claims (default: the cluster's default). Fixed once set.",
    )
    appendfsync: Literal["always", "everysec"] = Field(
        "everysec",
        description="When the managed Redis fsyncs its append-only file: always (every write, slower) or "
        "everysec (a crash of a server may lose its last second; replicas and waitReplicas cover it).",
    )
    resources: GuaranteedResources = Field(
        default_factory=GuaranteedResources,
        description="CPU and memory of each managed Redis server (requests == limits: Guaranteed QoS). "
        "Redis refuses writes (noeviction) beyond 70% of the memory, leaving room for its forks.",
    )
    sentinelResources: SentinelResources = Field(
        default_factory=SentinelResources,
        description="CPU and memory of each sentinel (requests == limits: Guaranteed QoS).",
    )
    setupResources: SetupResources = Field(
        default_factory=SetupResources,
        description="CPU and memory of the Job forming a Redis Cluster (requests == limits).",
    )
    image: str = Field("redis:7-alpine", min_length=1, description="Image of the managed Redis (Redis >= 7).")
    networkPolicy: RedisNetworkPolicySpec = Field(
        default_factory=RedisNetworkPolicySpec, description=doc(RedisNetworkPolicySpec)
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="How managed Redis servers (and, apart from them, sentinels) spread over nodes.",
    )
    pod: RedisPodTemplate | None = Field(
        None,
        description="What every pod of the managed Redis (servers, sentinels unless sentinelPod is set, "
        "and the Job forming a cluster, which gets no sidecars) gets besides the operator's settings: "
        "labels, annotations, tolerations, affinity, spread, priority, ServiceAccount, pull Secrets, "
        "environment, volumes, sidecars. Changing it rolls those pods one at a time.",
    )
    sentinelPod: RedisPodTemplate | None = Field(
        None, description="What the sentinels' pods get instead of redis.pod (default: redis.pod)."
    )
    url: str | None = Field(
        None,
        pattern=r"^rediss?://",
        description="URL of an existing Redis server, redis://host:port/db, without password (see "
        "secretRef).",
    )
    sentinel: ExternalSentinelSpec | None = Field(None, description=doc(ExternalSentinelSpec))
    cluster: ExternalClusterSpec | None = Field(None, description=doc(ExternalClusterSpec))
    secretRef: SecretKeyRef | None = Field(
        None,
        description="Secret key (default 'password') with the password of the existing Redis (url, "
        "sentinel or cluster). Mounted into the broker pods as a file.",
    )
    waitReplicas: int | None = Field(
        None,
        ge=0,
        description=(RedisStoreConfig.model_fields["wait_replicas"].description or "")
        + " Default: 1 for a managed Redis in mode sentinel or cluster (0 without replicas), else 0.",
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.managed ? 1 : 0) + (has(self.url) ? 1 : 0) + (has(self.sentinel) ? 1 : 0)"
                    " + (has(self.cluster) ? 1 : 0) == 1",
                    "message": "redis: set exactly one of managed: true, url, sentinel or cluster",
                },
                {
                    "rule": "!self.managed || !has(self.secretRef)",
                    "message": "redis.secretRef is the password of an existing Redis (url, sentinel or "
                    "cluster); a managed one has its own",
                },
                {
                    "rule": "!self.managed || self.mode != 'sentinel' || !has(self.replicas) || self.replicas >= 1",
                    "message": "redis.replicas must be at least 1 with mode sentinel: a failover promotes a "
                    "replica",
                },
                {
                    "rule": "!self.managed || self.mode != 'standalone' || !has(self.replicas) || self.replicas == 0",
                    "message": "redis.replicas must be 0 with mode standalone: use mode sentinel for replicas",
                },
                {
                    "rule": "self.sentinels % 2 == 1",
                    "message": "redis.sentinels must be odd (3, 5, 7, 9): a majority of them decides a failover",
                },
                {
                    "rule": f"!self.managed || !has(self.waitReplicas) || self.waitReplicas <= {_replicas_cel('self')}",
                    "message": "redis.waitReplicas cannot exceed redis.replicas: acks would wait for replicas "
                    "that do not exist",
                },
                {
                    "rule": "self.managed == oldSelf.managed",
                    "message": "redis.managed cannot change on an existing fleet: moving sessions between a "
                    "managed and an existing Redis is not supported; create a new fleet",
                },
                {
                    "rule": "!self.managed || self.mode == oldSelf.mode",
                    "message": "redis.mode cannot change on an existing fleet: moving sessions between Redis "
                    "topologies is not supported; create a new fleet",
                },
                {
                    "rule": "!self.managed || self.mode != 'cluster' || (self.shards == oldSelf.shards && "
                    f"{_replicas_cel('self')} == {_replicas_cel('oldSelf')})",
                    "message": "redis.shards and redis.replicas cannot change with mode cluster: resharding "
                    "a formed Redis Cluster is not supported",
                },
                {
                    "rule": f"!self.managed || ({_same_cel('storage')} && {_same_cel('storageClassName')})",
                    "message": "redis.storage and redis.storageClassName cannot change on an existing "
                    "fleet: a StatefulSet's volume claims are fixed",
                },
            ]
        },
    )

    @property
    def replicas_per_primary(self) -> int:
        return self.replicas if self.replicas is not None else DEFAULT_REPLICAS[self.mode]

    @property
    def wait_replicas(self) -> int:
        """What broker writes wait for: as set, else one replica of a managed Redis that has replicas."""
        if self.waitReplicas is not None:
            return self.waitReplicas
        if self.managed and self.mode in ("sentinel", "cluster"):
            return min(1, self.replicas_per_primary)
        return 0


class ServiceSpec(CrdModel):
    """The client Services (one per listener)."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the Services.")


#: A Kubernetes label key (an optional DNS-subdomain prefix and "/", then a name of at most 63 characters)
#: and a label value; the API server would refuse them on the ServiceMonitor only after the fleet was accepted.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
#: the labels the operator puts on its children (render.labels): pruning and selectors rely on them
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "fleetmq.io/fleet",
)
#: a Prometheus duration as the Prometheus Operator's ServiceMonitor accepts it, and CEL's duration() parses
SCRAPE_DURATION = r"^\d+(ms|s|m|h)$"


class MetricsSpec(CrdModel):
    """Where the brokers serve /metrics, /healthz and /readyz, and the ServiceMonitor that scrapes them."""

    port: int = Field(9100, ge=1, le=65535, description="Metrics and probe port of every broker pod.")
    serviceMonitor: bool = Field(
        True, description="Create a ServiceMonitor (when the monitoring.coreos.com CRD exists)."
    )
    interval: str = Field("30s", pattern=SCRAPE_DURATION, description="Scrape interval.")
    scrapeTimeout: str | None = Field(
        None,
        pattern=SCRAPE_DURATION,
        description="Scrape timeout, at most the interval. Default: Prometheus' scrape_timeout.",
    )
    # (beside serviceMonitor, not inside it: v1alpha1 fields are only added, never retyped; README "Upgrades")
    serviceMonitorLabels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels added to the ServiceMonitor, for the Prometheus serviceMonitorSelector that must "
        "pick it up (kube-prometheus-stack's default: release: <its Helm release name>). Cannot replace the "
        "operator's own: " + ", ".join(OWN_LABELS) + ".",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches(r'{LABEL_KEY_PATTERN}'))",
                    "message": "label keys must be [prefix/]name: a DNS subdomain prefix, and a name of at most "
                    "63 alphanumerics, '-', '_' or '.' starting and ending alphanumeric",
                },
                {
                    "rule": f"!self.exists(k, k in {list(OWN_LABELS)})",
                    "message": "labels cannot replace the operator's own (" + ", ".join(OWN_LABELS) + ")",
                },
            ]
        },
    )

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.scrapeTimeout) || duration(self.scrapeTimeout) <= duration(self.interval)",
                    "message": "scrapeTimeout cannot exceed interval (Prometheus refuses the scrape config)",
                    "fieldPath": ".scrapeTimeout",
                }
            ]
        },
    )

    @field_validator("serviceMonitorLabels")
    @classmethod
    def _label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if not re.match(LABEL_KEY_PATTERN, key):
                raise ValueError(f"label key {key!r} is not [prefix/]name")
            if key in OWN_LABELS:
                raise ValueError(f"label {key!r} is the operator's own")
        return labels

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> MetricsSpec:
        if self.scrapeTimeout is not None and parse_duration(self.scrapeTimeout) > parse_duration(
            self.interval
        ):
            raise ValueError("scrapeTimeout cannot exceed interval")
        return self


EventLogSpec = derive(
    "EventLogSpec",
    EventLogConfig,
    {"enabled": "enabled", "max_len": "maxLen", "sample": "sample", "max_rate": "maxRate"},
    "The brokers' event log (Redis Streams read by the pipeline). Changes restart the pods.",
)


class ApiKeysRef(CrdModel):
    """A keys file of `fleetmq-broker apikey` in a Secret of the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret in this namespace.")
    key: str = Field("keys.yaml", min_length=1, description="Key of the Secret holding the keys file.")


class ApiSpec(CrdModel):
    """The management API and web console on every broker pod (docs/api.md), any pod answering for the
    whole fleet, behind a Service `<fleet>-api`. Its keys come from `keysSecretRef`, or else from a Secret
    `<fleet>-api-keys` the operator makes once with one admin key (its `admin-key`). Reach the console
    with `kubectl port-forward svc/<fleet>-api 8081`."""

    enabled: bool = Field(False, description="Serve the API and console (a change restarts the pods).")
    port: int = Field(8081, ge=1, le=65535, description="The API's port on every broker pod and the Service.")
    serviceType: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Type of the Service `<fleet>-api`."
    )
    keysSecretRef: ApiKeysRef | None = Field(
        None, description="The keys file (hashes only). Unset: the operator's generated `<fleet>-api-keys`."
    )


class RebalanceSpec(CrdModel):
    """Moving connections from pods with more than their share to the others, a few a second. Clients stay
    on the pod they connected to, so pods added by a scale-up start empty. A rebalance starts after a
    scale-up (afterScaleUp) or when the annotation fleetmq.io/rebalance gets a new value, once every pod is
    Ready and no rollout is under way. The pods below the average receive one at a time: that pod alone
    takes new connections while the busy pods let its share go (MQTT 5: DISCONNECT 0x9C Use another
    server), so the clients reconnect to it, with their sessions."""

    afterScaleUp: bool = Field(False, description="Rebalance when the fleet has more Ready pods than before.")
    evictionRate: float = Field(
        50, gt=0, description="Connections per second each pod giving connections away lets go."
    )
    threshold: float = Field(
        1.1,
        ge=1,
        description="A pod gives connections away when it has more than the average per pod times this "
        "(and minConnections more than the average); it keeps the average.",
    )
    minConnections: int = Field(
        100,
        ge=0,
        description="A pod gives connections away only when it has this many more than the average.",
    )
    timeoutSeconds: int = Field(600, ge=1, description="A rebalance still running then ends (TimedOut).")


class RolloutSpec(CrdModel):
    """How the operator rolls the broker pods to a new template (image, resources, pod settings): it adds
    one pod of the new template, sends new clients to it alone once it is Ready, then lets the oldest pod
    go (its clients move at evictionRate, onto the new pod), and repeats, so each client moves once. Pod
    ordinals move up with each step (edge-0..2 become edge-3..5)."""

    progressDeadline: int = Field(
        600,
        ge=10,
        description="Seconds an added pod has to become Ready. Past it, or as soon as its image cannot be "
        "pulled or it crash-loops, the rollout stops (Progressing=False: ReadinessTimeout, ImagePullFailed, "
        "CrashLoop) with no old pod replaced; setting the template back removes the added pod.",
    )


#: a count of pods or a percentage of replicas ("25%"), as a PodDisruptionBudget takes it
IntOrPercent = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,  # (each applies to its own type)
            "pattern": r"^[0-9]+%$",
        }
    ),
]


class DisruptionSpec(CrdModel):
    """How many broker pods may be down at once by choice: the PodDisruptionBudget the operator renders
    (node drains, cluster upgrades), which its own rollouts and scale-downs keep to as well. Set one of
    maxUnavailable or minAvailable; neither: maxUnavailable 1."""

    maxUnavailable: IntOrPercent | None = Field(
        None, description="Pods (or a percentage of replicas, rounded up) that may be unavailable."
    )
    minAvailable: IntOrPercent | None = Field(
        None, description="Pods (or a percentage of replicas, rounded up) that must stay available."
    )

    model_config = cel(
        {
            "rule": "!(has(self.maxUnavailable) && has(self.minAvailable))",
            "message": "disruption: set maxUnavailable or minAvailable, not both",
        }
    )

    @field_validator("maxUnavailable", "minAvailable")
    @classmethod
    def _count_or_percent(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 0:
            raise ValueError("must be at least 0")
        if isinstance(v, str) and not re.fullmatch(r"[0-9]+%", v):
            raise ValueError("must be a count or a percentage such as '25%'")
        return v

    @model_validator(mode="after")
    def _one(self) -> DisruptionSpec:
        if self.maxUnavailable is not None and self.minAvailable is not None:
            raise ValueError("set maxUnavailable or minAvailable, not both")
        return self

    def budget(self) -> dict[str, int | str]:
        """The PodDisruptionBudget's spec fields."""
        if self.minAvailable is not None:
            return {"minAvailable": self.minAvailable}
        return {"maxUnavailable": 1 if self.maxUnavailable is None else self.maxUnavailable}

    def max_unavailable(self, replicas: int) -> int:
        """Pods of `replicas` that may be down, as the disruption controller counts (percentages rounded
        up)."""

        def scaled(v: int | str) -> int:
            return v if isinstance(v, int) else math.ceil(int(v[:-1]) * replicas / 100)

        if self.minAvailable is not None:
            return max(replicas - scaled(self.minAvailable), 0)
        return scaled(1 if self.maxUnavailable is None else self.maxUnavailable)


class ScalingRules(CrdModel):
    """How fast the autoscaler moves one way."""

    stabilizationWindowSeconds: int = Field(
        ge=0,
        le=3600,
        description="The autoscaler acts on the most conservative recommendation of this many seconds "
        "(up: the lowest, down: the highest), so a short spike or dip moves nothing.",
    )
    maxStep: int = Field(ge=1, description="Pods added (up) or removed (down) per periodSeconds at most.")
    periodSeconds: int = Field(60, ge=1, le=1800, description="The period maxStep counts over.")


class AutoscalingTargets(CrdModel):
    """Targets per broker pod; the fleet gets enough pods for the most demanding one. Set at least one."""

    connections: int | None = Field(None, ge=1, description="Client connections per pod.")
    messagesPerSecond: float | None = Field(None, gt=0, description="Messages delivered per second per pod.")
    cpu: Quantity | None = Field(
        None, description="CPU per pod (e.g. 500m), as the pods report their own use."
    )

    model_config = cel(
        {
            "rule": "has(self.connections) || has(self.messagesPerSecond) || has(self.cpu)",
            "message": "autoscaling.targets: set at least one of connections, messagesPerSecond, cpu",
        }
    )

    @model_validator(mode="after")
    def _one(self) -> AutoscalingTargets:
        if self.connections is None and self.messagesPerSecond is None and self.cpu is None:
            raise ValueError("set at least one of connections, messagesPerSecond, cpu")
        if self.cpu is not None:
            millicores(self.cpu)
        return self


def millicores(cpu: int | str) -> float:
    """A CPU quantity in millicores ("500m", "1.5", 2)."""
    text = str(cpu)
    try:
        return float(text[:-1]) if text.endswith("m") else float(text) * 1000
    except ValueError:
        raise ValueError(f"not a CPU quantity: {cpu!r} (such as 500m or 1.5)") from None


class AutoscalingSpec(CrdModel):
    """The operator's own autoscaler, from what the broker pods report (no metrics-server or adapter). A
    scale-up adds pods and then rebalances connections onto them; a scale-down takes one pod at a time
    out of the Services before it evicts its clients, their sessions kept. It sets spec.replicas, and
    steps aside while a HorizontalPodAutoscaler targets the fleet (condition Autoscaling)."""

    minReplicas: int = Field(ge=1, description="Fewest broker pods.")
    maxReplicas: int = Field(ge=1, description="Most broker pods.")
    targets: AutoscalingTargets = Field(description=doc(AutoscalingTargets))
    scaleUp: ScalingRules = Field(
        default_factory=lambda: ScalingRules(stabilizationWindowSeconds=0, maxStep=4, periodSeconds=15),
        description="How fast pods are added (default: at once, up to 4 every 15 s).",
    )
    scaleDown: ScalingRules = Field(
        default_factory=lambda: ScalingRules(stabilizationWindowSeconds=300, maxStep=1, periodSeconds=60),
        description="How fast pods are removed (default: after 5 minutes of lower load, one a minute).",
    )

    model_config = cel(
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "autoscaling: minReplicas cannot exceed maxReplicas",
        }
    )

    @model_validator(mode="after")
    def _range(self) -> AutoscalingSpec:
        if self.minReplicas > self.maxReplicas:
            raise ValueError("minReplicas cannot exceed maxReplicas")
        return self


class BrokerFleetSpec(CrdModel):
    """A fleet of broker pods sharing one Redis, serving the MqttZones that point at it."""

    replicas: int = Field(3, ge=0, description="Number of broker pods (scale subresource).")
    image: str | None = Field(
        None,
        min_length=1,
        description="Broker image (runs fleetmq-broker). Unset: the operator's (its --broker-image, the "
        "chart's image), so upgrading the operator upgrades the brokers it renders configs for.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the broker containers."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description=ResourcesSpec.__doc__)
    redis: RedisSpec = Field(
        default_factory=lambda: RedisSpec(managed=True),
        description=doc(RedisSpec),
        # with the fields its rules read: the API server checks them on the default as it stands
        json_schema_extra={
            "default": RedisSpec(managed=True).model_dump(include={"managed", "mode", "shards", "sentinels"})
        },
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec, description=ServiceSpec.__doc__)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description=MetricsSpec.__doc__)
    api: ApiSpec = Field(default_factory=ApiSpec, description=doc(ApiSpec))
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description=SchedulingSpec.__doc__)
    pod: BrokerPodTemplate | None = Field(None, description=doc(BrokerPodTemplate))
    terminationGracePeriodSeconds: int = Field(
        30,
        ge=1,
        description="Time a stopping broker has to drain: it refuses new clients, evicts connected ones at "
        "evictionRate so they reconnect to other pods, and commits pending session writes; it stops at 5 s "
        "before this deadline at the latest.",
    )
    evictionRate: float = Field(
        500,
        ge=0,
        description="Connections per second a stopping broker pod (rolling update, scale-down, node drain) "
        "tells to use another server (MQTT 5: DISCONNECT 0x9C), so its clients move to the other pods "
        "gradually, with their sessions; 0: all at once. A pod with more connections than evictionRate * "
        "(terminationGracePeriodSeconds - 5) closes the rest at its deadline.",
    )
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec, description=doc(RebalanceSpec))
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description=doc(RolloutSpec))
    disruption: DisruptionSpec = Field(default_factory=DisruptionSpec, description=doc(DisruptionSpec))
    autoscaling: AutoscalingSpec | None = Field(None, description=doc(AutoscalingSpec))
    paused: bool = Field(
        False,
        description="Hold a rollout where it is (no pod added or let go); everything else is reconciled. "
        "Unset to resume.",
    )
    eventLog: EventLogSpec = Field(default_factory=EventLogSpec, description=EventLogSpec.__doc__)  # type: ignore[valid-type]
    logLevel: Literal["debug", "info", "warning", "error"] = Field("info", description="Broker log level.")


class PodReport(CrdModel):
    """What one broker pod reports in Redis (keys.nodeinfo: fmq:nodeinfo:{<pod>})."""

    name: str
    configHash: str | None = Field(None, description="Hash of the config the broker applied.")
    connections: int = 0
    sessions: int = 0


class RebalancePodStatus(CrdModel):
    """One pod giving connections away."""

    asked: int = Field(description="Connections it was asked to let go.")
    moved: int = Field(0, description="Connections it let go so far.")


class RebalanceReceiverStatus(CrdModel):
    """A pod below the average, receiving in a stage of its own."""

    pod: str
    asked: int = Field(description="Connections it is to receive.")


class RebalanceStageStatus(CrdModel):
    """The stage under way: one pod receives; it alone serves, so every client let go lands on it."""

    index: int = Field(description="Which of the receivers (from 0).")
    receiver: str = Field(description="The pod receiving.")
    startedAt: str | None = Field(None, description="When it alone began to serve.")
    orderedAt: str | None = Field(
        None,
        description="When the pods giving were ordered to let connections go (the Services had settled).",
    )
    drainedAt: str | None = Field(
        None,
        description="When they all reported their orders done; the stage ends a few seconds later, once the "
        "last clients let go have reconnected.",
    )
    movedBefore: dict[str, int] = Field(
        default_factory=dict, description="Connections each pod giving had let go in earlier stages."
    )


class RebalanceStatus(CrdModel):
    """The last rebalance (spec.rebalance)."""

    phase: Literal["Running", "Completed", "TimedOut", "Interrupted", "Balanced"] | None = Field(
        None,
        description="None yet; Balanced: there was nothing to move; Interrupted: a pod stopped or a "
        "rollout began.",
    )
    id: str | None = Field(None, description="The orders' id (in the brokers' logs).")
    reason: Literal["ScaleUp", "Requested"] | None = Field(None, description="Why it started.")
    requested: str | None = Field(
        None, description="The value of the fleetmq.io/rebalance annotation acted on."
    )
    replicas: int = Field(0, description="Ready pods when the fleet was last seen steady (a scale-up: more).")
    startedAt: str | None = None
    finishedAt: str | None = None
    moved: int = Field(0, description="Connections let go so far.")
    pods: dict[str, RebalancePodStatus] = Field(
        default_factory=dict, description="The pods giving connections away."
    )
    receivers: list[RebalanceReceiverStatus] = Field(
        default_factory=list, description="The pods receiving, in the order they do."
    )
    stage: RebalanceStageStatus | None = Field(None, description=doc(RebalanceStageStatus))


class FleetZoneStatus(CrdModel):
    """One zone as this fleet serves it."""

    generation: int = Field(description="MqttZone generation in the rendered config.")
    appliedGeneration: int | None = Field(
        None, description="Generation applied by every pod (the lowest any pod runs); null if unknown."
    )
    podsApplied: int = Field(0, description="Pods running the rendered generation.")


class StoreStatus(CrdModel):
    """The fleet's Redis: its pods (managed) and what the brokers report of it."""

    mode: Literal["sentinel", "cluster", "standalone"] = Field(
        description="Topology: sentinel (replication watched by Sentinel), cluster, or standalone (one server)."
    )
    managed: bool = Field(description="Whether the operator runs it.")
    readyPods: int | None = Field(None, description="Managed Redis pods (servers and sentinels) ready.")
    wantedPods: int | None = Field(None, description="Managed Redis pods (servers and sentinels) wanted.")
    primary: str | None = Field(
        None, description="HOST:PORT the brokers write to (the most of them, if they disagree for a moment)."
    )
    failovers: int = Field(0, description="Most failovers a broker saw since it started.")
    replicasInSync: int | None = Field(
        None, description="Replicas in sync with the primary, the fewest any broker saw; null if unknown."
    )


class AutoscalingStatus(CrdModel):
    """What the operator's autoscaler saw and decided (absent without spec.autoscaling)."""

    desiredReplicas: int | None = Field(None, description="What the load asks for now, within the limits.")
    connections: float | None = Field(None, description="Client connections per Ready pod.")
    messagesPerSecond: float | None = Field(None, description="Messages delivered per second per Ready pod.")
    cpu: str | None = Field(None, description="CPU used per Ready pod (millicores, e.g. 430m).")
    lastScaleTime: str | None = Field(None, description="When it last changed spec.replicas.")


class RolloutStatus(CrdModel):
    """A rollout under way (absent when none is)."""

    pod: str | None = Field(None, description="The pod being added, or letting its clients go.")
    reason: str = Field(description="As the Progressing condition's.")
    message: str = ""


class BrokerFleetStatus(CrdModel):
    """Observed state of the fleet."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(0, description="Broker pods that exist.")
    readyReplicas: int = Field(0, description="Broker pods that are ready.")
    selector: str = Field("", description="Label selector of the broker pods (scale subresource).")
    configHash: str | None = Field(None, description="Hash of the rendered config the pods should report.")
    zoneCount: int = Field(0, description="Zones served.")
    zones: dict[str, FleetZoneStatus] = Field(default_factory=dict, description="Per zone generations.")
    pods: list[PodReport] = Field(default_factory=list, description="Per pod applied config and load.")
    connections: int = Field(0, description="Client connections over all pods.")
    sessions: int = Field(0, description="Sessions over all pods.")
    store: StoreStatus | None = Field(None, description=doc(StoreStatus))
    rebalance: RebalanceStatus | None = Field(None, description=doc(RebalanceStatus))
    updatedReplicas: int = Field(0, description="Broker pods made from the current template.")
    autoscaling: AutoscalingStatus | None = Field(None, description=doc(AutoscalingStatus))
    rollout: RolloutStatus | None = Field(None, description=doc(RolloutStatus))
