"""The fleet's Services: the headless one (pod DNS names, scraping), one per listener for clients, and
the ServiceMonitor."""

from __future__ import annotations

from typing import Any

from ..crds import ListenerSpec, ServiceSpec
from ..rollout import L_SERVING
from .common import Fleet, dns_name, names, object_meta, selector_labels
from .select import Zone

L_ZONE = "fleetmq.io/zone"


def headless_service(fleet: Fleet) -> dict[str, Any]:
    name, spec = fleet.name, fleet.spec
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(fleet, names(name)["headless"], **{"fleetmq.io/service": "headless"}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [
                {"name": "metrics", "port": spec.metrics.port, "targetPort": "metrics", "protocol": "TCP"}
            ],
        },
    }


def api_service(fleet: Fleet) -> dict[str, Any] | None:
    """The management API and console (spec.api): any broker pod answers for the whole fleet."""
    api = fleet.spec.api
    if not api.enabled:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(fleet, names(fleet.name)["api"], **{"fleetmq.io/service": "api"}),
        "spec": {
            "type": api.serviceType,
            "selector": selector_labels(fleet.name),
            "ports": [{"name": "http", "port": api.port, "targetPort": "api", "protocol": "TCP"}],
        },
    }


def client_services(fleet: Fleet, zones: list[Zone]) -> list[dict[str, Any]]:
    """One Service per listener, so each can have its own type, address and DNS name."""
    name = fleet.name
    out = []
    for zone in zones:
        for lst in zone.spec.listeners:
            meta = object_meta(fleet, dns_name(name, zone.name, lst.name), **{L_ZONE: zone.name})
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": meta,
                    **_listener_service(name, fleet.spec.service, lst, meta),
                }
            )
    return out


def _listener_service(
    fleet_name: str, defaults: ServiceSpec, lst: ListenerSpec, meta: dict[str, Any]
) -> dict[str, Any]:
    """A listener's Service spec (and its annotations, into `meta`): the fleet's service settings, the
    listener's own over them. Only fields set are applied, so what the cluster fills in (a node port it
    picked, a cluster IP) stays the cluster's."""
    own = lst.service
    annotations = {**defaults.annotations, **((own.annotations if own else None) or {})}
    if annotations:
        meta["annotations"] = annotations
    port: dict[str, Any] = {"name": lst.name, "port": lst.port, "targetPort": lst.port, "protocol": "TCP"}
    svc: dict[str, Any] = {
        "type": (own.type if own else None) or defaults.type,
        # (only serving pods: rollout.py steers reconnecting clients to updated pods)
        "selector": {**selector_labels(fleet_name), L_SERVING: "true"},
        "ports": [port],
    }
    if own is not None:
        if own.nodePort is not None:
            port["nodePort"] = own.nodePort
        if own.loadBalancerIP is not None:
            svc["loadBalancerIP"] = own.loadBalancerIP
        if own.loadBalancerSourceRanges:
            svc["loadBalancerSourceRanges"] = list(own.loadBalancerSourceRanges)
        if own.externalTrafficPolicy is not None:
            svc["externalTrafficPolicy"] = own.externalTrafficPolicy
    return {"spec": svc}


def servicemonitor(fleet: Fleet) -> dict[str, Any]:
    """The brokers' scrape config for the Prometheus Operator: the user's labels let a Prometheus'
    serviceMonitorSelector (kube-prometheus-stack: release=<name>) pick it up, and the namespaceSelector
    names the fleet's namespace so no Prometheus setting widens it to Services of other namespaces."""
    name = fleet.name
    metrics = fleet.spec.metrics
    meta = object_meta(fleet, names(name)["monitor"])
    meta["labels"] = {**metrics.serviceMonitorLabels, **meta["labels"]}  # (the model refuses its own keys)
    endpoint = {"port": "metrics", "path": "/metrics", "interval": metrics.interval}
    if metrics.scrapeTimeout:
        endpoint["scrapeTimeout"] = metrics.scrapeTimeout
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {**selector_labels(name), "fleetmq.io/service": "headless"}},
            "namespaceSelector": {"matchNames": [meta["namespace"]]},
            "endpoints": [endpoint],
        },
    }


def broker_network_policy(fleet: Fleet, zones: list[Zone]) -> dict[str, Any] | None:
    """Once a listener says who may connect (allowFrom), a NetworkPolicy on the broker pods: that port only
    from those peers, every other listener and the metrics port from anywhere (a policy selecting a pod
    refuses what it does not admit). None while no listener restricts anything."""
    listeners = [lst for zone in zones for lst in zone.spec.listeners]
    if not any(lst.allowFrom is not None for lst in listeners):
        return None
    ingress: list[dict[str, Any]] = []
    open_ports = [fleet.spec.metrics.port]
    for lst in listeners:
        if lst.allowFrom is None:
            open_ports.append(lst.port)
        else:
            peers = [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in lst.allowFrom]
            ingress.append({"from": peers, "ports": [{"protocol": "TCP", "port": lst.port}]})
    ingress.append({"ports": [{"protocol": "TCP", "port": p} for p in sorted(set(open_ports))]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(fleet, fleet.name),
        "spec": {"podSelector": {"matchLabels": selector_labels(fleet.name)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }  # fmt: skip
