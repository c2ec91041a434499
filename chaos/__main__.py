"""python -m chaos [--seed S] [--duration D] [--nodes N] [--nemesis all|KIND,...] [--runs K] ...

Runs a fleetmq fleet under a seeded nemesis, checks what the clients saw, prints one summary per run
(and a total over --runs), exits 0 when every run was clean, 1 on any violation, 2 when the harness
itself could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml

from chaos.checker import Report
from chaos.history import History
from chaos.nemesis import KINDS, PRESETS, parse_kinds
from chaos.run import Options, run, summary, to_json, write_json


def _gap(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    return float(lo), float(hi or lo)


async def _interruptible(opts: Options) -> tuple[History, Report, dict[str, Any]]:
    """The run, cancelled by SIGINT or SIGTERM so that it stops its processes on the way out (a background
    job ignores SIGINT, and atexit does not run on SIGTERM)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    return await run(opts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[1])
    p.add_argument("--seed", type=int, default=1, help="seeds the nemesis and every client (default 1)")
    p.add_argument("--runs", type=int, default=1, help="runs with seeds S, S+1, ... (default 1)")
    p.add_argument(
        "--duration", type=float, default=60, help="seconds under the nemesis per run (default 60)"
    )
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument(
        "--store",
        choices=["redis", "sentinel", "cluster"],
        default="redis",
        help="redis: one redis-server, each node through a proxy (default); sentinel: a primary, 2 "
        "replicas, 3 sentinels; cluster: a Redis Cluster of 3 primaries and 3 replicas (wait_replicas 1 "
        "for both, every server behind a proxy that it announces, so nodes, sentinels and replicas reach "
        "it only through that)",
    )
    p.add_argument(
        "--nemesis",
        default="all",
        help="comma-separated faults and sets of faults, 'all' (default) or 'none'; faults: "
        + ",".join(KINDS)
        + "; sets: "
        + "; ".join(f"{name}={','.join(kinds)}" for name, kinds in PRESETS.items() if name != "all"),
    )
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--subscribers", type=int, default=4)
    p.add_argument("--rate", type=float, default=20, help="messages a second per publisher (default 20)")
    p.add_argument("--topics", type=int, default=2, help="topics per publisher (default 2)")
    p.add_argument("--window", type=int, default=8, help="publisher's in-flight window (default 8)")
    p.add_argument("--gap", type=_gap, default=(1.0, 4.0), help="healthy seconds between faults, MIN:MAX")
    p.add_argument("--max-down", type=float, default=8.0, help="longest fault in seconds (default 8)")
    p.add_argument("--drain", type=float, default=30, help="seconds to drain after healing (default 30)")
    p.add_argument(
        "--stuck-after",
        type=float,
        default=10.0,
        help="an acked message not delivered after this many healthy connected seconds is stuck (default 10)",
    )
    p.add_argument(
        "--zone", action="append", default=[], metavar="KEY=VALUE", help="zone setting (YAML value)"
    )
    p.add_argument(
        "--broken",
        choices=["memory", "redis-no-aof", "relay"],
        help="a deliberately broken fleet: 'memory' gives every node the in-memory store (sessions die with "
        "their node and do not cross nodes), 'redis-no-aof' runs redis-server without persistence, 'relay' "
        "puts a relay in front of every node that loses, duplicates and reorders a few deliveries",
    )
    p.add_argument(
        "--direct",
        action="store_true",
        help="no proxies: the nodes (and sentinels, replicas) reach the Redis servers directly, as pods "
        "reach a Redis Service (so no proxy faults)",
    )
    p.add_argument(
        "--identity",
        action="store_true",
        help="every client is user 'chaos', authenticated and authorized per topic by an HTTP service the "
        "run starts (acl_url), with max_connections_per_user set to the number of clients",
    )
    p.add_argument(
        "--no-api",
        action="store_true",
        help="the nodes serve no management API (by default each does; a publisher sends QoS 1 over "
        "POST /api/v1/publish, and the api-kick fault disconnects clients through it)",
    )
    p.add_argument("--logs", type=Path, help="directory for node and Redis logs (default chaos/results/...)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--history", type=Path, help="write everything the clients saw as JSON here (large)")
    p.add_argument("--examples", type=int, default=5, help="examples shown per violation class")
    a = p.parse_args(argv)
    try:
        kinds = parse_kinds(a.nemesis)
    except ValueError as e:
        p.error(str(e))
    zone = {}
    for kv in a.zone:
        k, _, v = kv.partition("=")
        zone[k] = yaml.safe_load(v)
    results = []
    for i in range(a.runs):
        opts = Options(
            seed=a.seed + i, duration=a.duration, nodes=a.nodes, kinds=kinds, publishers=a.publishers,
            subscribers=a.subscribers, rate=a.rate, topics=a.topics, window=a.window, gap=a.gap,
            max_down=a.max_down, drain=a.drain, stuck_after=a.stuck_after, zone=zone, identity=a.identity,
            store="memory" if a.broken == "memory" else a.store, aof=a.broken != "redis-no-aof",
            relay=a.broken == "relay", proxied=not a.direct, api=not a.no_api,
            logs=(a.logs / f"seed{a.seed + i}") if a.logs else None, examples=a.examples,
        )  # fmt: skip
        try:
            h, rep, extra = asyncio.run(_interruptible(opts))
        except (asyncio.CancelledError, KeyboardInterrupt):
            print(f"RESULT INTERRUPTED seed={opts.seed}", flush=True)
            return 2
        except Exception:
            traceback.print_exc()
            print(f"RESULT ERROR seed={opts.seed}: the harness could not run", flush=True)
            return 2
        print(summary(opts, h, rep, extra), flush=True)
        results.append(to_json(opts, h, rep, extra))
        if a.history:
            write_json(
                a.history if a.runs == 1 else a.history.with_suffix(f".seed{opts.seed}.json"), h.to_json()
            )
        if a.runs > 1:
            print(flush=True)
    if a.runs > 1:
        clean = [r for r in results if r["ok"]]
        print(
            f"TOTAL {len(clean)}/{len(results)} runs clean; fault-minutes clean "
            f"{sum(r['fault_minutes'] for r in clean):.1f} of {sum(r['fault_minutes'] for r in results):.1f}; "
            f"failing seeds: {[r['seed'] for r in results if not r['ok']] or 'none'}"
        )
    if a.json:
        write_json(a.json, results[0] if len(results) == 1 else {"runs": results})
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
