"""The chaos harness (chaos/, `make chaos`) end to end, as `python -m chaos` is run: a short seeded run of
every fault against the real fleet must be clean, and deliberately broken fleets must make it fail, so a
clean run means something. Each run starts its own redis-server and three broker nodes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.nemesis import KINDS, applicable
from tests.integration.harness import MOSQUITTO

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(MOSQUITTO, reason="needs a fleetmq fleet"),
    pytest.mark.timeout(420),
]


def chaos(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    """Run `python -m chaos` from the repository root; (exit status, summary, the run's JSON)."""
    out = tmp_path / "run.json"
    p = subprocess.run(
        [sys.executable, "-m", "chaos", "--logs", str(tmp_path / "logs"), "--json", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    summary = p.stdout + p.stderr
    return p.returncode, summary, json.loads(out.read_text()) if out.exists() else {}


def test_short_seeded_run_of_every_fault_is_clean(tmp_path):
    """Seed 11415 with these gaps and holds injects all twelve kinds of fault of a single redis-server in
    40 s, the last about 28 s in (the nemesis's plan depends on the seed alone), while a publisher sends
    QoS 1 over the management API, whose 200s the checker holds to a PUBACK's rules."""
    code, summary, run = chaos(
        tmp_path,
        "--seed",
        "11415",
        "--duration",
        "40",
        "--gap",
        "0.5:1.5",
        "--max-down",
        "3",
        "--nemesis",
        "all",
    )
    assert code == 0, summary
    assert run["ok"] and not any(run["counts"].values()), summary
    assert {f["kind"] for f in run["faults"]} == {k for k in KINDS if applicable(k, "redis")}, summary
    assert (
        run["stats"]["acked"] > 1000
        and run["stats"]["delivered_first"] >= run["stats"]["expected_deliveries"]
    )
    (api,) = run["api"]
    assert api["answers"].get("200", 0) > 100, summary  # (every one of them checked as acked)
    assert "RESULT PASS seed=11415" in summary
    assert not list((tmp_path / "logs").rglob("store.json")), "a clean run's store dump was kept"


def test_it_fails_a_relay_that_loses_duplicates_and_reorders(tmp_path):
    """--broken relay: every node behind a relay that loses a QoS 1 delivery (acking it itself),
    delivers a QoS 2 message twice and swaps two messages of a topic, each a few times, and counts them.
    Each class is reported, and never more often than it was done."""
    code, summary, run = chaos(
        tmp_path, "--seed", "2", "--duration", "12", "--nemesis", "none", "--drain", "3", "--broken", "relay"
    )
    assert code == 1, summary
    for kind, done in (("lost", "lost"), ("duplicate", "duplicated"), ("order", "reordered")):
        assert 1 <= run["counts"][kind] <= run["relay"][done], (kind, summary)
    assert "RESULT FAIL seed=2" in summary
    # what the store held after the drain stays beside the logs, every key of it, for reading
    [dump] = (tmp_path / "logs").rglob("store.json")
    keys = json.loads(dump.read_text())["redis-0"]
    hashes = [v["value"] for k, v in keys.items() if "sub0-v4q1" in k and v["type"] == "hash"]
    fields = {base64.b64decode(f) for h in hashes for f in h}
    assert b"epoch" in fields, sorted(keys)[:20]  # (its session's meta, bytes as they were)


def test_it_fails_a_fleet_without_shared_sessions(tmp_path):
    """--broken memory: each node keeps sessions in memory, so messages do not cross nodes and a node's
    restart or a takeover loses sessions: lost messages and lost sessions are reported."""
    code, summary, run = chaos(
        tmp_path,
        "--seed",
        "2",
        "--duration",
        "15",
        "--nemesis",
        "nodes",
        "--drain",
        "3",
        "--broken",
        "memory",
    )
    assert code == 1, summary
    assert run["counts"]["lost"] > 0 and run["counts"]["session-lost"] > 0, summary
