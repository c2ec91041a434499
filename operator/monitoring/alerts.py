"""The chart's Prometheus alert rules, each with its runbook in docs/runbooks/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetmq.broker.eventschema import BRIDGE_LOST, DropReason

from .queries import fleet_ready, fleet_store, window_full_share

#: Each alert's runbook, docs/runbooks/<alert>.md in the repository (a test fails when one is missing). The
#: generated runbook_url is that path; the chart's prometheusRule.runbookBaseUrl replaces the base with
#: wherever a cluster's users can open them (a Git host, a wiki).
RUNBOOK_DIR = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
RUNBOOK_BASE_URL = "docs/runbooks"


def runbook_url(name: str, base: str = RUNBOOK_BASE_URL) -> str:
    return f"{base.rstrip('/')}/{name}.md"


def alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description, "runbook_url": runbook_url(name)},
    }


ZONE_KEYS = "namespace, job, zone"
POD_KEYS = "namespace, job, pod"
BRIDGE_KEYS = "namespace, job, bridge"


def alert_groups() -> dict[str, Any]:
    """The PrometheusRule `spec` (a Prometheus rule file): alerts on what breaks MQTT delivery."""
    where = "zone {{ $labels.zone }} of {{ $labels.namespace }}/{{ $labels.job }}"
    broker = [
        alert(
            "FleetmqQueueDrops",
            f'sum by ({ZONE_KEYS}) (rate(fleetmq_messages_dropped_total{{reason="{DropReason.QUEUE_FULL}"}}[5m])) > 0',
            "5m",
            "warning",
            "Message Queues are full and drop messages",
            f"{{{{ $value | humanize }}}} messages/s dropped (oldest first) in {where}: subscribers are slower "
            "than publishers or offline too long for max_mqueue_len.",
        ),
        alert(
            "FleetmqInflightWindowFull",
            f"{window_full_share('', ZONE_KEYS, '5m')} > 0.5",
            "10m",
            "warning",
            "Most QoS 1/2 deliveries wait for a full Inflight Window",
            f"{{{{ $value | humanizePercentage }}}} of QoS 1/2 deliveries in {where} found the client's "
            "Inflight Window full: subscribers ack too slowly for max_inflight (or Receive Maximum).",
        ),
        alert(
            "FleetmqKeepaliveTimeoutsSpiking",
            f"sum by ({ZONE_KEYS}) (increase(fleetmq_keepalive_timeouts_total[5m])) > 10 "
            f"and sum by ({ZONE_KEYS}) (rate(fleetmq_keepalive_timeouts_total[5m])) "
            f"> 3 * sum by ({ZONE_KEYS}) (rate(fleetmq_keepalive_timeouts_total[1h]))",
            "2m",
            "warning",
            "Keep-alive timeouts are spiking",
            f"{{{{ $value | humanize }}}} connections closed for keep-alive timeout in 5 minutes in {where}, "
            "over 3 times the hour's rate: clients are losing their network (or a load balancer drops idle "
            "connections).",
        ),
        alert(
            "FleetmqStoreErrors",
            f"sum by ({POD_KEYS}) (increase(fleetmq_store_errors_total[5m])) > 0",
            "1m",
            "critical",
            "A broker fails to reach its Redis session store",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} had {{ $value | humanize }} failed "
            "session-store operations in 5 minutes: publishes are not acked and new persistent sessions are "
            "refused while Redis fails.",
        ),
        alert(
            "FleetmqStoreNoReplicaInSync",
            f"min by ({POD_KEYS}) (fleetmq_store_replicas_in_sync) == 0 and on ({POD_KEYS}) "
            f'group by ({POD_KEYS}) (fleetmq_store_info{{topology!="standalone"}})',
            "2m",
            "critical",
            "The session store's primary has no replica in sync",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} sees no replica of its store's "
            "primary online and in sync: a failover now loses what only the primary holds, and with "
            "wait_replicas 1 publishes are not acked. Check the Redis pods (a replica down, or lagging).",
        ),
        alert(
            "FleetmqStoreFailoverStorm",
            "max by (namespace, job) (increase(fleetmq_store_failovers_total[15m])) > 3",
            "0m",
            "warning",
            "The session store fails over again and again",
            "Pods of {{ $labels.namespace }}/{{ $labels.job }} saw the store's primary move "
            "{{ $value | humanize }} times in 15 minutes: each failover refuses writes for seconds. Check the "
            "Redis pods' restarts, their nodes, and Sentinel's down-after setting.",
        ),
        alert(
            "FleetmqStoreCommitSlow",
            f"histogram_quantile(0.99, sum by ({POD_KEYS}, le) "
            f'(rate(fleetmq_store_op_duration_seconds_bucket{{op="commit"}}[5m]))) > 0.25',
            "10m",
            "warning",
            "Session-store commits are slow",
            "The 99th percentile of session-store commits on {{ $labels.pod }} of {{ $labels.namespace }}/"
            "{{ $labels.job }} is {{ $value | humanizeDuration }}: QoS 1/2 publishes are acked only after "
            "their commit, so publishers wait as long. Check the Redis' latency and load, its fsync "
            "(appendfsync), and waitReplicas.",
        ),
        alert(
            "FleetmqEventLogDropping",
            f'sum by ({POD_KEYS}) (increase(fleetmq_event_log_records_total{{outcome="dropped"}}[10m])) > 0',
            "15m",
            "warning",
            "The event log keeps dropping records",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} dropped {{ $value | humanize }} "
            "event-log records in 10 minutes, again and again for 15: the pipeline's reports undercount. "
            "Its buffer overflows or Redis refuses the writes (fleetmq_event_log_errors_total).",
        ),
        alert(
            "FleetmqTakeoverStorm",
            f'sum by ({ZONE_KEYS}) (increase(fleetmq_session_events_total{{event="takenover"}}[5m])) > 50 '
            f'and sum by ({ZONE_KEYS}) (rate(fleetmq_session_events_total{{event="takenover"}}[5m])) '
            f'> 0.5 * sum by ({ZONE_KEYS}) (rate(fleetmq_session_events_total{{event=~"created|resumed"}}[5m]))',
            "5m",
            "warning",
            "Sessions are taken over again and again",
            f"{{{{ $value | humanize }}}} takeovers in 5 minutes in {where}, over half of all connects: clients "
            "share a client id or reconnect in a loop.",
        ),
        alert(
            "FleetmqZoneConfigDiverged",
            f"count by ({ZONE_KEYS}) (group by ({ZONE_KEYS}, config_hash) (fleetmq_zone_config_info)) > 1",
            "15m",
            "warning",
            "Pods of a fleet run different configs of a zone",
            f"{{{{ $value }}}} different configs of {where} are applied across its pods: a pod refused or "
            "missed a config change (see fleetmq_config_reload_errors_total and the MqttZone status).",
        ),
        alert(
            "FleetmqConfigReloadFailed",
            f"sum by ({POD_KEYS}) (increase(fleetmq_config_reload_errors_total[10m])) > 0",
            "0m",
            "warning",
            "A broker refused a config reload",
            "{{ $labels.pod }} of {{ $labels.namespace }}/{{ $labels.job }} refused its changed config file "
            "and keeps running the previous one: see its log for the field path.",
        ),
    ]
    lost = "|".join(sorted(BRIDGE_LOST))
    bridge_where = "bridge {{ $labels.bridge }} of {{ $labels.namespace }}/{{ $labels.job }}"
    bridges = [
        alert(
            "FleetmqBridgeDown",
            f"max by ({BRIDGE_KEYS}) (fleetmq_bridge_connected) == 0",
            "5m",
            "critical",
            "A bridge is not connected to its remote broker",
            f"No pod of the fleet has {bridge_where} connected for 5 minutes: what it forwards queues in "
            "Redis (up to queue.maxLength). Its MqttBridge status says why (Connected condition, the "
            "leader's last error).",
        ),
        alert(
            "FleetmqBridgeQueueFilling",
            f"max by ({BRIDGE_KEYS}) (fleetmq_bridge_queue_messages) "
            f"> 0.8 * max by ({BRIDGE_KEYS}) (fleetmq_bridge_queue_limit_messages)",
            "5m",
            "warning",
            "A bridge's queue is over 80% full",
            f"{{{{ $value | humanize }}}} messages wait for the remote of {bridge_where}: when its queue "
            "is full, its overflow policy drops messages (counted as queue_full).",
        ),
        alert(
            "FleetmqBridgeDrops",
            f'sum by ({BRIDGE_KEYS}, reason) (increase(fleetmq_bridge_messages_dropped_total{{reason=~"{lost}"}}[5m])) > 0',
            "0m",
            "warning",
            "A bridge drops messages",
            f"{{{{ $value | humanize }}}} messages of {bridge_where} were not passed on in 5 minutes "
            "({{ $labels.reason }}); loop and excluded drops are by design and not counted here.",
        ),
    ]
    fleet = [
        alert(
            "FleetmqBrokerDown",
            "up == 0 and on (namespace, job) group by (namespace, job) (last_over_time(fleetmq_zone_config_info[1h]))",
            "5m",
            "critical",
            "A broker pod of a fleet is down",
            "{{ $labels.pod }} ({{ $labels.instance }}) of {{ $labels.namespace }}/{{ $labels.job }} does not "
            "answer /metrics: the fleet is not Ready; its clients reconnect to the other pods and resume their "
            "sessions from Redis.",
        ),
        alert(
            "FleetmqFleetNotReady",
            # the fleet's namespace as `namespace`, as on the broker alerts (the operator's own is dropped)
            f'label_replace({fleet_ready()}, "namespace", "$1", "fleet_namespace", "(.*)") == 0',
            "10m",
            "warning",
            "A BrokerFleet is not Ready",
            "BrokerFleet {{ $labels.fleet }} in {{ $labels.fleet_namespace }} has not been Ready for 10 "
            "minutes: not all of its pods are ready, or not all run the rendered config. Its Progressing and "
            "Degraded conditions (kubectl describe brokerfleet) say why.",
        ),
        alert(
            "FleetmqRolloutStopped",
            "label_replace(max by (fleet_namespace, fleet, reason) (fleetmq_operator_fleet_rollout_stopped), "
            '"namespace", "$1", "fleet_namespace", "(.*)") == 1',
            "1m",
            "warning",
            "A BrokerFleet's rollout stopped on the pod it added",
            "The rollout of BrokerFleet {{ $labels.fleet }} in {{ $labels.fleet_namespace }} stopped: the pod it "
            "added did not become Ready ({{ $labels.reason }}). No old pod was replaced and they keep serving; "
            "fix the template (often the image) or set it back.",
        ),
        alert(
            "FleetmqStoreNotReady",
            f"{fleet_store('ready')} == 0 unless on (fleet_namespace, fleet) "
            f"({fleet_store('pods', 'ready')} < {fleet_store('pods', 'wanted')})",
            "5m",
            "critical",
            "A BrokerFleet's session store is not ready",
            "The StoreReady condition of BrokerFleet {{ $labels.fleet }} in {{ $labels.fleet_namespace }} has "
            "been False for 5 minutes: its Redis does not answer, a Redis Cluster is not formed, or acks wait "
            "for replicas not in sync. Brokers withhold acks and refuse persistent sessions while they cannot "
            "write; the condition's reason and message say which.",
        ),
        alert(
            "FleetmqStoreRedisPodsMissing",
            f"{fleet_store('pods', 'ready')} < {fleet_store('pods', 'wanted')}",
            "10m",
            "warning",
            "The managed Redis of a BrokerFleet misses pods",
            "{{ $value }} of the managed Redis' pods (servers and sentinels) of BrokerFleet {{ $labels.fleet }} "
            "in {{ $labels.fleet_namespace }} are ready, fewer than it wants, for 10 minutes: the store has "
            "less redundancy (a replica or sentinel down), or none (a shard's primary down).",
        ),
        alert(
            "FleetmqOperatorReconcileErrors",
            'sum by (namespace, pod) (increase(fleetmq_operator_reconciles_total{result="error"}[10m])) > 0',
            "15m",
            "warning",
            "The fleetmq operator fails to reconcile fleets",
            "{{ $labels.namespace }}/{{ $labels.pod }} failed {{ $value | humanize }} BrokerFleet "
            "reconciliations in 10 minutes: fleets do not get their changes (see the operator log and the "
            "BrokerFleet Degraded condition).",
        ),
    ]
    return {
        "groups": [
            {"name": "fleetmq.broker", "rules": broker},
            {"name": "fleetmq.bridges", "rules": bridges},
            {"name": "fleetmq.fleet", "rules": fleet},
        ]
    }
