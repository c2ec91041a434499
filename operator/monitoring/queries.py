"""The PromQL the dashboards and the alerts share: the template variables' selectors, the fleet-level
series of the operator, the drop reasons that lose a message."""

from __future__ import annotations

from fleetmq.broker.eventschema import DropReason

#: the drop reasons that lose a message the broker had accepted (the loss panels and alerts)
LOST = [r.value for r in DropReason if r.lost]
RATE = "$__rate_interval"
# Label selectors shared by every broker panel: the template variables, then the zone where samples have one.
FLEET = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
ZONE = f'{FLEET}, zone=~"$zone"'
OPERATOR = 'namespace=~"$namespace", pod=~"$pod"'


def fleet_ready(selector: str = "") -> str:
    """1/0 per BrokerFleet, one value even while two operator pods report it (a peering handover);
    `selector` picks operator pods (the dashboard's variables; none for the alert)."""
    return f"max by (fleet_namespace, fleet) (fleetmq_operator_fleet_ready{'{' + selector + '}' if selector else ''})"


def fleet_store(what: str, state: str = "") -> str:
    """fleetmq_operator_fleet_store_<what> per BrokerFleet (one value across an operator handover), with the
    fleet's namespace as `namespace`, as on the broker alerts."""
    sel = f'{{state="{state}"}}' if state else ""
    return (
        f"label_replace(max by (fleet_namespace, fleet) (fleetmq_operator_fleet_store_{what}{sel}), "
        '"namespace", "$1", "fleet_namespace", "(.*)")'
    )


def rate(metric: str, selector: str = ZONE, by: str = "") -> str:
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{{{selector}}}[{RATE}]))"


def window_full_share(selector: str, by: str, window: str) -> str:
    """Inflight-full events / (those + QoS 1/2 deliveries): 0..1, and NaN (no series) without QoS 1/2 traffic."""
    full = f"sum by ({by}) (rate(fleetmq_inflight_full_total{'{' + selector + '}' if selector else ''}[{window}]))"
    qos12 = f'{selector}, qos!="0"' if selector else 'qos!="0"'
    sent = f"sum by ({by}) (rate(fleetmq_messages_delivered_total{{{qos12}}}[{window}]))"
    return f"{full} / ({full} + {sent})"
