"""The exporter against a real redis-server: layout, deduplication, and crash safety under SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fleetmq.broker.store.keys import event_stream as stream_key
from fleetmq.pipeline.export import DEFAULT_GROUP, PAUSE_AT_ENV, PAUSE_FILE_ENV, Exporter
from fleetmq.pipeline.streams import log_keys, part_name

from .conftest import FLEET, emit_events

pytestmark = pytest.mark.redis


def exported(out: Path) -> list[dict]:
    rows = []
    for f in sorted((out / "events").glob("date=*/zone=*/*.parquet")):
        zone = f.parent.name.removeprefix("zone=")
        rows += [{**r, "zone": zone, "file": f.name} for r in pq.read_table(f).to_pylist()]
    return rows


def pending(rs) -> int:
    """Entries handed out and not acknowledged, over the log's streams."""
    return sum(
        rs.command("XPENDING", key, DEFAULT_GROUP)[0] for key in log_keys(FLEET) if rs.command("EXISTS", key)
    )


def stream_of(rs, stream_id: str, eid: str) -> str:
    """The stream holding the entry ``stream_id`` with that eid."""
    for key in log_keys(FLEET):
        got = rs.command("XRANGE", key, stream_id, stream_id, decode=True)
        if got and dict(zip(got[0][1][::2], got[0][1][1::2], strict=True))["eid"] == eid:
            return key
    raise AssertionError(f"no stream holds {stream_id} ({eid})")


def test_export_writes_parquet_by_date_and_zone_and_acks(redis_server, tmp_path):
    written = emit_events(redis_server.url, 300, zones=("external", "internal"))
    # an entry from yesterday, and a resend of an entry already in the stream (same eid)
    key = stream_key(FLEET)
    yesterday = (time.time() - 86400) * 1000
    redis_server.command(
        "XADD", key, "*", "eid", "old-1", "ts_ms", repr(yesterday), "zone", "external", "event", "drop"
    )
    some_partition = next(k for k in log_keys(FLEET)[1:] if redis_server.command("XLEN", k))
    first = redis_server.command("XRANGE", some_partition, "-", "+", "COUNT", 1, decode=True)[0][1]
    redis_server.command("XADD", some_partition, "*", *first)  # (a writer resends to the same partition)
    stats = Exporter(redis_server.url, FLEET, tmp_path, batch=1000).run(once=True)
    rows = exported(tmp_path)
    assert stats.entries == written + 2 and stats.duplicates == 1 and stats.rows == written + 1
    assert len(rows) == written + 1 and len({r["eid"] for r in rows}) == len(rows)
    dates = {p.parent.parent.name for p in (tmp_path / "events").glob("date=*/zone=*/*.parquet")}
    assert len(dates) == 2
    assert {r["zone"] for r in rows} == {"external", "internal"}
    d = next(r for r in rows if r["event"] == "deliver" and r["msg_id"] == 7)
    assert (d["qos"], d["packet_id"], d["bytes"], d["inflight_len"], d["mqueue_len"], d["topic"]) == (
        1,
        7,
        10,
        1,
        0,
        "t/1",
    )
    assert d["node"] == "n1" and isinstance(d["ts_ms"], float) and d["stream_id"]
    assert pending(redis_server) == 0
    # names are the stream's short name and the stream ids of the file's own rows, all from that stream;
    # the partitions hold the brokers' records, the stream of old what the test put there
    parts = set()
    for f in {r["file"] for r in rows}:
        mine = sorted(
            (r for r in rows if r["file"] == f), key=lambda r: tuple(map(int, r["stream_id"].split("-")))
        )
        (stream,) = {stream_of(redis_server, r["stream_id"], r["eid"]) for r in mine}
        part = part_name(FLEET, stream)
        first, last = mine[0]["stream_id"], mine[-1]["stream_id"]
        assert f == (f"part-{part}-{first}-{last}.parquet" if part else f"part-{first}-{last}.parquet")
        parts.add(part)
    assert "" in parts and len(parts) >= 10, parts  # the messages spread over the partitions
    # nothing new: a second run writes nothing
    again = Exporter(redis_server.url, FLEET, tmp_path, batch=1000).run(once=True)
    assert again.entries == 0 and len(exported(tmp_path)) == len(rows)


def test_bad_values_become_null_and_trimmed_pending_entries_are_skipped(redis_server, tmp_path):
    key = stream_key(FLEET)
    now = repr(time.time() * 1000)
    redis_server.command(
        "XADD", key, "*", "eid", "x-1", "ts_ms", now, "zone", "z", "event", "deliver", "qos", "one"
    )
    Exporter(redis_server.url, FLEET, tmp_path).run(once=True)
    (row,) = exported(tmp_path)
    assert row["qos"] is None and row["event"] == "deliver"
    # entries handed out but not acknowledged, then trimmed by MAXLEN before a restart
    redis_server.command("XADD", key, "*", "eid", "x-2", "ts_ms", now, "zone", "z", "event", "ack")
    redis_server.command("XREADGROUP", "GROUP", DEFAULT_GROUP, "exporter", "COUNT", 10, "STREAMS", key, ">")
    redis_server.command("XTRIM", key, "MAXLEN", 0)
    stats = Exporter(redis_server.url, FLEET, tmp_path).run(once=True)
    assert stats.trimmed == 1 and pending(redis_server) == 0


def test_follow_mode_exports_what_arrives(redis_server, tmp_path):
    ex = Exporter(redis_server.url, FLEET, tmp_path, flush_interval=0.2, block_ms=100)
    emit_events(redis_server.url, 50)
    stats = ex.run(once=False, stop_after=1.0)
    assert stats.entries == 100 and len(exported(tmp_path)) == 100


def test_bad_input_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="fleet name"):
        Exporter("redis://127.0.0.1:1/0", "", tmp_path)
    with pytest.raises(ValueError, match="--batch"):
        Exporter("redis://127.0.0.1:1/0", FLEET, tmp_path, batch=0)
    r = subprocess.run(
        [sys.executable, "-m", "fleetmq.pipeline.cli", "export", "--redis-url", "redis://127.0.0.1:1/0", "--fleet",
         FLEET, "--out", str(tmp_path), "--once"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "cannot reach Redis" in r.stderr


def _export_proc(url: str, out: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetmq.pipeline.cli", "export", "--redis-url", url, "--fleet", FLEET,
         "--out", str(out), "--once", "--batch", "400"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("point", ["before_rename", "after_rename"])
def test_sigkill_at_the_worst_moment_loses_and_duplicates_nothing(redis_server, tmp_path, point):
    written = emit_events(redis_server.url, 500, zones=("external", "internal"))  # 1000 entries
    marker = tmp_path / "paused"
    out = tmp_path / "out"
    proc = _export_proc(redis_server.url, out, {PAUSE_AT_ENV: point, PAUSE_FILE_ENV: str(marker)})
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the exporter never reached the pause point"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # killed after writing its first batch (one stream's first 400 entries at most) before acknowledging it
    assert 0 < pending(redis_server) <= 400
    temporaries = list(out.glob("events/date=*/zone=*/.part-*.tmp"))
    if point == "before_rename":
        assert temporaries and not exported(out)
    else:
        assert not temporaries and len(exported(out)) > 0
    done = _export_proc(redis_server.url, out, {})
    _, stderr = done.communicate(timeout=60)
    assert done.returncode == 0, stderr
    rows = exported(out)
    eids = [r["eid"] for r in rows]
    assert len(eids) == written == 1000 and len(set(eids)) == 1000  # nothing lost, nothing twice
    assert pending(redis_server) == 0
    assert not list(out.glob("events/date=*/zone=*/.part-*.tmp"))
