"""scripts/storedump.py reads a chaos run's store dump as the store means it."""

from __future__ import annotations

import base64

from fleetmq.broker.message import Delivery, Message
from fleetmq.broker.store import keys, wire

from scripts.storedump import session


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_session_s_copies_of_a_message_show_with_their_receipts_and_places():
    own = Delivery(Message("t/x", b"m1", 2, sender="pub"), 2, False)
    own.msg.receipt, own.order, own.packet_id = ("inc9", 5), 3, 7
    queued = Delivery(Message("t/x", b"m1", 2, sender="pub"), 2, False)
    queued.msg.receipt = ("inc9", 5)
    m, _s, q, i, r = keys.session_keys("sub-1")
    dump = {
        "redis-0": {
            m: {"type": "hash", "value": {b64(b"epoch"): b64(b"4"), b64(b"x:inc9"): b64(b"5")}},
            i: {
                "type": "hash",
                "value": {b64(wire.journal_field(own.msg.msg_id)): b64(wire.journal_value(own))},
            },
            q: {"type": "list", "value": [b64(wire.pack_delivery(queued))]},
            r: {"type": "hash", "value": {b64(b"12"): b64(b"1795800000.5:3")}},
        }
    }
    lines = session(dump, "sub-1")
    assert "  meta epoch = b'4'" in lines and "  meta x:inc9 = b'5'" in lines
    [journal] = [line for line in lines if line.startswith("  journal ")]
    assert "order=3 pid=7" in journal and "receipt=('inc9', 5)" in journal
    [queue] = [line for line in lines if line.startswith("  queued ")]
    assert f"id={queued.msg.msg_id}" in queue and "pid=0" in queue and "receipt=('inc9', 5)" in queue
    assert "  awaiting PUBREL pid=12 (time:receipt) 1795800000.5:3" in lines
    assert session(dump, "nobody") == ["session nobody", "  (no meta: no such session)"]
