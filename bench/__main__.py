"""Run every scenario against mosquitto and fleetmq back to back and print a Markdown table.

Usage: python -m bench [--duration 5] [--warmup 1] [--only pt2pt-q1,idle] [--brokers mosquitto,fleetmq]
Exit status is 0 when every cell ran (targets missed are still exit 0: this is a report),
1 when anything errored (a broker failed to start, a scenario failed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import RedisError

from bench import crash, driver, memory, procs, report, stores
from bench.brokers import (
    BROKERS,
    REPO,
    Broker,
    BrokerError,
    Fleetmq,
    FleetmqAllowList,
    FleetmqApi,
    FleetmqAt,
    FleetmqBridge,
    FleetmqCompiled,
    FleetmqDenyRule,
    Mosquitto,
    MosquittoBridge,
    Rumqttd,
)
from bench.fleet import TAKEOVER_INFLIGHT, Fleet, FleetNode, store_delta, store_snapshot, time_client_listing
from bench.report import FLEET_SCENARIOS, Cell, Row

MODES = ("pt2pt", "fanout", "fanin")
# Rows on the bench's Redis fleet (bench/fleet.py): persistent sessions in Redis on one node, cross-node
# routing between nodes a and b, and takeover of a session from node a by node b.
FLEET_ROWS = [
    "redis-pt2pt-q1",
    "redis-pt2pt-q2",
    "cross-node-pt2pt-q0",
    "cross-node-pt2pt-q1",
    "cross-node-pt2pt-q2",
    "takeover",
    "crash-takeover",
    "eventlog-pt2pt-q1",
    "store-pt2pt-q1",
]
# the same point-to-point flow, every client over TLS 1.2+ (both brokers on one certificate)
TLS_ROWS = ["tls-pt2pt-q0", "tls-pt2pt-q1"]
# fleetmq alone, with and without access rules (bench/brokers.py: FleetmqAllowList, FleetmqDenyRule)
ACL_ROWS = ["acl-fanin-q1"]
# fleetmq alone, its management API off and on (idle) interleaved: the API is off the data path (issue 29);
# then a GET /api/v1/clients over 10,000 sessions in Redis, timed (bench/fleet.py: time_client_listing)
API_ROWS = ["api-pt2pt-q1", "api-fanout-q1"]
API_LIST_ROWS = ["api-list"]
# fleetmq's per-message path in one process under callgrind: instructions per message, this checkout beside
# each --baseline (repeatable whatever the machine does; bench/hotpath.py)
# (hotpath-conn: the same with each channel behind connection.Connection, its socket layer counted too)
HOTPATH_ROWS = [f"hotpath{io}-q{q}" for io in ("", "-conn") for q in (0, 1, 2)]
# egress through a bridge: publishers on one broker, subscribers on a mosquitto it forwards to (issue 16)
BRIDGE_ROWS = ["bridge-pt2pt-q1"]
BRIDGE_REPS = 3
ALL_ROWS = (
    [f"{m}-q{q}" for m in MODES for q in (0, 1, 2)]
    + TLS_ROWS
    + ACL_ROWS
    + API_ROWS
    + API_LIST_ROWS
    + BRIDGE_ROWS
    + HOTPATH_ROWS
    + FLEET_ROWS
    + memory.ROWS
    + ["idle", "subscribed", "broadcast"]
)
HOTPATH_MESSAGES = 5000  # callgrind runs N and 2N messages: (I(2N) - I(N)) / N leaves setup out
IDLE_SETTLE_S = 2.0
#: the subscribed-connections row (issue 30): connects in flight at once, and how long the broker is given
#: to let go of closed connections before its memory is read again
SUBSCRIBED_IN_FLIGHT = 1000
SUBSCRIBED_CLOSE_S = 5.0
#: the broadcast row (issue 30): messages published to the topic every connection subscribed to, at QoS 1
BROADCAST_MESSAGES = 20
BROADCAST_QOS = 1
TAKEOVER_QUEUED = 1000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each measurement")
    p.add_argument("--only", default="", help=f"comma-separated rows from: {','.join(ALL_ROWS)}")
    p.add_argument(
        "--brokers", default="mosquitto,rumqttd,fleetmq", help="comma-separated: mosquitto,rumqttd,fleetmq"
    )
    p.add_argument(
        "--baseline",
        action="append",
        type=Path,
        default=[],
        metavar="CHECKOUT",
        help="also run fleetmq from this checkout (a worktree at an earlier commit) in the in-memory rows",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="also run fleetmq with its per-message path compiled by mypyc (scripts/compiled.py) in the "
        "in-memory rows",
    )
    p.add_argument("--conns", type=int, default=10000, help="connections for the idle-memory row")
    p.add_argument(
        "--subscribed-conns",
        type=int,
        default=18000,
        help="connections of the subscribed row, each subscribed to a topic of its own (under the "
        "machine's open-file limit of 20,000)",
    )
    p.add_argument(
        "--broadcast-conns",
        type=int,
        default=18000,
        help="connections of the broadcast row, all subscribed to one topic",
    )
    p.add_argument("--window", type=int, default=200, help="max outstanding messages per publisher")
    p.add_argument("--payload", type=int, default=64, help="payload bytes")
    p.add_argument("--takeover-reps", type=int, default=30, help="measured takeovers per QoS (takeover row)")
    p.add_argument("--crash-reps", type=int, default=20, help="measured crashes (crash-takeover row)")
    p.add_argument("--out", type=Path, default=Path("bench/results/latest.md"))
    p.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.only.split(",") if r.strip()] or ALL_ROWS
    args.broker_names = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for r in args.rows:
        if r not in ALL_ROWS:
            p.error(f"unknown row {r!r}; choose from {','.join(ALL_ROWS)}")
    for b in args.broker_names:
        if b not in BROKERS:
            p.error(f"unknown broker {b!r}; choose from {','.join(BROKERS)}")
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_running(broker: Broker, start_error: dict[str, str]) -> str | None:
    """Make sure the broker is up (restarting it if a previous scenario killed it); return an error."""
    if broker.alive():
        return None
    if broker.proc is not None:
        reason = broker.exit_reason()
        log(f"  {broker.name} died: {reason}; restarting")
    try:
        broker.start()
    except BrokerError as e:
        start_error[broker.name] = str(e)
        return str(e)
    start_error.pop(broker.name, None)
    return None


def run_flow_cell(
    broker: Broker, binary: Path, mode: str, qos: int, args: argparse.Namespace, *, clean: bool = True
) -> Cell:
    tls = mode.startswith("tls-")
    return _measured(
        lambda pids: driver.run_flow(
            binary,
            broker.tls_port if tls else broker.port,
            mode.removeprefix("tls-"),
            qos,
            duration=args.duration,
            warmup=args.warmup,
            window=args.window,
            payload=args.payload,
            clean=clean,
            tls_ca=broker.pki["ca"] if tls else None,
            cpu_pids=pids,
        ),
        {broker.name: broker.pid},
        None,
        lambda: None if broker.alive() else broker.exit_reason(),
    )


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: procs.cpu_seconds(p) for name, p in pids.items()}


def _measured(
    run: Callable[[dict[str, int]], dict[str, Any]],
    broker_pids: dict[str, int],
    redis_pid: int | None,
    dead: Callable[[], str | None],
) -> Cell:
    """Run the loadgen, charging CPU to the broker process(es), Redis, the loadgen, softirq and the rest.

    `run` gets the pids whose CPU the loadgen samples at the edges of its measured window (the broker
    processes, and "redis"): that window's CPU per delivered message is the row's cost figure.
    """
    cpu0, (busy0, irq0) = _cpu(broker_pids), procs.system_cpu_seconds()
    redis0 = procs.cpu_seconds(redis_pid) if redis_pid else 0.0
    window_pids = {**broker_pids, **({"redis": redis_pid} if redis_pid else {})}
    try:
        res = run(window_pids)
    except driver.LoadgenError as e:
        err = str(e)
        reason = dead()
        if reason:
            err = f"{err} ({reason})"
        return Cell(error=err)
    per_process = {name: cpu - cpu0[name] for name, cpu in _cpu(broker_pids).items()}
    broker_cpu = sum(per_process.values())
    if len(per_process) > 1:  # fleet nodes: which one is busy
        res["node_cpu_s"] = per_process
    redis_cpu = procs.cpu_seconds(redis_pid) - redis0 if redis_pid else None
    busy1, irq1 = procs.system_cpu_seconds()
    other = busy1 - busy0 - broker_cpu - (redis_cpu or 0.0) - float(res.get("loadgen_cpu_s", 0.0))
    window = res.get("window_cpu_s") or {}
    delivered = res.get("delivered") or 0
    if delivered and all(name in window for name in broker_pids):
        res["broker_us_per_msg"] = sum(window[name] for name in broker_pids) / delivered * 1e6
        if "redis" in window:
            res["redis_us_per_msg"] = window["redis"] / delivered * 1e6
    return Cell(
        result=res,
        broker_cpu_s=broker_cpu,
        other_cpu_s=max(0.0, other),
        softirq_cpu_s=irq1 - irq0,
        redis_cpu_s=redis_cpu,
    )


def run_fleet_row(key: str, fleet: Fleet, binary: Path, args: argparse.Namespace) -> list[Row]:
    """The fleetmq cell(s) of one Redis row (the mosquitto counterpart, if any, is run by the caller)."""
    if key == "takeover":
        wanted: tuple[str, ...] = ("a", "b")
        rows = [Row("takeover", q) for q in (1, 2)]
    elif key == "crash-takeover":
        return [run_crash_row(fleet, args)]
    elif key.startswith("eventlog-"):
        return [run_event_log_row(key, fleet, binary, args)]
    elif key.startswith("store-"):
        return [run_store_row(key, fleet, binary, args)]
    else:
        scenario, q = key.rsplit("-q", 1)
        wanted = ("a",) if scenario == "redis-pt2pt" else ("a", "b")
        rows = [Row(scenario, int(q))]
    err = fleet.ensure(wanted)
    if err:
        for row in rows:
            row.cells["fleetmq"] = Cell(error=err)
        return rows
    a, b = fleet.nodes["a"], fleet.nodes["b"]
    pids, redis_pid = fleet.cpu_pids(wanted), fleet.redis.pid
    for row in rows:
        qos = int(row.qos or 0)
        if row.scenario == "takeover":
            cell = _measured(
                lambda _pids, qos=qos: driver.run_takeover(
                    binary,
                    a.tk_port,
                    b.tk_port,
                    qos,
                    reps=args.takeover_reps,
                    queued=TAKEOVER_QUEUED,
                    inflight=TAKEOVER_INFLIGHT,
                    payload=args.payload,
                ),
                pids,
                redis_pid,
                lambda: fleet.dead(wanted),
            )
        else:
            before = _snapshot(a, fleet, qos)
            cell = _measured(
                lambda pids, qos=qos, scenario=row.scenario: driver.run_flow(
                    binary,
                    a.port,
                    "pt2pt",
                    qos,
                    duration=args.duration,
                    warmup=args.warmup,
                    window=args.window,
                    payload=args.payload,
                    sub_port=b.port if scenario == "cross-node-pt2pt" else None,
                    clean=scenario != "redis-pt2pt",
                    cpu_pids=pids,
                ),
                pids,
                redis_pid,
                lambda: fleet.dead(wanted),
            )
            after = _snapshot(a, fleet, qos)
            if cell.result is not None and before and after and row.scenario == "redis-pt2pt":
                cell.result["store"] = store_delta(before, after)
        row.cells["fleetmq"] = cell
    return rows


def run_interleaved(key: str, row: Row, variants: dict[str, Callable[[], Cell]], reps: int) -> Row:
    """Run every variant once per round, `reps` rounds, and keep each one's median run, with its ratios to
    the first variant round by round ("pair_ratios"): one short run on a shared 2-core machine varies more
    than the costs these rows measure, and interleaving spreads the machine's moods over all of them."""
    runs: dict[str, list[Cell]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            cell = run()
            runs[name].append(cell)
            log_flow(key, name, cell)
    base = runs[next(iter(variants))]
    for name, cells in runs.items():
        failed = [c for c in cells if c.result is None]
        ok = sorted((c for c in cells if c.result is not None), key=lambda c: c.result["msgs_per_s"])
        row.cells[name] = ok[len(ok) // 2] if ok else failed[0]
        if ok:
            row.cells[name].result["runs_msgs_per_s"] = [c.result["msgs_per_s"] for c in cells if c.result]
            row.cells[name].result["pair_ratios"] = [
                c.result["msgs_per_s"] / b.result["msgs_per_s"]
                for b, c in zip(base, cells, strict=True)
                if b.result and c.result and b.result["msgs_per_s"] > 0
            ]
            # the same for the broker's CPU per delivered message (less sensitive to a busy machine)
            row.cells[name].result["cost_ratios"] = [
                c.result["broker_us_per_msg"] / b.result["broker_us_per_msg"]
                for b, c in zip(base, cells, strict=True)
                if b.result
                and c.result
                and b.result.get("broker_us_per_msg")
                and "broker_us_per_msg" in c.result
            ]
    return row


API_LIST_SESSIONS = 10_000


def run_api_list_row(fleet: Fleet) -> Row:
    """GET /api/v1/clients on node a over API_LIST_SESSIONS persistent sessions in the bench's Redis (made
    by real MQTT 5 clients connecting and leaving), timed; the issue's target: within 1 s."""
    row = Row("api-list", None)
    try:
        node = fleet.nodes["a"]
        node.api = True
        err = fleet.ensure(("a",))
        if err:
            row.cells["fleetmq"] = Cell(error=err)
            return row
        result = time_client_listing(node, API_LIST_SESSIONS)
        row.cells["fleetmq"] = Cell(result=result)
        log(f"api-list             fleetmq          {result['sessions']:,} sessions: GET /api/v1/clients "
            f"median {result['seconds_median']:.2f} s (runs {result['seconds']})")  # fmt: skip
    except Exception as e:  # (a report: said in its cell)
        row.cells["fleetmq"] = Cell(error=f"{type(e).__name__}: {e}")
    finally:
        fleet.nodes["a"].api = False
        fleet.stop()
    return row


CRASH_RATE = 1000.0  # msg/s flowing to the session while its node is killed (issue 13)


def run_crash_row(fleet: Fleet, args: argparse.Namespace) -> Row:
    """Kill -9 of the node holding a session, its client straight to the other node (bench/crash.py)."""
    row = Row("crash-takeover", 1)
    try:
        result = crash.run_crash_takeover(fleet, args.crash_reps, CRASH_RATE)
    except (RuntimeError, OSError, AssertionError, BrokerError) as e:
        row.cells["fleetmq"] = Cell(error=str(e))
        return row
    row.cells["fleetmq"] = Cell(result=result)
    r = result
    log(
        f"{'crash-takeover':20} {'fleetmq':10} {r['reps']} crashes at {r['rate']:.0f} msg/s: CONNECT->CONNACK "
        f"p50 {r['connack_p50_ms']:.1f} p99 {r['connack_p99_ms']:.1f} ms, ->first message p50 "
        f"{r['first_p50_ms']:.1f} p99 {r['first_p99_ms']:.1f} ms; lost {r['lost']}, queue_full {r['queue_full']}"
    )
    return row


EVENT_LOG_REPS = 5  # off/on pairs, interleaved: the row reports the median of the pairs' on/off ratios


def run_event_log_row(key: str, fleet: Fleet, binary: Path, args: argparse.Namespace) -> Row:
    """The same clean-session pt2pt flow on node a (sessions in Redis), its event log off, then on."""
    scenario, q = key.rsplit("-q", 1)
    a = fleet.nodes["a"]

    def variant(on: bool) -> Callable[[], Cell]:
        def run() -> Cell:
            if a.event_log != on:
                a.stop()
                a.event_log = on
            err = fleet.ensure(("a",))
            if err:
                return Cell(error=err)
            return _measured(
                lambda pids: driver.run_flow(
                    binary,
                    a.port,
                    "pt2pt",
                    int(q),
                    duration=args.duration,
                    warmup=args.warmup,
                    window=args.window,
                    payload=args.payload,
                    cpu_pids=pids,
                ),
                fleet.cpu_pids(("a",)),
                fleet.redis.pid,
                lambda: fleet.dead(("a",)),
            )

        return run

    row = Row(scenario, int(q))
    try:
        return run_interleaved(
            key, row, {"event log off": variant(False), "event log on": variant(True)}, EVENT_LOG_REPS
        )
    finally:
        a.stop()
        a.event_log = False


STORE_REPS = 3  # rounds of the four store variants, interleaved
#: the cluster's balance: persistent subscribers on one publisher's topic (sessions over the slots)
BALANCE_SUBSCRIBERS = 300


def run_store_row(key: str, fleet: Fleet, binary: Path, args: argparse.Namespace) -> Row:
    """Persistent-session pt2pt on node a with its sessions on the bench's single Redis, on Sentinel's
    primary with 2 replicas (wait_replicas 0, then 1: every ack waits for a replica), and on a Redis Cluster
    of 3 shards; then the cluster's balance: keys and commands per primary under a fan-out to
    BALANCE_SUBSCRIBERS persistent sessions."""
    scenario, q = key.rsplit("-q", 1)
    workdir = fleet.redis.data_dir.parent / "stores"
    row = Row(scenario, int(q))
    deployments: list[stores.Deployment] = []
    try:
        sen, clu = stores.sentinel(workdir), None
        deployments.append(sen)
        clu = stores.cluster(workdir)
        deployments.append(clu)
    except BrokerError as e:
        row.cells["single redis"] = Cell(error=str(e))
        for d in deployments:
            d.stop()
        return row
    nodes: dict[str, FleetNode] = {
        "sentinel w0": stores.StoreNode(workdir, "sentinel-w0", sen.store),
        "sentinel w1": stores.StoreNode(workdir, "sentinel-w1", {**sen.store, "wait_replicas": 1}),
        "cluster 3 shards": stores.StoreNode(workdir, "cluster", clu.store),
    }

    def flow(node: FleetNode, cpu: Callable[[], dict[str, int]], dead: Callable[[], str | None]) -> Cell:
        return _measured(
            lambda pids: driver.run_flow(
                binary, node.port, "pt2pt", int(q), duration=args.duration, warmup=args.warmup,
                window=args.window, payload=args.payload, clean=False, cpu_pids=pids,
            ),
            cpu(),
            None,
            dead,
        )  # fmt: skip

    def variant(name: str) -> Callable[[], Cell]:
        def run() -> Cell:
            for other, n in nodes.items():
                if other != name:
                    n.stop()
            if name == "single redis":
                err = fleet.ensure(("a",))
                if err:
                    return Cell(error=err)
                return flow(fleet.nodes["a"], lambda: fleet.cpu_pids(("a",)), lambda: fleet.dead(("a",)))
            fleet.nodes["a"].stop()
            node = nodes[name]
            if not node.alive():
                try:
                    node.start()
                except BrokerError as e:
                    return Cell(error=str(e))
            return flow(
                node, lambda: {"node a": node.pid}, lambda: None if node.alive() else node.exit_reason()
            )

        return run

    try:
        run_interleaved(key, row, {name: variant(name) for name in ["single redis", *nodes]}, STORE_REPS)
        node = nodes["cluster 3 shards"]
        if node.alive():
            before = stores.shard_snapshot(clu)
            try:
                res = driver.run_flow(
                    binary, node.port, "fanout", int(q), duration=args.duration, warmup=args.warmup,
                    window=args.window, payload=args.payload, clean=False, subs=BALANCE_SUBSCRIBERS,
                )  # fmt: skip
                res["balance"] = stores.balance(before, stores.shard_snapshot(clu))
                row.cells["cluster balance"] = Cell(result=res)
                b = res["balance"]
                log(
                    f"{key:20} cluster balance: {BALANCE_SUBSCRIBERS} subscribers, keys ±{b['keys_spread']:.0%}"
                    f" {b['keys']}, commands ±{b['ops_spread']:.0%} {b['ops']}"
                )
            except driver.LoadgenError as e:
                row.cells["cluster balance"] = Cell(error=str(e))
    finally:
        for n in nodes.values():
            n.stop()
        for d in deployments:
            d.stop()
    return row


ACL_REPS = 5  # rounds of the three ACL variants, interleaved
ACL_VARIANTS: dict[str, type[Broker]] = {
    "no rules": Fleetmq,
    "allow-list": FleetmqAllowList,
    "deny rule": FleetmqDenyRule,
}


def run_hotpath_row(key: str, baselines: list[Path]) -> Row:
    """Instructions per message of bench/hotpath.py under callgrind, for this checkout and each baseline."""
    scenario, q = key.rsplit("-q", 1)
    qos = int(q)
    io = "connection" if scenario == "hotpath-conn" else "sink"
    row = Row(scenario, qos)
    variants: dict[str, dict[str, str] | None] = {}
    for checkout in baselines:
        with tempfile.TemporaryDirectory(prefix="fleetmq-hotpath-") as tmp:
            at = FleetmqAt(Path(tmp), checkout)
            variants[at.name] = {"PYTHONPATH": f"{at.links}{os.pathsep}{REPO}"}
            row.cells[at.name] = _instructions(qos, variants[at.name], io)
    row.cells["fleetmq"] = _instructions(qos, {"PYTHONPATH": str(REPO)}, io)
    for name, cell in row.cells.items():
        if cell.result:
            log(f"{key:20} {name:16} {cell.result['instructions_per_msg']:,.0f} instructions/msg")
        else:
            log(f"{key:20} {name:16} error: {cell.error}")
    return row


def _instructions(qos: int, env: dict[str, str] | None, io: str = "sink") -> Cell:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return Cell(error="valgrind not found (Debian package valgrind)")
    counts = []
    for n in (HOTPATH_MESSAGES, 2 * HOTPATH_MESSAGES):
        with tempfile.TemporaryDirectory(prefix="fleetmq-callgrind-") as tmp:
            cmd = [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                Fleetmq.python(),
                "-m",
                "bench.hotpath",
                "--qos",
                str(qos),
                "--messages",
                str(n),
                "--io",
                io,
            ]
            done = subprocess.run(
                cmd,
                cwd=REPO,
                # a fixed hash seed: the same dict layouts, hence the same instruction count, every run
                env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})},
                capture_output=True,
                text=True,
                timeout=1800,
            )
            refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
            if done.returncode != 0 or refs is None:
                return Cell(error=f"callgrind run failed: {(done.stderr or done.stdout)[-300:]}")
            counts.append(int(refs.group(1).replace(",", "")))
    return Cell(result={"instructions_per_msg": (counts[1] - counts[0]) / HOTPATH_MESSAGES, "counts": counts})


def run_memory_row(key: str, brokers: dict[str, Broker]) -> Row:
    """Memory under clients that read nothing or make up topics (bench/memory.py): each broker fresh, with
    its default limits, one at a time."""
    row = Row(key, None)
    for name, broker in brokers.items():
        if name == "rumqttd":
            continue  # (its config here is the lifted one; the rows compare default limits)
        cell = row.cells[name] = memory.run_cell(key, broker)
        r = cell.result
        if r:
            log(
                f"{key:20} {name:16} RSS {r['rss_before_kb'] / 1024:,.0f} -> peak {r['rss_peak_kb'] / 1024:,.0f} MB "
                f"(+{r['grown_mb']:,.0f} MB beyond baseline{' + store' if 'store_kb' in r else ''}"
                + (f", held 3 s later +{r['held_mb']:,.0f} MB" if "held_mb" in r else "")
                + f"); probe max {r['probe_max_ms'] or 0:,.0f} ms of {r['probe_rounds']} rounds"
                + (
                    f"; SUBACK {', '.join(f'{t:,.0f}' for t in r['suback_ms'])} ms"
                    if "suback_ms" in r
                    else ""
                )
                + (f"  error: {cell.error}" if cell.error else "")
            )
        else:
            log(f"{key:20} {name:16} error: {cell.error}")
    return row


def run_acl_row(key: str, workdir: Path, binary: Path, args: argparse.Namespace) -> Row:
    """The fan-in flow (ten publishers, one subscriber on `bench/<run>/+`) on fleetmq with no rules, with an
    allow-list (default deny, no deny rule), and with a deny rule the filter overlaps (every delivery
    checked): the first two must not differ, the third shows what a per-delivery check costs."""
    return run_variants_row(key, "acl-", ACL_VARIANTS, workdir, binary, args)


API_REPS = 5
API_VARIANTS: dict[str, type[Broker]] = {"api off": Fleetmq, "api on, idle": FleetmqApi}


def run_api_row(key: str, workdir: Path, binary: Path, args: argparse.Namespace) -> Row:
    """A flow on fleetmq with its management API off, then on and idle, interleaved: nothing of the API
    runs per message, so the two must not differ beyond noise."""
    return run_variants_row(key, "api-", API_VARIANTS, workdir, binary, args, API_REPS)


def run_variants_row(
    key: str,
    prefix: str,
    variants: dict[str, type[Broker]],
    workdir: Path,
    binary: Path,
    args: argparse.Namespace,
    reps: int = ACL_REPS,
) -> Row:
    """One flow on variants of fleetmq, one at a time on the CPU, interleaved round by round."""
    mode, q = key.removeprefix(prefix).rsplit("-q", 1)
    brokers = {name: cls(workdir) for name, cls in variants.items()}

    def variant(broker: Broker) -> Callable[[], Cell]:
        def run() -> Cell:
            for other in brokers.values():
                if other is not broker:
                    other.stop()  # one broker at a time on the CPU
            err = ensure_running(broker, {})
            return Cell(error=err) if err else run_flow_cell(broker, binary, mode, int(q), args)

        return run

    row = Row(f"{prefix}{mode}", int(q))
    try:
        return run_interleaved(key, row, {name: variant(b) for name, b in brokers.items()}, reps)
    finally:
        for b in brokers.values():
            b.stop()


def run_bridge_row(key: str, workdir: Path, binary: Path, args: argparse.Namespace) -> Row:
    """Point-to-point at QoS 1, publishers on the bridging broker and subscribers on the remote (a
    mosquitto): fleetmq's bridge beside mosquitto's own, one at a time on the CPU, interleaved."""
    mode, q = key.removeprefix("bridge-").rsplit("-q", 1)
    remote = Mosquitto(workdir / "remote")
    err = ensure_running(remote, {})
    if err:
        return Row(f"bridge-{mode}", int(q), {"mosquitto-bridge": Cell(error=f"the remote: {err}")})
    brokers: list[Broker] = [MosquittoBridge(workdir, remote.port), FleetmqBridge(workdir, remote.port)]

    def variant(broker: Broker) -> Callable[[], Cell]:
        def run() -> Cell:
            for other in brokers:
                if other is not broker:
                    other.stop()
            err = ensure_running(broker, {})
            if err:
                return Cell(error=err)
            time.sleep(BRIDGE_SETTLE_S)  # (its bridge connects)
            return _measured(
                lambda pids: driver.run_flow(
                    binary, broker.port, mode, int(q), duration=args.duration, warmup=args.warmup,
                    window=args.window, payload=args.payload, sub_port=remote.port, cpu_pids=pids,
                ),
                {broker.name: broker.pid},
                None,
                lambda: None if broker.alive() else broker.exit_reason(),
            )  # fmt: skip

        return run

    row = Row(f"bridge-{mode}", int(q))
    try:
        return run_interleaved(key, row, {b.name: variant(b) for b in brokers}, BRIDGE_REPS)
    finally:
        for b in [*brokers, remote]:
            b.stop()


BRIDGE_SETTLE_S = 1.5


def _snapshot(node: FleetNode, fleet: Fleet, qos: int) -> dict[str, float] | None:
    try:
        return store_snapshot(node, fleet.redis, qos)
    except (OSError, RedisError, ValueError, KeyError) as e:  # RedisError: redis-py's, for INFO
        log(f"  cannot read /metrics or Redis INFO: {e}")
        return None


def log_flow(key: str, name: str, cell: Cell) -> None:
    if not cell.result:
        log(f"{key:20} {name:10} error: {cell.error}")
        return
    r = cell.result
    redis = f" redis {cell.redis_cpu_s:.1f}s" if cell.redis_cpu_s is not None else ""
    if r.get("node_cpu_s"):
        redis = " (" + ", ".join(f"{k} {v:.1f}s" for k, v in r["node_cpu_s"].items()) + ")" + redis
    cost = f"  {r['broker_us_per_msg']:.1f} µs/msg" if "broker_us_per_msg" in r else ""
    log(
        f"{key:20} {name:10} {r['msgs_per_s']:>10,.0f} msg/s{cost}  p50 {r['p50_us']:>9,.0f} µs  "
        f"p99 {r['p99_us']:>9,.0f} µs  lost {r['lost']} dup {r['dup']}  "
        f"cpu broker {cell.broker_cpu_s:.1f}s{redis} loadgen {r['loadgen_cpu_s']:.1f}s "
        f"softirq {cell.softirq_cpu_s:.1f}s other {cell.other_cpu_s:.1f}s"
    )
    st = r.get("store")
    if st:
        log(
            f"{'':20} {name:10} store round trips {st['round_trips']:,.0f} / delivered {st['delivered']:,.0f} "
            f"= {st['round_trips_per_msg']:.4f}; EVALSHA {st['evalsha_per_msg']:.4f}/msg, "
            f"SCRIPT EXISTS {st['script_exists_per_msg']:.4f}/msg, Redis read events "
            f"{st['redis_reads_per_msg']:.4f}/msg, commands {st['commands_per_msg']:.2f}/msg"
            + (f"; Redis errors {st['redis_errors']}" if st.get("redis_errors") else "")
        )


def log_takeover(key: str, cell: Cell) -> None:
    if not cell.result:
        log(f"{key:20} {'fleetmq':10} error: {cell.error}")
        return
    r = cell.result
    log(
        f"{key:20} {'fleetmq':10} {r['reps']} takeovers: CONNECT->first resend p50 {r['first_p50_ms']:.1f} ms "
        f"p99 {r['first_p99_ms']:.1f} ms; CONNACK p50 {r['connack_p50_ms']:.1f} p99 {r['connack_p99_ms']:.1f} ms; "
        f"all {r['queued'] + r['inflight']} received p50 {r['drain_p50_ms']:.1f} p99 {r['drain_p99_ms']:.1f} ms; "
        f"lost {r['lost']} dup {r['dup']} old connection left open {r['old_not_closed']}"
    )


def on_fresh(broker: Broker, measure: Callable[[], Cell]) -> Cell:
    """`measure` on the broker freshly started and given a second to settle; stopped after, whatever
    happened."""
    try:
        broker.start()
    except BrokerError as e:
        return Cell(error=str(e))
    try:
        time.sleep(1.0)
        return measure()
    finally:
        broker.stop()


def run_idle_cell(broker: Broker, binary: Path, conns: int) -> Cell:
    """Fresh broker, RSS before, open `conns` idle connections, settle, RSS after."""

    def measure() -> Cell:
        before = procs.rss_kb(broker.pid)
        try:
            idle = driver.IdleConns(binary, broker.port, conns)
        except driver.LoadgenError as e:
            return Cell(error=str(e))
        try:
            time.sleep(IDLE_SETTLE_S)
            if not broker.alive():
                return Cell(error=broker.exit_reason())
            after = procs.rss_kb(broker.pid)
        finally:
            idle.close()
        connected = int(idle.result.get("connected", 0))
        result = {
            "connected": connected,
            "failed": int(idle.result.get("failed", 0)),
            "connect_s": idle.result.get("connect_s"),
            "rss_before_kb": before,
            "rss_after_kb": after,
            "per_conn_kb": (after - before) / connected if connected else 0.0,
        }
        error = idle.result.get("error") or (None if connected == conns else f"only {connected} connected")
        return Cell(result=result, error=error)

    return on_fresh(broker, measure)


def run_subscribed_cell(broker: Broker, binary: Path, conns: int) -> Cell:
    """Fresh broker; its RSS; `conns` connections, each subscribed to a topic of its own, opened
    SUBSCRIBED_IN_FLIGHT at a time (the connect rate: first CONNECT to last SUBACK); its RSS with them;
    its RSS once they disconnected (how much of what they took it gave back)."""

    def measure() -> Cell:
        before = procs.rss_kb(broker.pid)
        try:
            held = driver.IdleConns(
                binary, broker.port, conns, timeout=600, subscribe=True, concurrency=SUBSCRIBED_IN_FLIGHT
            )
        except driver.LoadgenError as e:
            return Cell(error=str(e))
        try:
            time.sleep(IDLE_SETTLE_S)
            if not broker.alive():
                return Cell(error=broker.exit_reason())
            with_them = procs.rss_kb(broker.pid)
        finally:
            held.close()
        time.sleep(SUBSCRIBED_CLOSE_S)
        if not broker.alive():
            return Cell(error=broker.exit_reason())
        closed = procs.rss_kb(broker.pid)
        connected = int(held.result.get("connected", 0))
        connect_s = float(held.result.get("connect_s") or 0.0)
        grew = with_them - before
        result = {
            "connected": connected,
            "failed": int(held.result.get("failed", 0)),
            "connect_s": connect_s,
            "connect_rate": connected / connect_s if connect_s else 0.0,
            "rss_before_kb": before,
            "rss_held_kb": with_them,
            "rss_closed_kb": closed,
            "per_conn_kb": grew / connected if connected else 0.0,
            "returned": (with_them - closed) / grew if grew > 0 else 0.0,
        }
        error = held.result.get("error") or (None if connected == conns else f"only {connected} connected")
        return Cell(result=result, error=error)

    return on_fresh(broker, measure)


def run_broadcast_cell(broker: Broker, binary: Path, conns: int, args: argparse.Namespace) -> Cell:
    """Fresh broker; `conns` connections subscribed to one topic; BROADCAST_MESSAGES published to it: the
    broker's CPU per delivery (issue 30's broadcast figure)."""

    def measure() -> Cell:
        try:
            res = driver.run_broadcast(
                binary,
                broker.port,
                conns=conns,
                messages=BROADCAST_MESSAGES,
                qos=BROADCAST_QOS,
                payload=args.payload,
                cpu_pids={"broker": broker.pid},
            )
        except driver.LoadgenError as e:
            return Cell(error=str(e))
        if not broker.alive():
            return Cell(error=broker.exit_reason())
        deliveries = int(res["deliveries"])
        cpu = float((res.get("cpu_s") or {}).get("broker", 0.0))
        result = {
            "subscribers": int(res["subscribers"]),
            "deliveries": deliveries,
            "elapsed_s": float(res["elapsed_s"]),
            "cpu_s": cpu,
            "us_per_delivery": cpu / deliveries * 1e6 if deliveries else 0.0,
            "deliveries_per_s": deliveries / float(res["elapsed_s"]) if res["elapsed_s"] else 0.0,
        }
        return Cell(result=result)

    return on_fresh(broker, measure)


def log_broadcast(name: str, cell: Cell) -> None:
    r = cell.result
    if r is None:
        log(f"{'broadcast':10} {name:14} error: {cell.error}")
        return
    log(
        f"{'broadcast':10} {name:14} {r['deliveries']:,} deliveries to {r['subscribers']:,} subscribers in "
        f"{r['elapsed_s']:.2f} s ({r['deliveries_per_s']:,.0f}/s); broker CPU {r['cpu_s']:.2f} s = "
        f"{r['us_per_delivery']:.2f} µs per delivery"
    )


def log_subscribed(name: str, cell: Cell) -> None:
    r = cell.result
    if r is None:
        log(f"{'subscribed':10} {name:14} error: {cell.error}")
        return
    log(
        f"{'subscribed':10} {name:14} {r['connected']:,} conns at {r['connect_rate']:,.0f}/s; RSS "
        f"{r['rss_before_kb'] / 1024:.1f} -> {r['rss_held_kb'] / 1024:.1f} MB ({r['per_conn_kb']:.2f} KB/conn)"
        f" -> {r['rss_closed_kb'] / 1024:.1f} MB closed ({r['returned']:.0%} returned)"
        + (f"  error: {cell.error}" if cell.error else "")
    )


def fleet_rows(
    key: str,
    brokers: dict[str, Broker],
    fleet: Fleet | None,
    start_error: dict[str, str],
    binary: Path,
    args: argparse.Namespace,
) -> list[Row]:
    """One Redis row: mosquitto's counterpart first (redis-pt2pt only: same load, its in-memory sessions),
    then fleetmq on the bench fleet. The mosquitto broker is stopped meanwhile and fleetmq's in-memory
    broker too, so that they do not share the CPU with the fleet."""
    mosq: Cell | None = None
    if key.startswith("redis-pt2pt") and "mosquitto" in brokers:
        broker = brokers["mosquitto"]
        err = ensure_running(broker, start_error)
        mosq = (
            Cell(error=err)
            if err
            else run_flow_cell(broker, binary, "pt2pt", int(key[-1]), args, clean=False)
        )
        log_flow(key, "mosquitto", mosq)
    rows: list[Row]
    if fleet is None:
        if key in ("takeover", "crash-takeover"):
            scenario, q = key, "1"
        else:
            scenario, q = key.rsplit("-q", 1)
        rows = [Row(scenario, int(q))]
    else:
        for broker in brokers.values():
            broker.stop()  # idle processes, but keep the CPU for the fleet; restarted by the next row
        rows = run_fleet_row(key, fleet, binary, args)
    for row in rows:
        if mosq is not None:
            row.cells = {"mosquitto": mosq, **row.cells}
        cell = row.cells.get("fleetmq")
        if cell is not None and row.scenario != "crash-takeover":  # run_crash_row logged its own line
            if row.scenario == "takeover":
                log_takeover(row.key, cell)
            else:
                log_flow(row.key, "fleetmq", cell)
    return rows


#: rows that run fleetmq processes of their own (and the folder they run in), with the bench's brokers and
#: fleet stopped first
STANDALONE_ROWS: dict[str, tuple[str, Callable[[str, Path, Path, argparse.Namespace], Row]]] = {
    **dict.fromkeys(BRIDGE_ROWS, ("bridge", run_bridge_row)),
    **dict.fromkeys(API_ROWS, ("api", run_api_row)),
    **dict.fromkeys(ACL_ROWS, ("acl", run_acl_row)),
}


def _stop_all(brokers: dict[str, Broker], fleet: Fleet | None) -> None:
    for broker in brokers.values():
        broker.stop()
    if fleet is not None:
        fleet.stop()


def _keep_logs(rows: list[Row], brokers: dict[str, Broker], fleet: Fleet | None, out: Path) -> None:
    """Copy the log of every broker that had an error next to the report (the workdir is temporary)."""
    paths: dict[str, Path] = {}
    for r in rows:
        for name, c in r.cells.items():
            if not c.error:
                continue
            if r.scenario in FLEET_SCENARIOS and name == "fleetmq" and fleet is not None:
                paths.update(fleet.log_paths())
            elif name in brokers:
                paths[name] = brokers[name].log_path
    for name, log_path in sorted(paths.items()):
        if log_path.exists():
            kept = out.with_name(f"{out.stem}.{name}.log")
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log_path, kept)
            log(f"{name} log kept at {kept}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = report.utcnow()
    procs.raise_nofile()
    try:
        binary = driver.build()
    except driver.LoadgenError as e:
        log(f"error: {e}")
        return 2
    settings = {
        "duration": args.duration,
        "warmup": args.warmup,
        "window": args.window,
        "payload": args.payload,
        "conns": args.conns,
        "subscribed_conns": args.subscribed_conns,
        "broadcast_conns": args.broadcast_conns,
        "broadcast_messages": BROADCAST_MESSAGES,
        "broadcast_qos": BROADCAST_QOS,
        "takeover_reps": args.takeover_reps,
        "takeover_queued": TAKEOVER_QUEUED,
        "takeover_inflight": TAKEOVER_INFLIGHT,
    }
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fleetmq-bench-") as tmp:
        brokers = {name: BROKERS[name](Path(tmp)) for name in args.broker_names}
        for checkout in args.baseline:  # before and after, side by side (ahead of this checkout's fleetmq)
            base = FleetmqAt(Path(tmp), checkout)
            mine = brokers.pop("fleetmq", None)
            brokers[base.name] = base
            if mine is not None:
                brokers["fleetmq"] = mine
        if args.compiled:  # (beside this checkout's interpreted fleetmq)
            brokers[FleetmqCompiled.name] = FleetmqCompiled(Path(tmp))
        settings["brokers"] = list(brokers)
        fleet = Fleet(Path(tmp)) if "fleetmq" in args.broker_names else None
        machine = report.machine_info(Mosquitto(Path(tmp)).version())
        machine["rumqttd"] = Rumqttd.VERSION
        start_error: dict[str, str] = {}
        try:
            for key in args.rows:
                if key in ("idle", "subscribed", "broadcast"):
                    continue
                if key in FLEET_ROWS:
                    rows += fleet_rows(key, brokers, fleet, start_error, binary, args)
                    continue
                if key in HOTPATH_ROWS:
                    if "fleetmq" in brokers:
                        rows.append(run_hotpath_row(key, args.baseline))
                    continue
                if key in memory.ROWS:
                    _stop_all(brokers, fleet)
                    rows.append(run_memory_row(key, brokers))
                    continue
                if key in STANDALONE_ROWS:  # (fleetmq's own processes: everything else out of the way)
                    if "fleetmq" in brokers:
                        _stop_all(brokers, fleet)
                        folder, run_row = STANDALONE_ROWS[key]
                        rows.append(run_row(key, Path(tmp) / folder, binary, args))
                    continue
                if key in API_LIST_ROWS:
                    if "fleetmq" in brokers:
                        for broker in brokers.values():
                            broker.stop()
                        if fleet is None:
                            fleet = Fleet(Path(tmp) / "fleet")
                        rows.append(run_api_list_row(fleet))
                    continue
                if fleet is not None:
                    fleet.stop()  # idle, but out of the way of the in-memory rows
                mode, q = key.rsplit("-q", 1)
                row = Row(mode, int(q))
                for name, broker in brokers.items():
                    err = ensure_running(broker, start_error)
                    if err:
                        row.cells[name] = Cell(error=err)
                        log(f"{key:20} {name:10} error: {err}")
                        continue
                    row.cells[name] = run_flow_cell(broker, binary, mode, int(q), args)
                    log_flow(key, name, row.cells[name])
                rows.append(row)
            if "idle" in args.rows:
                if fleet is not None:
                    fleet.stop()
                row = Row("idle", None)
                for name, broker in brokers.items():
                    if name not in ("mosquitto", "fleetmq"):
                        continue  # the idle row compares fleetmq's memory with mosquitto's
                    broker.stop()
                    cell = run_idle_cell(broker, binary, args.conns)
                    row.cells[name] = cell
                    if cell.result:
                        r = cell.result
                        log(
                            f"{'idle':10} {name:10} {r['connected']} conns  RSS {r['rss_before_kb'] / 1024:.1f}"
                            f" -> {r['rss_after_kb'] / 1024:.1f} MB ({r['per_conn_kb']:.2f} KB/conn)"
                            + (f"  error: {cell.error}" if cell.error else "")
                        )
                    else:
                        log(f"{'idle':10} {name:10} error: {cell.error}")
                rows.append(row)
            if "subscribed" in args.rows:
                if fleet is not None:
                    fleet.stop()
                row = Row("subscribed", None)
                for name, broker in brokers.items():
                    broker.stop()
                    cell = row.cells[name] = run_subscribed_cell(broker, binary, args.subscribed_conns)
                    log_subscribed(name, cell)
                rows.append(row)
            if "broadcast" in args.rows:
                if fleet is not None:
                    fleet.stop()
                row = Row("broadcast", None)
                for name, broker in brokers.items():
                    broker.stop()
                    cell = row.cells[name] = run_broadcast_cell(broker, binary, args.broadcast_conns, args)
                    log_broadcast(name, cell)
                rows.append(row)
        finally:
            _stop_all(brokers, fleet)
            _keep_logs(rows, brokers, fleet, args.out)

    md = report.markdown(rows, machine, settings, started)
    print(md)
    for path, text in (
        (args.out, md),
        (args.json, json.dumps(report.as_json(rows, machine, settings, started), indent=2) + "\n"),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    errored = any(c.error for r in rows for c in r.cells.values())
    return 1 if errored else 0


if __name__ == "__main__":
    sys.exit(main())
