"""Pulling what other nodes queued in Redis for a session connected here (cluster.Cluster): one pull per
session at a time, so the positions a pull reserves follow the order in which Redis runs the pulls."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetmq.broker.cluster import Cluster
from fleetmq.broker.metrics import Metrics
from fleetmq.broker.store.keys import Channels


class Journal:
    def __init__(self) -> None:
        self.next = 0

    def reserve(self, n: int) -> int:
        first, self.next = self.next, self.next + n
        return first


class FakeSession:
    epoch = 1
    held_from = None

    def __init__(self) -> None:
        self.journal = Journal()


class Sessions:
    def __init__(self) -> None:
        self.s = FakeSession()
        self.delivered: list[Any] = []

    def session_of(self, cid: str) -> FakeSession | None:
        return self.s if cid == "sub" else None

    def deliver_stored(self, cid: str, epoch: int, deliveries: Any) -> None:
        self.delivered += list(deliveries)


class Store:
    """A pull that waits until the test lets it return; counts pulls in flight."""

    channels = Channels(sharded=False)

    def __init__(self) -> None:
        self.in_flight = self.most = 0
        self.firsts: list[int] = []
        self.go = asyncio.Event()

    async def pull(self, targets: list[tuple[str, int, int]], n: int) -> list[Any]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.firsts += [first for _cid, _epoch, first in targets]
        await self.go.wait()
        self.in_flight -= 1
        return [[first, []] for _cid, _epoch, first in targets]


async def test_one_pull_per_session_at_a_time():
    """Found by `python -m chaos --seed 201` (order violations when a Redis latency fault ended): a wake
    came while a pull of the same session was on its way; the second pull reserved later positions but
    reached Redis first (another connection, no latency any more) and took the older messages, the first
    took the newer ones into the earlier positions, and every subscriber got #462 before #460. A wake
    during a pull now pulls again once that pull is back."""
    store, sessions = Store(), Sessions()
    tasks: list[asyncio.Task[Any]] = []
    cluster = Cluster(
        "n0",
        store,
        sessions,
        None,
        None,
        Metrics(),
        lambda c: tasks.append(asyncio.ensure_future(c)) or tasks[-1],
        dict,
    )  # type: ignore[arg-type]
    cluster.wake("sub")
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.in_flight == 1
    cluster.wake("sub")  # more was queued while the first pull is on its way
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.most == 1, "a second pull of the same session while the first is in flight"
    store.go.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert store.firsts == [0, 1000], "the wake during the pull is not lost: one more pull follows"
    assert store.most == 1
