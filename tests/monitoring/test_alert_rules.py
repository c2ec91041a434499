"""The chart's alert rules through promtool: the file is valid, and thresholds and `for:` behave on series
spanning hours (which the live test in test_promql.py cannot wait for): what must fire fires, with the
labels a receiver routes on, and steady background noise does not."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml
from fleetmq.operator import monitoring

pytestmark = pytest.mark.prometheus

ALERTS = monitoring.CHART_DIR / monitoring.ALERTS_FILE
FLEET = {"namespace": "mq", "job": "edge-headless"}


def _sel(name: str, **labels: str) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in {**FLEET, **labels}.items()) + "}"


def _ready(pod: str, fleet: str) -> str:
    """fleet_ready as an operator pod in namespace ops exports it for a fleet in namespace mq."""
    return (
        f'fleetmq_operator_fleet_ready{{namespace="ops", pod="{pod}", fleet_namespace="mq", fleet="{fleet}"}}'
    )


def _store(what: str, fleet: str, pod: str = "op-0", **labels: str) -> str:
    """A session-store gauge of an operator pod in namespace ops for a fleet in namespace mq."""
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return (
        f'fleetmq_operator_fleet_store_{what}{{namespace="ops", pod="{pod}", fleet_namespace="mq", '
        f'fleet="{fleet}"{extra}}}'
    )


def _commits(pod: str, under_100ms: str, under_250ms: str, total: str) -> list[tuple[str, str]]:
    """The commit-duration histogram of a pod: cumulative buckets (0.1, 0.25, 1, +Inf) every minute."""
    name = "fleetmq_store_op_duration_seconds_bucket"
    return [
        (_sel(name, pod=pod, op="commit", le="0.1"), under_100ms),
        (_sel(name, pod=pod, op="commit", le="0.25"), under_250ms),
        (_sel(name, pod=pod, op="commit", le="1"), total),
        (_sel(name, pod=pod, op="commit", le="+Inf"), total),
    ]


def test_promtool_accepts_the_chart_rules(promtool: str):
    r = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rules = sum(len(g["rules"]) for g in monitoring.alert_groups()["groups"])
    assert f"SUCCESS: {rules} rules found" in r.stdout


# (series, values every minute) and the alerts expected at eval_time; labels beyond the alert's own grouping
# are what promtool compares, so each case also pins which labels an alert carries.
CASES = {
    "queue drops for 5 minutes fire": (
        [(_sel("fleetmq_messages_dropped_total", pod="edge-0", zone="ext", reason="queue_full"), "0+60x20")],
        "10m",
        {"FleetmqQueueDrops": [{"severity": "warning", **FLEET, "zone": "ext"}]},
    ),
    "a full window for most deliveries fires after 10 minutes": (
        [
            (_sel("fleetmq_inflight_full_total", pod="edge-0", zone="ext"), "0+600x30"),
            (_sel("fleetmq_messages_delivered_total", pod="edge-0", zone="ext", qos="1"), "0+60x30"),
        ],
        "20m",
        {"FleetmqInflightWindowFull": [{"severity": "warning", **FLEET, "zone": "ext"}]},
    ),
    "a steady keep-alive timeout rate is not a spike": (
        [(_sel("fleetmq_keepalive_timeouts_total", pod="edge-0", zone="ext"), "0+20x120")],
        "110m",
        {"FleetmqKeepaliveTimeoutsSpiking": []},
    ),
    "keep-alive timeouts jumping above the hour's rate fire": (
        [(_sel("fleetmq_keepalive_timeouts_total", pod="edge-0", zone="ext"), "0+1x100 100+40x10")],
        "108m",
        {"FleetmqKeepaliveTimeoutsSpiking": [{"severity": "warning", **FLEET, "zone": "ext"}]},
    ),
    "store errors fire per pod after a minute": (
        [(_sel("fleetmq_store_errors_total", pod="edge-1"), "0 0 3 3 3")],
        "4m",
        {"FleetmqStoreErrors": [{"severity": "critical", **FLEET, "pod": "edge-1"}]},
    ),
    "no replica in sync on a sentinel store fires per pod after 2 minutes, a standalone store never": (
        [
            (_sel("fleetmq_store_replicas_in_sync", pod="edge-0"), "2 2 0 0 0 0 0 0"),
            (_sel("fleetmq_store_info", pod="edge-0", topology="sentinel", primary="10.0.0.1:6379"), "1x8"),
            (_sel("fleetmq_store_replicas_in_sync", pod="edge-1"), "1 1 1 1 1 1 1 1"),
            (_sel("fleetmq_store_info", pod="edge-1", topology="sentinel", primary="10.0.0.1:6379"), "1x8"),
            ('fleetmq_store_replicas_in_sync{namespace="dev", job="d-headless", pod="d-0"}', "0x8"),
            (
                'fleetmq_store_info{namespace="dev", job="d-headless", pod="d-0", topology="standalone", '
                'primary="10.0.0.9:6379"}',
                "1x8",
            ),
        ],
        "6m",
        {"FleetmqStoreNoReplicaInSync": [{"severity": "critical", **FLEET, "pod": "edge-0"}]},
    ),
    "one failover is not a storm": (
        [(_sel("fleetmq_store_failovers_total", pod="edge-0"), "0 0 1 1 1 1 1 1 1 1")],
        "8m",
        {"FleetmqStoreFailoverStorm": []},
    ),
    "failover after failover is": (
        [
            (_sel("fleetmq_store_failovers_total", pod="edge-0"), "0 1 2 3 4 5 6 6 6 6"),
            (_sel("fleetmq_store_failovers_total", pod="edge-1"), "0 1 2 3 4 5 6 6 6 6"),
        ],
        "8m",
        {"FleetmqStoreFailoverStorm": [{"severity": "warning", **FLEET}]},
    ),
    "commits slow at the 99th percentile for 10 minutes fire per pod, a fast pod does not": (
        _commits("edge-0", "0+10x30", "0+10x30", "0+100x30")
        + _commits("edge-1", "0+100x30", "0+100x30", "0+100x30"),
        "20m",
        {"FleetmqStoreCommitSlow": [{"severity": "warning", **FLEET, "pod": "edge-0"}]},
    ),
    "a pod slow for 5 minutes is not": (  # still pending 4 minutes after it got fast again
        _commits("edge-0", "0+100x10 1000+10x5 1050+100x15", "0+100x10 1000+10x5 1050+100x15", "0+100x30"),
        "19m",
        {"FleetmqStoreCommitSlow": []},
    ),
    "event-log drops recurring for 15 minutes fire, one burst does not": (
        [
            (_sel("fleetmq_event_log_records_total", pod="edge-0", outcome="dropped"), "0+5x30"),
            (_sel("fleetmq_event_log_records_total", pod="edge-1", outcome="dropped"), "0x8 50x22"),
            (_sel("fleetmq_event_log_records_total", pod="edge-1", outcome="written"), "0+1000x30"),
        ],
        "20m",
        {"FleetmqEventLogDropping": [{"severity": "warning", **FLEET, "pod": "edge-0"}]},
    ),
    "a store not ready for 5 minutes fires (with its namespace), one missing pods is left to that alert": (
        [
            (_store("ready", "edge"), "1x3 0x20"),  # an existing Redis that stopped answering
            (_store("ready", "core"), "1x3 0x20"),  # a managed Redis short of pods
            (_store("pods", "core", state="wanted"), "5x23"),
            (_store("pods", "core", state="ready"), "5x3 3x20"),
            (_store("ready", "calm"), "1x23"),
            (_store("ready", "blip"), "1x3 0x3 1x17"),  # 3 minutes, e.g. a failover
        ],
        "15m",
        {
            "FleetmqStoreNotReady": [
                {"severity": "critical", "namespace": "mq", "fleet_namespace": "mq", "fleet": "edge"}
            ],
            "FleetmqStoreRedisPodsMissing": [
                {"severity": "warning", "namespace": "mq", "fleet_namespace": "mq", "fleet": "core"}
            ],
        },
    ),
    "a store stays not ready across an operator handover": (
        [(_store("ready", "edge", pod="op-0"), "0x4"), (_store("ready", "edge", pod="op-1"), "_x4 0x8")],
        "8m",
        {
            "FleetmqStoreNotReady": [
                {"severity": "critical", "namespace": "mq", "fleet_namespace": "mq", "fleet": "edge"}
            ]
        },
    ),
    "a Redis pod restarting for less than 10 minutes is not missing": (
        [
            (_store("pods", "edge", state="wanted"), "5x20"),
            (_store("pods", "edge", state="ready"), "5x3 4x8 5x9"),
        ],
        "12m",
        {"FleetmqStoreRedisPodsMissing": []},
    ),
    "roaming clients are not a takeover storm": (
        [
            (_sel("fleetmq_session_events_total", pod="edge-0", zone="ext", event="takenover"), "0+30x30"),
            (_sel("fleetmq_session_events_total", pod="edge-0", zone="ext", event="resumed"), "0+200x30"),
        ],
        "25m",
        {"FleetmqTakeoverStorm": []},
    ),
    "clients fighting over a client id are": (
        [
            (_sel("fleetmq_session_events_total", pod="edge-0", zone="ext", event="takenover"), "0+300x30"),
            (_sel("fleetmq_session_events_total", pod="edge-0", zone="ext", event="resumed"), "0+310x30"),
        ],
        "25m",
        {"FleetmqTakeoverStorm": [{"severity": "warning", **FLEET, "zone": "ext"}]},
    ),
    "a bridge no pod has connected fires after 5 minutes, one connected somewhere does not": (
        [
            (_sel("fleetmq_bridge_connected", pod="edge-0", bridge="cloud"), "1 1 0 0 0 0 0 0 0 0"),
            (_sel("fleetmq_bridge_connected", pod="edge-1", bridge="cloud"), "0x10"),
            (_sel("fleetmq_bridge_connected", pod="edge-0", bridge="backup"), "0x10"),
            (_sel("fleetmq_bridge_connected", pod="edge-1", bridge="backup"), "1x10"),
        ],
        "9m",
        {"FleetmqBridgeDown": [{"severity": "critical", **FLEET, "bridge": "cloud"}]},
    ),
    "a bridge queue over 80% of its limit fires, one at half does not": (
        [
            (
                _sel("fleetmq_bridge_queue_messages", pod="edge-0", bridge="cloud"),
                "100 500 850 900 950 990 990 990 990",
            ),
            (_sel("fleetmq_bridge_queue_limit_messages", pod="edge-0", bridge="cloud"), "1000x9"),
            (_sel("fleetmq_bridge_queue_messages", pod="edge-0", bridge="backup"), "500x9"),
            (_sel("fleetmq_bridge_queue_limit_messages", pod="edge-0", bridge="backup"), "1000x9"),
        ],
        "8m",
        {"FleetmqBridgeQueueFilling": [{"severity": "warning", **FLEET, "bridge": "cloud"}]},
    ),
    "bridge drops that lose messages fire, loop drops do not": (
        [
            (
                _sel(
                    "fleetmq_bridge_messages_dropped_total", pod="edge-0", bridge="cloud", reason="queue_full"
                ),
                "0 0 0 40 80",
            ),
            (
                _sel("fleetmq_bridge_messages_dropped_total", pod="edge-0", bridge="cloud", reason="loop"),
                "0+100x5",
            ),
        ],
        "4m",
        {"FleetmqBridgeDrops": [{"severity": "warning", **FLEET, "bridge": "cloud", "reason": "queue_full"}]},
    ),
    "a down pod of a fleet fires, a down target of another job does not": (
        [
            (
                _sel("fleetmq_zone_config_info", pod="edge-0", zone="ext", config_hash="a", instance="i0"),
                "1x20",
            ),
            (_sel("up", pod="edge-0", instance="i0"), "1x20"),
            (_sel("up", pod="edge-2", instance="i2"), "0x20"),
            ('up{namespace="mq", job="something-else", instance="i9"}', "0x20"),
        ],
        "10m",
        {"FleetmqBrokerDown": [{"severity": "critical", **FLEET, "pod": "edge-2", "instance": "i2"}]},
    ),
    "a whole fleet down fires for each pod": (
        [
            (
                _sel("fleetmq_zone_config_info", pod="edge-0", zone="ext", config_hash="a", instance="i0"),
                "1x10",
            ),
            (_sel("up", pod="edge-0", instance="i0"), "1x10 0x20"),
        ],
        "25m",
        {"FleetmqBrokerDown": [{"severity": "critical", **FLEET, "pod": "edge-0", "instance": "i0"}]},
    ),
    "pods running different configs of a zone for 15 minutes fire": (
        [
            (_sel("fleetmq_zone_config_info", pod="edge-0", zone="ext", config_hash="a"), "1x30"),
            (_sel("fleetmq_zone_config_info", pod="edge-1", zone="ext", config_hash="b"), "1x30"),
            (_sel("fleetmq_zone_config_info", pod="edge-1", zone="int", config_hash="c"), "1x30"),
        ],
        "20m",
        {"FleetmqZoneConfigDiverged": [{"severity": "warning", **FLEET, "zone": "ext"}]},
    ),
    "a refused reload fires at once": (
        [(_sel("fleetmq_config_reload_errors_total", pod="edge-1"), "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1")],
        "2m",
        {"FleetmqConfigReloadFailed": [{"severity": "warning", **FLEET, "pod": "edge-1"}]},
    ),
    "a fleet not Ready for 10 minutes fires (with its namespace), a rollout shorter than that does not": (
        [
            (_ready(pod="op-0", fleet="edge"), "1x5 0x25"),
            (_ready(pod="op-0", fleet="core"), "1x20 0x5 1x5"),
            (_ready(pod="op-0", fleet="calm"), "1x30"),
        ],
        "25m",
        {
            "FleetmqFleetNotReady": [
                {"severity": "warning", "namespace": "mq", "fleet_namespace": "mq", "fleet": "edge"}
            ]
        },
    ),
    "a fleet stays not Ready across an operator handover": (
        [
            (_ready(pod="op-0", fleet="edge"), "0x8"),
            (_ready(pod="op-1", fleet="edge"), "_x8 0x12"),
        ],
        "15m",  # not Ready for 15 minutes, though op-1 has said so for 7 only
        {
            "FleetmqFleetNotReady": [
                {"severity": "warning", "namespace": "mq", "fleet_namespace": "mq", "fleet": "edge"}
            ]
        },
    ),
    "a rollout stopped on its added pod fires with its reason, one that recovered does not": (
        [
            (
                'fleetmq_operator_fleet_rollout_stopped{fleet_namespace="mq", fleet="edge", reason="ImagePullFailed", pod="op-0"}',
                "0 1x10",
            ),
            (
                'fleetmq_operator_fleet_rollout_stopped{fleet_namespace="mq", fleet="edge", reason="CrashLoop", pod="op-0"}',
                "0x10",
            ),
            (
                'fleetmq_operator_fleet_rollout_stopped{fleet_namespace="mq", fleet="core", reason="CrashLoop", pod="op-0"}',
                "1 0x10",
            ),
        ],
        "5m",
        {
            "FleetmqRolloutStopped": [
                {
                    "severity": "warning",
                    "namespace": "mq",
                    "fleet_namespace": "mq",
                    "fleet": "edge",
                    "reason": "ImagePullFailed",
                }
            ]
        },
    ),
    "operator reconcile errors for 15 minutes fire": (
        [('fleetmq_operator_reconciles_total{namespace="ops", pod="op-0", result="error"}', "0+1x40")],
        "30m",
        {"FleetmqOperatorReconcileErrors": [{"severity": "warning", "namespace": "ops", "pod": "op-0"}]},
    ),
}


def test_alerts_fire_on_what_they_are_about_and_not_on_noise(promtool: str, tmp_path: Path):
    rules = copy.deepcopy(monitoring.alert_groups())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # promtool compares annotations too; the labels are what is tested here
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    tests = []
    for name, (series, eval_time, expected) in CASES.items():
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": lb} for lb in want],
                    }
                    for alert, want in expected.items()
                ],
            }
        )
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    r = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
