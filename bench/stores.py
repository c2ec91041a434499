"""The replicated session stores the store rows compare with the bench's single redis-server: a primary
with two replicas and three sentinels (tests/support.py's ReplicatedRedis), and a Redis Cluster of three
primaries with a replica each (RedisCluster), all without persistence like the bench's Redis, so that the
rows show what replication and sharding cost, not the disk. A StoreNode is fleetmq node `a`'s config
pointed at one of them (`store:` as docs/design.md's config forms)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.brokers import HOST, BrokerError
from bench.fleet import BenchRedis, FleetNode
from tests.support import RedisCluster, RedisServer, ReplicatedRedis


class StoreNode(FleetNode):
    """fleetmq node `a` (the same zones and listeners as the fleet's) on another store."""

    def __init__(self, workdir: Path, variant: str, store: dict[str, Any]) -> None:
        self.store = store
        super().__init__(workdir / variant, "a", BenchRedis(workdir / variant))
        self.name = f"fleetmq-{variant}"

    def command(self) -> list[str]:
        cmd = super().command()
        cfg = self.workdir / "fleetmq.yaml"
        lines = cfg.read_text().splitlines()
        cfg.write_text(
            "\n".join(f"store: {json.dumps(self.store)}" if ln.startswith("store:") else ln for ln in lines)
            + "\n"
        )
        i = cmd.index("--redis-url")
        return cmd[:i] + cmd[i + 2 :]


class Deployment:
    """A store the row starts once and stops at its end; `servers` are its redis-servers."""

    def __init__(self, name: str, servers: list[RedisServer], stop: Any, store: dict[str, Any]) -> None:
        self.name, self.servers, self._stop, self.store = name, servers, stop, store

    def primaries(self) -> list[RedisServer]:
        return [r for r in self.servers if r.alive() and r.info("replication").get("role") == "master"]

    def stop(self) -> None:
        self._stop()


def sentinel(workdir: Path) -> Deployment:
    try:
        rr = ReplicatedRedis(workdir / "sentinel", replicas=2, sentinels=3, appendonly=False)
    except (RuntimeError, AssertionError, OSError) as e:
        raise BrokerError(f"Sentinel deployment did not start: {e}") from e
    return Deployment("sentinel", rr.servers, rr.stop, rr.store())


def cluster(workdir: Path) -> Deployment:
    try:
        rc = RedisCluster(workdir / "cluster", shards=3, replicas=1, appendonly=False)
    except (RuntimeError, AssertionError, OSError) as e:
        raise BrokerError(f"Redis Cluster did not start: {e}") from e
    return Deployment("cluster", rc.servers, rc.stop, rc.store())


def shard_snapshot(dep: Deployment) -> dict[str, tuple[int, int]]:
    """Per primary (HOST:PORT): its keys and the commands it has run (INFO commandstats, scripts' calls
    included)."""
    out = {}
    for r in dep.primaries():
        out[f"{HOST}:{r.port}"] = (int(r.command("DBSIZE")), sum(r.commandstats().values()))
    return out


def balance(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Each primary's keys (at the end) and commands (over the run), and the largest deviation of each
    from their mean, as a fraction (0.25: a shard within ±25%)."""
    keys = {p: after[p][0] for p in after}
    ops = {p: after[p][1] - before.get(p, (0, 0))[1] for p in after}

    def spread(values: dict[str, int]) -> float:
        mean = sum(values.values()) / len(values) if values else 0.0
        return max(abs(v - mean) / mean for v in values.values()) if mean else float("nan")

    return {"keys": keys, "ops": ops, "keys_spread": spread(keys), "ops_spread": spread(ops)}
