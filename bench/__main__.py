"""Run every scenario against mosquitto and fleetmq back to back and print a Markdown table.

Usage: python -m bench [--duration 5] [--warmup 1] [--only pt2pt-q1,idle] [--brokers mosquitto,fleetmq]
Exit status is 0 when every cell ran (targets missed are still exit 0: this is a report),
1 when anything errored (a broker failed to start, a scenario failed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import driver, procs, report
from bench.brokers import BROKERS, Broker, BrokerError, Mosquitto
from bench.report import Cell, Row

MODES = ("pt2pt", "fanout", "fanin")
ALL_ROWS = [f"{m}-q{q}" for m in MODES for q in (0, 1, 2)] + ["idle"]
IDLE_SETTLE_S = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each measurement")
    p.add_argument("--only", default="", help=f"comma-separated rows from: {','.join(ALL_ROWS)}")
    p.add_argument("--brokers", default="mosquitto,fleetmq", help="comma-separated: mosquitto,fleetmq")
    p.add_argument("--conns", type=int, default=10000, help="connections for the idle-memory row")
    p.add_argument("--window", type=int, default=200, help="max outstanding messages per publisher")
    p.add_argument("--payload", type=int, default=64, help="payload bytes")
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


def run_flow_cell(broker: Broker, binary: Path, mode: str, qos: int, args: argparse.Namespace) -> Cell:
    cpu0, (busy0, irq0) = procs.cpu_seconds(broker.pid), procs.system_cpu_seconds()
    try:
        res = driver.run_flow(
            binary,
            broker.port,
            mode,
            qos,
            duration=args.duration,
            warmup=args.warmup,
            window=args.window,
            payload=args.payload,
        )
    except driver.LoadgenError as e:
        err = str(e)
        if not broker.alive():
            err = f"{err} ({broker.exit_reason()})"
        return Cell(error=err)
    broker_cpu = procs.cpu_seconds(broker.pid) - cpu0
    busy1, irq1 = procs.system_cpu_seconds()
    other = busy1 - busy0 - broker_cpu - float(res.get("loadgen_cpu_s", 0.0))
    return Cell(result=res, broker_cpu_s=broker_cpu, other_cpu_s=max(0.0, other), softirq_cpu_s=irq1 - irq0)


def run_idle_cell(broker: Broker, binary: Path, conns: int) -> Cell:
    """Fresh broker, RSS before, open `conns` idle connections, settle, RSS after."""
    try:
        broker.start()
    except BrokerError as e:
        return Cell(error=str(e))
    try:
        time.sleep(1.0)
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
    finally:
        broker.stop()


def _keep_logs(rows: list[Row], brokers: dict[str, Broker], out: Path) -> None:
    """Copy the log of every broker that had an error next to the report (the workdir is temporary)."""
    failed = {name for r in rows for name, c in r.cells.items() if c.error}
    for name in sorted(failed):
        log_path = brokers[name].log_path
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
        "brokers": args.broker_names,
    }
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fleetmq-bench-") as tmp:
        brokers = {name: BROKERS[name](Path(tmp)) for name in args.broker_names}
        machine = report.machine_info(Mosquitto(Path(tmp)).version())
        start_error: dict[str, str] = {}
        try:
            for key in args.rows:
                if key == "idle":
                    continue
                mode, q = key.rsplit("-q", 1)
                row = Row(mode, int(q))
                for name, broker in brokers.items():
                    err = ensure_running(broker, start_error)
                    if err:
                        row.cells[name] = Cell(error=err)
                        log(f"{key:10} {name:10} error: {err}")
                        continue
                    cell = run_flow_cell(broker, binary, mode, int(q), args)
                    row.cells[name] = cell
                    if cell.result:
                        r = cell.result
                        log(
                            f"{key:10} {name:10} {r['msgs_per_s']:>10,.0f} msg/s  p50 {r['p50_us']:>9,.0f} µs  "
                            f"p99 {r['p99_us']:>9,.0f} µs  lost {r['lost']} dup {r['dup']}  "
                            f"cpu broker {cell.broker_cpu_s:.1f}s loadgen {r['loadgen_cpu_s']:.1f}s softirq {cell.softirq_cpu_s:.1f}s other {cell.other_cpu_s:.1f}s"
                        )
                    else:
                        log(f"{key:10} {name:10} error: {cell.error}")
                rows.append(row)
            if "idle" in args.rows:
                row = Row("idle", None)
                for name, broker in brokers.items():
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
        finally:
            for broker in brokers.values():
                broker.stop()
            _keep_logs(rows, brokers, args.out)

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
