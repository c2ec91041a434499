"""Read a chaos run's store dump (`store.json`, chaos/run.py) as the broker's store means it: per session,
its meta (epoch, owner, receipt counters and marks), the journal and the queue with each delivery's
place, packet id, stage and receipt, and the awaiting-PUBREL records. The harness knows nothing of the
keys; this does, from the store's own modules.

    python -m scripts.storedump LOGS/store.json CLIENT_ID...
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fleetmq.broker.message import Delivery
from fleetmq.broker.store import keys, wire


def _b(text: str) -> bytes:
    return base64.b64decode(text)


def describe(d: Delivery) -> str:
    m = d.msg
    return (
        f"id={m.msg_id} order={d.order} pid={d.packet_id} stage={d.stage} qos={d.qos} "
        f"receipt={m.receipt} topic={m.topic} payload={m.payload[:48]!r}"
    )


def session(dump: dict[str, Any], client_id: str) -> list[str]:
    """What the dump holds of one session, as lines."""
    found: dict[str, dict[str, Any]] = {}
    for server_keys in dump.values():
        found.update(server_keys)
    m, _s, q, i, r = keys.session_keys(client_id)
    lines = [f"session {client_id}"]
    meta = found.get(m)
    if meta is None:
        return [*lines, "  (no meta: no such session)"]
    for field, value in sorted((_b(f), _b(v)) for f, v in meta["value"].items()):
        shown = value.hex() if field.startswith(b"d:") else value[:80]
        lines.append(f"  meta {field.decode(errors='replace')} = {shown!r}")
    journal = [wire.unpack_journal(_b(v)) for v in (found.get(i) or {"value": {}})["value"].values()]
    lines += [f"  journal {describe(d)}" for d in sorted(journal, key=lambda d: d.order)]
    queue: Iterable[str] = (found.get(q) or {"value": []})["value"]
    lines += [f"  queued {describe(wire.unpack_delivery(_b(v)))}" for v in queue]
    for pid, value in sorted(
        (int(_b(f)), _b(v)) for f, v in (found.get(r) or {"value": {}})["value"].items()
    ):
        lines.append(f"  awaiting PUBREL pid={pid} (time:receipt) {value.decode(errors='replace')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.storedump", description=__doc__.split("\n\n")[0])
    p.add_argument("dump", type=Path, help="a chaos run's store.json")
    p.add_argument("client_ids", nargs="+")
    args = p.parse_args(argv)
    dump = json.loads(args.dump.read_text())
    for cid in args.client_ids:
        sys.stdout.write("\n".join(session(dump, cid)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
