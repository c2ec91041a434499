"""The chart's dashboards: fleet overview, message flow, windows and queues, store, operator."""

from __future__ import annotations

from fleetmq.broker.eventschema import DropReason

from .panels import (
    Dashboard,
    Target,
    broker_variables,
    heatmap,
    operator_variables,
    quantiles,
    stat,
    timeseries,
)
from .queries import FLEET, LOST, OPERATOR, RATE, ZONE, fleet_ready, rate, window_full_share


def fleet_overview() -> Dashboard:
    d = Dashboard(
        "fleetmq-overview",
        "fleetmq / Fleet overview",
        "Connections, sessions and their lifecycle across a fleet of fleetmq brokers.",
        broker_variables(),
    )
    d.row("Now")
    # the scrape jobs of fleets: those whose pods exported broker metrics within the hour, even if none does now
    fleet_jobs = f"group by (namespace, job) (last_over_time(fleetmq_zone_config_info{{{ZONE}}}[1h]))"
    d.add(
        stat(
            "Broker pods up",
            "Broker pods whose /metrics answered Prometheus's last scrape.",
            Target(f"sum(up{{{FLEET}}} and on (namespace, job) {fleet_jobs})"),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Broker pods down",
            "Pods of a fleet whose /metrics did not answer the last scrape: crashed, hung or not scheduled "
            "(alert FleetmqBrokerDown).",
            Target(f"count(up{{{FLEET}}} == 0 and on (namespace, job) {fleet_jobs}) or on () vector(0)"),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat("Connections", "Open MQTT connections.", Target(f"sum(fleetmq_connections{{{ZONE}}})")), w=4, h=4
    )
    d.add(
        stat(
            "Sessions online",
            "Sessions with a connected client.",
            Target(f'sum(fleetmq_sessions{{{ZONE}, state="online"}})'),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Sessions offline",
            "Persistent sessions kept for a disconnected client (they queue messages until they expire).",
            Target(f'sum(fleetmq_sessions{{{ZONE}, state="offline"}})'),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Messages in",
            "PUBLISH packets received from clients per second.",
            Target(rate("fleetmq_messages_received_total")),
            "ops",
        ),
        w=4,
        h=4,
    )
    d.row("Connections and sessions")
    d.add(
        timeseries(
            "Connections by zone",
            "Open MQTT connections per zone (a zone is a set of listeners sharing session settings).",
            [Target(f"sum by (zone) (fleetmq_connections{{{ZONE}}})", "{{zone}}")],
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Connections by pod",
            "Open MQTT connections per broker pod: an uneven spread points at the load balancer.",
            [Target(f"sum by (pod) (fleetmq_connections{{{ZONE}}})", "{{pod}}")],
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Sessions by zone and state",
            "Online sessions have a connection; offline ones are persistent sessions waiting for their "
            "client (in Redis, so any pod can resume them).",
            [Target(f"sum by (zone, state) (fleetmq_sessions{{{ZONE}}})", "{{zone}} {{state}}")],
        )
    )
    d.add(
        timeseries(
            "Session events",
            "Sessions created, resumed, taken over (the client id connected again, here or on another "
            "pod), discarded (Clean Start) and expired, per second.",
            [Target(rate("fleetmq_session_events_total", by="event"), "{{event}}")],
            "ops",
        )
    )
    d.row("Takeovers and disconnects")
    d.add(
        timeseries(
            "Takeovers by zone",
            "Connections that took over a live session. A steady high rate means clients share a client id "
            "or reconnect before the old connection died (alert FleetmqTakeoverStorm).",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_session_events_total{{{ZONE}, event="takenover"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        quantiles(
            "Session resume latency",
            "CONNECT to session resumed (including a takeover from another pod through Redis).",
            "fleetmq_takeover_duration_seconds_bucket",
            FLEET,
        )
    )
    d.add(
        timeseries(
            "Disconnects by reason",
            "Closed connections per second by reason: client DISCONNECT (normal), socket closed, "
            "keep-alive timeout, takeover, protocol errors, server shutdown...",
            [Target(rate("fleetmq_disconnects_total", by="reason"), "{{reason}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Keep-alive timeouts by zone",
            "Connections closed because nothing arrived within keep alive x backoff x 2: clients that lost "
            "their network (alert FleetmqKeepaliveTimeoutsSpiking).",
            [Target(rate("fleetmq_keepalive_timeouts_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    d.row("Configuration")
    d.add(
        timeseries(
            "Pods per applied zone config",
            "Broker pods running each config hash of a zone. Two hashes for one zone for long means a pod "
            "did not apply a change (alert FleetmqZoneConfigDiverged).",
            [
                Target(
                    "count by (zone, config_hash) (group by (namespace, job, pod, zone, config_hash) "
                    f"(fleetmq_zone_config_info{{{ZONE}}}))",
                    "{{zone}} {{config_hash}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Config reload errors",
            "Config files (or listeners) refused at a live reload, per pod; the pod keeps its previous config.",
            [Target(rate("fleetmq_config_reload_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    return d


def message_flow() -> Dashboard:
    d = Dashboard(
        "fleetmq-messages",
        "fleetmq / Message flow",
        "Messages in, delivered and acknowledged by QoS, delivery latency, drops and retransmissions.",
        broker_variables(),
    )
    d.row("Throughput")
    for metric, what, why, selector in (
        ("received", "Received", "PUBLISH packets received from clients", ZONE),
        ("delivered", "Delivered", "PUBLISH packets written to subscribers (one per subscription)", ZONE),
        ("acked", "Acknowledged", "QoS 1/2 deliveries acknowledged (PUBACK, PUBCOMP)", f'{ZONE}, qos!="0"'),
    ):
        d.add(
            timeseries(
                f"{what} by QoS",
                f"{why}, per second, by QoS.",
                [Target(rate(f"fleetmq_messages_{metric}_total", selector, "qos"), "QoS {{qos}}")],
                "ops",
                stack=True,
            ),
            w=8,
        )
    d.add(
        timeseries(
            "Received and delivered by zone",
            "Messages in and out per zone. Delivered counts each subscriber, so fan-out shows as the gap.",
            [
                Target(rate("fleetmq_messages_received_total", by="zone"), "{{zone}} in"),
                Target(rate("fleetmq_messages_delivered_total", by="zone"), "{{zone}} delivered"),
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Unacknowledged QoS 1/2 deliveries",
            "QoS 1/2 deliveries per second minus acknowledgements: positive while subscribers fall behind.",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_messages_delivered_total{{{ZONE}, qos!="0"}}[{RATE}])) '
                    f'- sum by (zone) (rate(fleetmq_messages_acked_total{{{ZONE}, qos!="0"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
            minimum=None,
        )
    )
    d.row("Latency")
    d.add(
        quantiles(
            "Delivery latency",
            "Publish to the subscriber's acknowledgement of QoS 1/2 deliveries (PUBACK / PUBCOMP), all zones; "
            "it includes time spent queued behind a full Inflight Window.",
            "fleetmq_delivery_latency_seconds_bucket",
            ZONE,
        )
    )
    d.add(
        quantiles(
            "Delivery latency by zone",
            "The same quantiles per zone: a slow zone is usually slow subscribers or a full window.",
            "fleetmq_delivery_latency_seconds_bucket",
            ZONE,
            by="zone",
        )
    )
    d.add(
        heatmap(
            "Delivery latency distribution",
            "Deliveries per latency bucket over time; a second band means a group of slow subscribers.",
            f"rate(fleetmq_delivery_latency_seconds_bucket{{{ZONE}}}[{RATE}])",
        ),
        w=24,
    )
    d.row("Losses and resends")
    d.add(
        timeseries(
            "Drops by reason",
            "Messages dropped per second: " + "; ".join(f"{r} ({r.description})" for r in DropReason) + ".",
            [Target(rate("fleetmq_messages_dropped_total", by="reason"), "{{reason}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        timeseries(
            "Drops by zone",
            f"Drops that lose a message the broker had accepted ({', '.join(LOST)}), per zone; refused "
            "publishes and messages nobody (allowed to read them) subscribed to are not counted here.",
            [
                Target(
                    f"sum by (zone) (rate(fleetmq_messages_dropped_total{{{ZONE}, "
                    f'reason=~"{"|".join(LOST)}"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Retransmit ratio",
            "PUBLISH/PUBREL resent (after retry_interval for MQTT 3.1.1 sessions, or on reconnect) per QoS 1/2 "
            "delivery, per zone. Above a few percent subscribers do not ack in time.",
            [
                Target(
                    f"sum by (zone) (rate(fleetmq_messages_retransmitted_total{{{ZONE}}}[{RATE}])) "
                    f'/ sum by (zone) (rate(fleetmq_messages_delivered_total{{{ZONE}, qos!="0"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "percentunit",
        )
    )
    d.add(
        timeseries(
            "Retransmissions",
            "PUBLISH (DUP) and PUBREL packets resent per second, per zone.",
            [Target(rate("fleetmq_messages_retransmitted_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    _bridges_row(d)
    return d


def _bridges_row(d: Dashboard) -> None:
    """Bridges to remote brokers: each pod reports its own view, so the leader's is the max (connected,
    queue) and counters sum over pods."""
    d.row("Bridges")
    d.add(
        timeseries(
            "Bridges connected",
            "1 while a pod of the fleet has the bridge connected to its remote (alert FleetmqBridgeDown).",
            [Target(f"max by (bridge) (fleetmq_bridge_connected{{{FLEET}}})", "{{bridge}}")],
            "short",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge queues",
            "Messages waiting for the remote, against each bridge's queue.maxLength (alert "
            "FleetmqBridgeQueueFilling at 80%).",
            [
                Target(f"max by (bridge) (fleetmq_bridge_queue_messages{{{FLEET}}})", "{{bridge}}"),
                Target(
                    f"max by (bridge) (fleetmq_bridge_queue_limit_messages{{{FLEET}}})", "{{bridge}} limit"
                ),
            ],
            "short",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge traffic",
            "Messages the remotes acknowledged (forwarded) and messages from them published here (received).",
            [
                Target(
                    rate("fleetmq_bridge_messages_forwarded_total", FLEET, "bridge"), "{{bridge}} forwarded"
                ),
                Target(
                    rate("fleetmq_bridge_messages_received_total", FLEET, "bridge"), "{{bridge}} received"
                ),
            ],
            "ops",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Bridge drops",
            "Messages a bridge did not pass on, by reason (loop and excluded are by design; alert "
            "FleetmqBridgeDrops on the others).",
            [
                Target(
                    rate("fleetmq_bridge_messages_dropped_total", FLEET, "bridge, reason"),
                    "{{bridge}} {{reason}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Bridge reconnects",
            "Connections to the remote that ended or failed, by reason, and leader changes (a pod taking the "
            "bridge over).",
            [
                Target(
                    rate("fleetmq_bridge_reconnects_total", FLEET, "bridge, reason"), "{{bridge}} {{reason}}"
                ),
                Target(
                    rate("fleetmq_bridge_leader_changes_total", FLEET, "bridge"), "{{bridge}} leader change"
                ),
            ],
            "ops",
        )
    )
    d.add(
        quantiles(
            "Bridge forward latency",
            "Local publish to the remote's acknowledgement (PUBACK / PUBCOMP) of QoS 1/2 messages a bridge "
            "forwarded: time queued while the remote was away included.",
            "fleetmq_bridge_forward_latency_seconds_bucket",
            FLEET,
            by="bridge",
        )
    )


def windows_and_queues() -> Dashboard:
    d = Dashboard(
        "fleetmq-windows",
        "fleetmq / Windows and queues",
        "Inflight Windows, Message Queues and incoming QoS 2 state (EMQX semantics, per zone).",
        broker_variables(),
    )
    d.row("Inflight Window")
    d.add(
        timeseries(
            "Inflight messages by zone",
            "Unacknowledged QoS 1/2 deliveries in Inflight Windows (at most max_inflight per client).",
            [Target(f"sum by (zone) (fleetmq_inflight_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Inflight per online session",
            "Average Inflight Window fill per connected session; compare with the zone's max_inflight.",
            [
                Target(
                    f"sum by (zone) (fleetmq_inflight_messages{{{ZONE}}}) "
                    f'/ sum by (zone) (fleetmq_sessions{{{ZONE}, state="online"}})',
                    "{{zone}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Inflight Window utilisation",
            "Average Inflight Window fill of a connected session as a share of the zone's max_inflight, per "
            "fleet and zone (zones without a limit, max_inflight 0, are left out). Near 1: windows are full "
            "and further deliveries queue. MQTT 5 clients may allow fewer (Receive Maximum).",
            [_utilisation("fleetmq_inflight_messages", 'state="online"', "fleetmq_zone_max_inflight")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Inflight Window full (share of QoS 1/2 deliveries)",
            "Of the QoS 1/2 deliveries, the share that found the client's window full and had to queue: "
            "near 1 means subscribers ack slower than messages arrive (alert FleetmqInflightWindowFull).",
            [Target(window_full_share(ZONE, "zone", RATE), "{{zone}}")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Inflight Window full rate",
            "Deliveries per second that went to the Message Queue because the Inflight Window was full.",
            [Target(rate("fleetmq_inflight_full_total", by="zone"), "{{zone}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Zone limits",
            "Each zone's max_inflight and max_mqueue_len as its pods run it now (0 = no limit); a live zone "
            "change shows here once the pods applied it.",
            [
                Target(
                    f"max by (namespace, job, zone) (fleetmq_zone_max_inflight{{{ZONE}}})",
                    "{{job}} {{zone}} max_inflight",
                ),
                Target(
                    f"max by (namespace, job, zone) (fleetmq_zone_max_mqueue_len{{{ZONE}}})",
                    "{{job}} {{zone}} max_mqueue_len",
                ),
            ],
        )
    )
    d.row("Message Queue")
    d.add(
        timeseries(
            "Queued messages by zone",
            "Deliveries waiting in Message Queues (online sessions behind a full window, and offline "
            "persistent sessions), at most max_mqueue_len per session.",
            [Target(f"sum by (zone) (fleetmq_mqueue_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Queued messages by pod",
            "Message Queue depth per pod (offline sessions count on the pod that holds them in memory).",
            [Target(f"sum by (pod) (fleetmq_mqueue_messages{{{ZONE}}})", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Message Queue fill",
            "Average Message Queue depth of a session (online and offline) as a share of the zone's "
            "max_mqueue_len, per fleet and zone (zones without a limit are left out). Sessions at 1 drop "
            "their oldest message for each new one (Queue-full drops).",
            [_utilisation("fleetmq_mqueue_messages", "", "fleetmq_zone_max_mqueue_len")],
            "percentunit",
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Queue-full drops by zone",
            "Messages dropped because a Message Queue was full (the oldest goes; alert FleetmqQueueDrops).",
            [
                Target(
                    f'sum by (zone) (rate(fleetmq_messages_dropped_total{{{ZONE}, reason="{DropReason.QUEUE_FULL}"}}[{RATE}]))',
                    "{{zone}}",
                )
            ],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Offline sessions by zone",
            "Persistent sessions without a client: each one queues what its subscriptions match.",
            [Target(f'sum by (zone) (fleetmq_sessions{{{ZONE}, state="offline"}})', "{{zone}}")],
        )
    )
    d.row("Incoming QoS 2")
    d.add(
        timeseries(
            "Awaiting PUBREL by zone",
            "Incoming QoS 2 messages received (PUBREC sent) whose PUBREL has not arrived yet, at most "
            "max_awaiting_rel per client.",
            [Target(f"sum by (zone) (fleetmq_awaiting_rel_messages{{{ZONE}}})", "{{zone}}")],
        )
    )
    d.add(
        timeseries(
            "Awaiting PUBREL timeouts and refusals",
            "Incoming QoS 2 entries discarded after await_rel_timeout, and QoS 2 publishes refused because "
            "max_awaiting_rel was reached.",
            [
                Target(
                    f"sum by (zone, reason) (rate(fleetmq_messages_dropped_total{{{ZONE}, "
                    f'reason=~"{DropReason.AWAITING_REL_TIMEOUT}|{DropReason.AWAITING_REL_FULL}"}}[{RATE}]))',
                    "{{zone}} {{reason}}",
                )
            ],
            "ops",
        )
    )
    return d


def _utilisation(depth: str, sessions: str, limit: str) -> Target:
    """Per fleet and zone: `depth` per session (of the `sessions` state) / the zone's `limit`, where both are
    non-zero. The limit is the largest any pod runs (pods differ only while a zone change rolls out)."""
    keys = "namespace, job, zone"
    state = f"{ZONE}, {sessions}" if sessions else ZONE
    return Target(
        f"sum by ({keys}) ({depth}{{{ZONE}}}) / (sum by ({keys}) (fleetmq_sessions{{{state}}}) > 0) "
        f"/ (max by ({keys}) ({limit}{{{ZONE}}}) > 0)",
        "{{job}} {{zone}}",
    )


def store() -> Dashboard:
    d = Dashboard(
        "fleetmq-store",
        "fleetmq / Redis session store",
        "The shared Redis every broker keeps its sessions in: latency, round trips, errors, reconnects.",
        broker_variables(),
    )
    d.row("Latency")
    d.add(
        quantiles(
            "Store operation latency",
            "Time of one session-store operation (a group commit carries every write of an event-loop turn). "
            "Publisher acks (PUBACK/PUBREC) wait for it.",
            "fleetmq_store_op_duration_seconds_bucket",
            FLEET,
            by="op",
        )
    )
    d.add(
        timeseries(
            "Store operations",
            "Session-store operations per second, by operation.",
            [Target(rate("fleetmq_store_op_duration_seconds_count", FLEET, "op"), "{{op}}")],
            "ops",
        )
    )
    d.add(
        heatmap(
            "Store operation latency distribution",
            "Store operations per latency bucket over time.",
            f"rate(fleetmq_store_op_duration_seconds_bucket{{{FLEET}}}[{RATE}])",
        ),
        w=24,
    )
    d.row("Round trips")
    d.add(
        timeseries(
            "Round trips by pod",
            "Round trips to Redis per second (a group commit or a pipelined batch is one).",
            [Target(rate("fleetmq_store_round_trips_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Round trips per received message",
            "Group-commit efficiency: below 1 means several publishes share one Redis round trip.",
            [
                Target(
                    f"sum by (pod) (rate(fleetmq_store_round_trips_total{{{FLEET}}}[{RATE}])) "
                    f"/ sum by (pod) (rate(fleetmq_messages_received_total{{{ZONE}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
        )
    )
    d.row("Failures")
    d.add(
        timeseries(
            "Store errors",
            "Failed session-store operations per pod. Publishes are not acked while Redis fails, and new "
            "persistent sessions are refused (alert FleetmqStoreErrors).",
            [Target(rate("fleetmq_store_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Store reconnects",
            "Times a pod resynchronised with Redis after losing it, in each interval.",
            [
                Target(
                    f"sum by (pod) (increase(fleetmq_store_reconnects_total{{{FLEET}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
        )
    )
    d.row("Topology: primaries, replicas, failovers")
    d.add(
        timeseries(
            "Primaries written to",
            "The store's primaries (legend: topology and address) and how many pods write to each. A Sentinel "
            "failover or a cluster shard's promoted replica shows as a new primary.",
            [
                Target(
                    f"count by (topology, primary) (fleetmq_store_info{{{FLEET}}})",
                    "{{topology}} {{primary}}",
                )
            ],
        )
    )
    d.add(
        timeseries(
            "Replicas in sync",
            "Replicas of the store's primary online and at most 1 s behind, as each pod last saw them (the "
            "fewest over a cluster's shards). 0 on a replicated store: a failover now loses the writes only "
            "the primary has, and with wait_replicas 1 writes are refused (alert FleetmqStoreNoReplicaInSync).",
            [Target(f"min by (pod) (fleetmq_store_replicas_in_sync{{{FLEET}}})", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Failovers seen",
            "Times each pod found the store's primary moved (Sentinel) or a shard's slots served by another "
            "primary (Cluster), in each interval (alert FleetmqStoreFailoverStorm).",
            [Target(f"sum by (pod) (increase(fleetmq_store_failovers_total{{{FLEET}}}[{RATE}]))", "{{pod}}")],
        )
    )
    d.add(
        timeseries(
            "Retries and round trips by shard",
            "Store operations run again on a fresh connection (retries, per pod), and round trips per second "
            "to each shard: on a Redis Cluster the shards should carry about equal shares.",
            [
                Target(rate("fleetmq_store_retries_total", FLEET, "pod"), "retries {{pod}}"),
                Target(rate("fleetmq_store_round_trips_total", FLEET, "shard"), "{{shard}}"),
            ],
            "ops",
        )
    )
    d.row("Event log (the pipeline's input)")
    off = "event log disabled"
    d.add(
        timeseries(
            "Event log records",
            "Events appended to the fleet's Redis Streams per second (written), and those dropped rather than "
            "slowing delivery down when sends fail or fall behind. Exported while event_log is enabled.",
            [Target(rate("fleetmq_event_log_records_total", FLEET, "outcome"), "{{outcome}}")],
            "ops",
            stack=True,
            no_value=off,
        )
    )
    d.add(
        timeseries(
            "Event log dropped share",
            "Share of event records dropped, per pod: the pipeline's KPIs miss what is dropped.",
            [
                Target(
                    f'sum by (pod) (rate(fleetmq_event_log_records_total{{{FLEET}, outcome="dropped"}}[{RATE}])) '
                    f"/ sum by (pod) (rate(fleetmq_event_log_records_total{{{FLEET}}}[{RATE}]))",
                    "{{pod}}",
                )
            ],
            "percentunit",
            no_value=off,
        ),
        w=6,
    )
    d.add(
        timeseries(
            "Event log send errors",
            "Failed sends of event batches to Redis per second, per pod (their records are retried or dropped).",
            [Target(rate("fleetmq_event_log_errors_total", FLEET, "pod"), "{{pod}}")],
            "ops",
            no_value=off,
        ),
        w=6,
    )
    return d


def operator() -> Dashboard:
    d = Dashboard(
        "fleetmq-operator",
        "fleetmq / Operator",
        "The fleetmq-operator's reconciliations of BrokerFleets and MqttZones.",
        operator_variables(),
    )
    d.row("Now")
    d.add(
        stat(
            "Fleets",
            "BrokerFleets this operator reconciles.",
            Target(f"sum(fleetmq_operator_fleets{{{OPERATOR}}})"),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Fleets not Ready",
            "BrokerFleets whose Ready condition is False: not every pod is ready or runs the rendered config "
            "(alert FleetmqFleetNotReady).",
            Target(f"count({fleet_ready(OPERATOR)} == 0) or on () vector(0)"),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=4,
        h=4,
    )
    d.add(
        stat(
            "Zones accepted",
            "MqttZones accepted into their fleet's config at the last reconciliations.",
            Target(f'sum(fleetmq_operator_zones{{{OPERATOR}, state="accepted"}})'),
        ),
        w=5,
        h=4,
    )
    d.add(
        stat(
            "Zones rejected",
            "MqttZones refused (invalid, conflicting ports, unknown fleet): see their status conditions.",
            Target(f'sum(fleetmq_operator_zones{{{OPERATOR}, state="rejected"}})'),
            thresholds=(("green", None), ("orange", 1)),
        ),
        w=5,
        h=4,
    )
    d.add(
        stat(
            "Reconcile errors (1h)",
            "Failed reconciliations in the last hour.",
            Target(
                f'sum(increase(fleetmq_operator_reconciles_total{{{OPERATOR}, result="error"}}[1h])) '
                "or on () vector(0)"
            ),
            thresholds=(("green", None), ("red", 1)),
        ),
        w=6,
        h=4,
    )
    d.row("Fleets")
    d.add(
        timeseries(
            "Fleet readiness",
            "1 while a BrokerFleet's Ready condition is True (all pods ready and on the rendered config), "
            "0 while it is not; see its Progressing and Degraded conditions for why.",
            [Target(fleet_ready(OPERATOR), "{{fleet_namespace}}/{{fleet}}")],
            maximum=1,
        )
    )
    d.add(
        timeseries(
            "Fleet pods desired and ready",
            "Broker pods each BrokerFleet asks for (spec.replicas) and those ready (status.readyReplicas).",
            [
                Target(
                    f"max by (fleet_namespace, fleet, state) (fleetmq_operator_fleet_replicas{{{OPERATOR}}})",
                    "{{fleet_namespace}}/{{fleet}} {{state}}",
                )
            ],
        )
    )
    d.row("Reconciliations")
    d.add(
        timeseries(
            "Reconciliations by result",
            "BrokerFleet reconciliations per second: ok, error, paused (annotation), gone (deleted).",
            [Target(rate("fleetmq_operator_reconciles_total", OPERATOR, "result"), "{{result}}")],
            "ops",
            stack=True,
        )
    )
    d.add(
        quantiles(
            "Reconcile duration",
            "Time one BrokerFleet reconciliation takes (render, server-side apply, prune, status).",
            "fleetmq_operator_reconcile_duration_seconds_bucket",
            OPERATOR,
        )
    )
    d.add(
        timeseries(
            "Reconcile errors by step",
            "Failed steps per second: render, apply, prune, status, nodeinfo, pods.",
            [Target(rate("fleetmq_operator_reconcile_errors_total", OPERATOR, "step"), "{{step}}")],
            "ops",
        )
    )
    d.add(
        timeseries(
            "Child objects changed and deleted",
            "Server-side applies that changed a child (created, updated, drift corrected) and children "
            "pruned, per second by kind. Steady changes mean something fights the operator.",
            [
                Target(rate("fleetmq_operator_child_changes_total", OPERATOR, "kind"), "changed {{kind}}"),
                Target(rate("fleetmq_operator_child_deletes_total", OPERATOR, "kind"), "deleted {{kind}}"),
            ],
            "ops",
        )
    )
    return d


DASHBOARDS = (fleet_overview, message_flow, windows_and_queues, store, operator)
