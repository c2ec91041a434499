"""Packet traces (broker/trace.py): what a record shows, what it never shows, and bounded buffers."""

from __future__ import annotations

import json

from fleetmq.broker import trace
from fleetmq.broker.codec import MQTT5, Connect, Puback, Publish, Suback, encode
from fleetmq.broker.trace import Outgoing, Tracer, TraceSpec, describe


def spec(kind="clientid", filter="c", limit=4) -> TraceSpec:
    return TraceSpec(name="t", kind=kind, filter=filter, start=0, end=10, payload_limit=limit)


def test_a_record_cuts_the_payload_and_never_holds_a_password():
    connect = describe(Connect("c", MQTT5, True, 30, username="u", password=b"secret"), 4)
    assert connect["type"] == "CONNECT" and connect["username"] == "u" and "secret" not in json.dumps(connect)
    pub = describe(Publish("a/b", b"hello world", 1, False, False, 7), 4)
    assert (pub["payload"], pub["payload_size"], pub["packet_id"]) == ("hell", 11, 7)
    binary = describe(Publish("a/b", b"\xff\xfe\xfd\xfc\xfb", 0), 4)
    assert (binary["payload"], binary["payload_encoding"]) == ("//79/A==", "base64")
    assert describe(Suback(3, [1, 0x87]), 4) == {"type": "SUBACK", "packet_id": 3, "reason_codes": [1, 0x87]}


def test_a_tracer_keeps_at_most_pending_max_records_and_says_how_many_it_dropped(monkeypatch):
    monkeypatch.setattr(trace, "PENDING_MAX", 3)
    t = Tracer(spec(), "n1")
    t.packets("c", "in", [Puback(i) for i in range(5)], 1.0)
    lines = t.take()
    assert [json.loads(x)["packet_id"] for x in lines[:-1]] == [0, 1, 2]
    assert json.loads(lines[-1]) == {"node": "n1", "dropped": 2} and t.take() == []


def test_a_topic_trace_records_only_what_its_filter_matches():
    t = Tracer(spec("topic", "a/#"), "n1")
    t.routed("pub", "a/b", 1, False, b"x", 1.0)
    t.routed("pub", "b/a", 1, False, b"x", 1.0)
    (line,) = t.take()
    assert json.loads(line)["topic"] == "a/b"


def test_outgoing_decodes_what_is_written_even_split_and_forwards_the_rest():
    written: list[bytes] = []
    seen: list = []

    class IO:
        def write(self, data: bytes) -> None:
            written.append(data)

        def close(self) -> str:
            return "closed"

    out = Outgoing(IO(), seen.extend, MQTT5)
    data = encode(Publish("a", b"xyz", 1, False, False, 9), MQTT5) + encode(Puback(4), MQTT5)
    out.write(data[:5])
    out.write(data[5:])
    assert b"".join(written) == data
    assert [type(p).__name__ for p in seen] == ["Publish", "Puback"]
    assert out.close() == "closed"
