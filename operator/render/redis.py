"""The managed Redis: servers, sentinels and the Job forming a Redis Cluster.

All run redis.sh (the ConfigMap <fleet>-redis-scripts) from the Redis image, with the password from the
Secret <fleet>-redis-auth (created once by the operator) as a file. Servers keep their append-only file
(and a cluster node its nodes.conf) on a claim of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..crds import BrokerFleetSpec
from .common import (
    L_COMPONENT,
    L_INSTANCE,
    L_NAME,
    PASSWORD_KEY,
    REDIS_PORT,
    SENTINEL_PORT,
    Fleet,
    RenderError,
    dns_name,
    labels,
    names,
    object_meta,
    redis_addresses,
    redis_pods,
    selector_labels,
    sentinel_addresses,
    short_digest,
)
from .pods import POD_NAME_ENV, REDIS_UID, RESTRICTED_CONTAINER, pdb, pod_template, restricted_pod

L_REDIS_MODE = "fleetmq.io/redis-mode"  # on the managed Redis' StatefulSet: the topology its data is in
SCRIPT = "redis.sh"
#: redis.sh stays at the top of the operator package (docs and the chaos suite name it there)
SCRIPT_PATH = Path(__file__).resolve().parent.parent / SCRIPT
SCRIPT_TEXT = SCRIPT_PATH.read_text()
#: where the managed Redis' containers find the script and the password
SCRIPTS_DIR = "/scripts"
REDIS_SECRET_DIR = "/etc/redis-auth"
MAXMEMORY_SHARE = 0.7  # of the container's memory: the rest is for the forks of AOF rewrites and syncs


# Servers, sentinels and the Job forming a Redis Cluster all run redis.sh (the ConfigMap <fleet>-redis-scripts)
# from the Redis image, with the password from the Secret <fleet>-redis-auth (created once by the operator)
# as a file. Servers keep their append-only file (and a cluster node its nodes.conf) on a claim of their own.
def quantity_bytes(quantity: int | str) -> int | None:
    """Bytes of a Kubernetes memory quantity ("256Mi", "1G", "1e9", 1024); None if it is not one."""
    text = str(quantity).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip
    for suffix, factor in units.items():
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)], factor
            break
    else:
        scale = 1
    try:
        return int(float(text) * scale)
    except ValueError:
        return None


def redis_auth_secret(fleet: Fleet, password: str) -> dict[str, Any]:
    """The managed Redis' password: created once (the operator never applies it again), owned by the fleet."""
    meta = object_meta(fleet, names(fleet.name)["redis_auth"], "redis")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {PASSWORD_KEY: password}}  # fmt: skip


def _env(**values: str | int) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def _exec_probe(command: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "exec": {"command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", command]},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _redis_volumes(fleet_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What every managed Redis container mounts: the script, the password, a private dir for configs."""
    n = names(fleet_name)
    volumes: list[dict[str, Any]] = [
        {"name": "scripts", "configMap": {"name": n["redis_scripts"], "defaultMode": 0o555}},
        {"name": "auth", "secret": {"secretName": n["redis_auth"], "defaultMode": 0o440}},
        {"name": "conf", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True},
        {"name": "auth", "mountPath": REDIS_SECRET_DIR, "readOnly": True},
        {"name": "conf", "mountPath": "/conf"},
    ]
    return volumes, mounts


def _redis_pod_template(
    fleet: Fleet, component: str, container: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A pod of the managed Redis: restricted, spread over nodes, with the script, password and conf dir,
    and what redis.pod (for sentinels redis.sentinelPod, if set) adds."""
    fleet_name = fleet.name
    redis = fleet.spec.redis
    tpl, where = redis.pod, "spec.redis.pod"
    if component == "redis-sentinel" and redis.sentinelPod is not None:
        tpl, where = redis.sentinelPod, "spec.redis.sentinelPod"
    volumes, mounts = _redis_volumes(fleet_name)
    container = {
        **container,
        "image": redis.image,
        "volumeMounts": [*mounts, *container.get("volumeMounts", [])],
        "securityContext": RESTRICTED_CONTAINER,
    }
    pod = {
        "automountServiceAccountToken": False,
        # the image's own redis user: its entrypoint is not used, redis.sh execs redis-server
        "securityContext": restricted_pod(REDIS_UID),
        "containers": [container],
        "volumes": [*volumes, *extra.pop("volumes", [])],
        **extra,
    }
    return pod_template(
        fleet_name,
        component,
        redis.scheduling,
        tpl,
        where,
        {"labels": labels(fleet_name, component)},
        pod,
        sidecars=component != "redis-setup",
    )


def _redis_statefulset(
    fleet: Fleet, name: str, component: str, replicas: int, template: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(fleet, name, component),
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": selector_labels(fleet.name, component)},
            "updateStrategy": {"type": "RollingUpdate"},  # one pod at a time, each waiting for readiness
            "template": template,
            **extra,
        },
    }


def _service(
    fleet: Fleet, name: str, component: str, ports: dict[str, int], *, headless: bool
) -> dict[str, Any]:
    """A Service of the managed Redis; headless ones give every pod a DNS name before it is ready."""
    spec: dict[str, Any] = {
        "selector": selector_labels(fleet.name, component),
        "ports": [{"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in ports.items()],
    }
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(fleet, name, component),
        "spec": spec,
    }


def _server_env(fleet: Fleet) -> list[dict[str, Any]]:
    """What redis.sh needs to start a server of this fleet (its own address comes from its pod name)."""
    fleet_name, ns, spec = fleet.name, fleet.namespace, fleet.spec
    redis = spec.redis
    values: dict[str, str | int] = {
        "REDIS_MODE": redis.mode,
        "REDIS_PASSWORD_FILE": f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
        "REDIS_APPENDFSYNC": redis.appendfsync,
    }
    maxmemory = quantity_bytes(redis.resources.memory)
    if maxmemory:
        values["REDIS_MAXMEMORY"] = int(maxmemory * MAXMEMORY_SHARE)
    if redis.mode != "standalone":
        redis_name = names(fleet_name)["redis"]
        values["REDIS_SELF"] = f"$(POD_NAME).{redis_name}.{ns}.svc:{REDIS_PORT}"
        values["REDIS_NODES"] = " ".join(redis_addresses(fleet_name, ns, spec))
    if redis.mode == "sentinel":
        values |= {
            "SENTINEL_NODES": " ".join(sentinel_addresses(fleet_name, ns, spec)),
            "SENTINEL_MASTER": fleet_name,
        }
    return [POD_NAME_ENV, *_env(**values)]


def redis_servers(fleet: Fleet) -> dict[str, Any]:
    """The StatefulSet of the managed Redis servers, in every mode."""
    redis = fleet.spec.redis
    name = names(fleet.name)["redis"]
    ports = [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}]
    if redis.mode == "cluster":
        ports.append({"name": "cluster-bus", "containerPort": REDIS_PORT + 10000, "protocol": "TCP"})
    ready = _exec_probe("ready", period=5, failures=2)
    if redis.mode == "cluster":  # its readiness also finds peers whose address changed (redis.sh heal)
        ready = _exec_probe("ready", period=10, failures=2, timeout=20)
    container: dict[str, Any] = {
        "name": "redis",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "server"],
        "env": _server_env(fleet),
        "ports": ports,
        "resources": redis.resources.requirements(),
        "startupProbe": _exec_probe("live", period=5, failures=120),  # a large append-only file loads first
        "livenessProbe": _exec_probe("live", period=10, failures=6),
        "readinessProbe": ready,
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    extra: dict[str, Any] = {}
    if redis.mode == "sentinel":
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "prestop"]}}
        }
        extra["terminationGracePeriodSeconds"] = 40  # the handover takes up to 20 s
    sts_extra: dict[str, Any] = {}
    if redis.mode != "standalone":  # a cluster forms only once every node runs; replicas need not wait
        sts_extra["podManagementPolicy"] = "Parallel"
    if redis.storage:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": redis.storage}},
        }
        if redis.storageClassName:
            claim["storageClassName"] = redis.storageClassName
        meta = {"name": "data", "labels": labels(fleet.name, "redis")}
        sts_extra["volumeClaimTemplates"] = [{"metadata": meta, "spec": claim}]
        # the data goes with the fleet (its StatefulSet is deleted with it), not with a pod or a scale-down
        sts_extra["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    else:
        extra["volumes"] = [{"name": "data", "emptyDir": {}}]
    template = _redis_pod_template(fleet, "redis", container, **extra)
    sts = _redis_statefulset(fleet, name, "redis", redis_pods(redis), template, **sts_extra)
    sts["metadata"]["labels"][L_REDIS_MODE] = redis.mode
    return sts


def check_redis_topology(spec: BrokerFleetSpec, existing: dict[str, Any] | None) -> None:
    """RenderError, applying nothing, when the managed Redis' StatefulSet holds data of another topology
    (one an earlier operator made, a single server without this label): the running fleet is left as it
    is rather than half turned into a topology its sessions are not in."""
    if existing is None or not spec.redis.managed:
        return
    found = (existing["metadata"].get("labels") or {}).get(L_REDIS_MODE)
    if found != spec.redis.mode:
        was = f"mode {found}" if found else "a single server (made before redis.mode existed)"
        raise RenderError(
            f"redis.mode: StatefulSet {existing['metadata']['name']} runs {was}, not mode {spec.redis.mode}: "
            "sessions are not moved between Redis topologies; the fleet keeps running as it is; delete the "
            "BrokerFleet and create it again for the new topology"
        )


def redis_sentinels(fleet: Fleet) -> dict[str, Any]:
    """The sentinels: pods of their own, so a failing Redis node never takes a sentinel's vote with it and
    their number (odd) is independent of the servers'."""
    fleet_name, ns, spec = fleet.name, fleet.namespace, fleet.spec
    name = names(fleet_name)["sentinel"]
    env = [
        POD_NAME_ENV,
        *_env(
            REDIS_PASSWORD_FILE=f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
            SENTINEL_SELF=f"$(POD_NAME).{name}.{ns}.svc:{SENTINEL_PORT}",
            SENTINEL_NODES=" ".join(sentinel_addresses(fleet_name, ns, spec)),
            SENTINEL_MASTER=fleet_name,
            REDIS_NODES=" ".join(redis_addresses(fleet_name, ns, spec)),
        ),
    ]
    container = {
        "name": "sentinel",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "sentinel"],
        "env": env,
        "ports": [{"name": "sentinel", "containerPort": SENTINEL_PORT, "protocol": "TCP"}],
        "resources": spec.redis.sentinelResources.requirements(),
        "livenessProbe": _exec_probe("sentinel-live", period=10, failures=6),
        "readinessProbe": _exec_probe("sentinel-ready", period=5, failures=2),
    }
    template = _redis_pod_template(fleet, "redis-sentinel", container)
    return _redis_statefulset(
        fleet, name, "redis-sentinel", spec.redis.sentinels, template, podManagementPolicy="Parallel"
    )


def cluster_create_job(fleet: Fleet) -> dict[str, Any]:
    """The Job that forms the Redis Cluster once all its nodes answer (redis.sh cluster-create: nothing to
    do when it is formed). Named after its template, so a changed one (a new image) is a new Job."""
    fleet_name, ns, spec = fleet.name, fleet.namespace, fleet.spec
    container = {
        "name": "create",
        "command": ["sh", f"{SCRIPTS_DIR}/{SCRIPT}", "cluster-create"],
        "env": _env(
            REDIS_PASSWORD_FILE=f"{REDIS_SECRET_DIR}/{PASSWORD_KEY}",
            REDIS_NODES=" ".join(redis_addresses(fleet_name, ns, spec)),
            CLUSTER_REPLICAS=spec.redis.replicas_per_primary,
        ),
        "resources": spec.redis.setupResources.requirements(),
    }
    template = _redis_pod_template(fleet, "redis-setup", container, restartPolicy="OnFailure")
    name = dns_name(fleet_name, "redis-cluster", short_digest(template)[:8])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(fleet, name, "redis-setup"),
        "spec": {"backoffLimit": 20, "template": template},
    }


#: the operator's and the pipeline's pods (the chart's labels), admitted from the operator's namespace
OPERATOR_PEERS = {"app.kubernetes.io/part-of": "fleetmq"}
OPERATOR_COMPONENTS = ["operator", "pipeline"]


def redis_network_policy(fleet: Fleet, operator_namespace: str | None) -> dict[str, Any]:
    """Ingress to the managed Redis' pods only from the fleet's brokers, its Redis pods (replication,
    sentinels, the cluster's setup Job), the operator and pipeline pods of the operator's namespace (when
    known: an operator outside the cluster is no pod) and spec.redis.networkPolicy.allowFrom."""
    spec = fleet.spec.redis
    store = {"key": L_COMPONENT, "operator": "In", "values": list(STORE_COMPONENTS)}
    servers = {"key": L_COMPONENT, "operator": "In", "values": ["redis", "redis-sentinel"]}
    instance = {L_NAME: "fleetmq", L_INSTANCE: fleet.name}
    peers: list[dict[str, Any]] = [
        {"podSelector": {"matchLabels": selector_labels(fleet.name)}},
        {"podSelector": {"matchLabels": instance, "matchExpressions": [store]}},
    ]
    if operator_namespace:
        peers.append({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
            "podSelector": {"matchLabels": OPERATOR_PEERS, "matchExpressions": [
                {"key": L_COMPONENT, "operator": "In", "values": OPERATOR_COMPONENTS}]},
        })  # fmt: skip
    peers += [
        p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in spec.networkPolicy.allowFrom
    ]
    ports = [REDIS_PORT] + ([REDIS_PORT + 10000] if spec.mode == "cluster" else [])
    ports += [SENTINEL_PORT] if spec.mode == "sentinel" else []
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(fleet, names(fleet.name)["redis"], "redis"),
        "spec": {
            "podSelector": {"matchLabels": instance, "matchExpressions": [servers]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": p} for p in ports]}],
        },
    }


def redis_manifests(fleet: Fleet, operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Everything of the managed Redis but its password Secret (see redis_auth_secret)."""
    n = names(fleet.name)
    mode = fleet.spec.redis.mode
    ports = {"redis": REDIS_PORT} | ({"cluster-bus": REDIS_PORT + 10000} if mode == "cluster" else {})
    scripts = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta(fleet, n["redis_scripts"], "redis"),
               "data": {SCRIPT: SCRIPT_TEXT}}  # fmt: skip
    out = [
        scripts,
        redis_servers(fleet),
        _service(fleet, n["redis"], "redis", ports, headless=mode != "standalone"),
        pdb(fleet, n["redis"], "redis"),
    ]
    if mode == "sentinel":
        out += [
            redis_sentinels(fleet),
            _service(fleet, n["sentinel"], "redis-sentinel", {"sentinel": SENTINEL_PORT}, headless=True),
            pdb(fleet, n["sentinel"], "redis-sentinel"),
        ]
    elif mode == "cluster":
        out.append(cluster_create_job(fleet))
    if fleet.spec.redis.networkPolicy.enabled:
        out.append(redis_network_policy(fleet, operator_namespace))
    return out


STORE_COMPONENTS = ("redis", "redis-sentinel", "redis-setup")


def store_workloads(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The managed Redis' StatefulSets and Job among rendered manifests."""
    return [
        m
        for m in manifests
        if m["kind"] in ("StatefulSet", "Job")
        and m["metadata"]["labels"].get(L_COMPONENT) in STORE_COMPONENTS
    ]
