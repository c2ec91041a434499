"""How the event log spreads over partitions (no server): keys over slots, records over partitions."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from fleetmq.broker.config import BrokerConfig
from fleetmq.broker.events import partition
from fleetmq.broker.eventschema import client_hash, sample_threshold, sampled
from fleetmq.broker.store import keys

P = keys.EVENT_PARTITIONS


def test_the_partitions_sit_evenly_over_the_slots():
    streams = keys.event_streams("edge")
    assert len(streams) == P == len(set(streams))
    assert all(s.startswith("fmq:eventlog:edge:{") for s in streams)
    assert keys.event_stream("edge") == "fmq:eventlog:edge" not in streams  # the name of old is not reused
    slots = [keys.slot_of(s) for s in streams]
    assert slots == sorted(slots) and len(set(slots)) == P
    # however a cluster splits the slot range evenly among its primaries (redis-cli --cluster create does),
    # each gets the same number of partitions, give or take one: 3 primaries get 5, 5 and 6
    for primaries in range(1, 9):
        bounds = [keys.SLOTS * i // primaries for i in range(primaries + 1)]
        counts = [sum(lo <= s < hi for s in slots) for lo, hi in itertools.pairwise(bounds)]
        assert max(counts) - min(counts) <= 1, (primaries, counts)
    assert keys.event_streams("other") != streams  # fleets sharing a Redis keep apart


def test_a_fleet_name_with_braces_is_refused():
    with pytest.raises(ValueError, match="braces"):
        keys.event_streams("a{b}")
    with pytest.raises(ValueError, match="fleet"):
        BrokerConfig.model_validate({"event_log": {"fleet": "x{y"}})


def test_messages_spread_evenly_over_the_partitions_sampled_or_not():
    start = 7_394_619_112_301  # a node numbers its messages in sequence from a random start
    ids = range(start, start + 64_000)
    assert set(Counter(partition(m, "") for m in ids).values()) == {64_000 // P}
    for sample in (0.3, 0.01):
        thr = sample_threshold(sample)
        kept = Counter(partition(m, "") for m in ids if sampled(m, thr))
        mean = sum(kept.values()) / P
        assert len(kept) == P and all(abs(n - mean) <= 0.1 * mean + 2 for n in kept.values()), kept


def test_records_of_no_message_go_by_client_evenly():
    clients = [client_hash(f"device-{i}") for i in range(16_000)]
    counts = Counter(partition(-1, c) for c in clients)
    assert len(counts) == P and all(800 <= n <= 1200 for n in counts.values()), counts
    assert all(partition(-1, c) == partition(-1, c) for c in clients[:10])  # stable, on every node
