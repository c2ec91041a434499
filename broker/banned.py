"""Banned clients and flapping detection (EMQX's banned list and flapping_detect).

A ban names a client id, a username or a peer address, with a reason and an expiry; the fleet keeps its
bans in the store (``keys.BANNED``), every node a copy it refreshes with each heartbeat, so a CONNECT is
checked against three dictionary lookups and no round trip. A client id that connects more than
``max_count`` times within ``window`` on a node is flapping: it is banned for ``ban_time``, fleet-wide.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BanKind = Literal["clientid", "username", "peerhost"]
#: client ids whose recent connects a node remembers for flapping detection: the oldest go first
FLAPPING_TRACKED = 100_000


class Ban(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    kind: BanKind = Field(alias="as", description="What `who` is: a client id, a username or an address")
    who: str = Field(min_length=1, max_length=65535)
    reason: str = Field("", max_length=1024)
    by: str = Field("", description="The API key, or `flapping`")
    at: float = Field(0, description="Unix time it was made")
    until: float | None = Field(None, description="Unix time it ends; none: never")

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.who}"

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


class BanList:
    """A node's copy of the fleet's bans."""

    def __init__(self) -> None:
        self._bans: dict[str, Ban] = {}

    def __len__(self) -> int:
        return len(self._bans)

    def replace(self, bans: Iterable[Ban]) -> list[Ban]:
        """Take the fleet's bans as read from the store; returns those new to this copy."""
        fresh = {b.key: b for b in bans}
        new = [b for k, b in fresh.items() if k not in self._bans]
        self._bans = fresh
        return new

    def put(self, ban: Ban) -> None:
        self._bans[ban.key] = ban

    def remove(self, key: str) -> bool:
        return self._bans.pop(key, None) is not None

    def hit(self, client_id: str, username: str | None, peerhost: str, now: float) -> Ban | None:
        if not self._bans:
            return None
        for key in (f"clientid:{client_id}", f"username:{username}" if username is not None else "",
                    f"peerhost:{peerhost}"):  # fmt: skip
            ban = self._bans.get(key)
            if ban is not None and ban.active(now):
                return ban
        return None

    def all(self, now: float) -> list[Ban]:
        return sorted((b for b in self._bans.values() if b.active(now)), key=lambda b: (b.kind, b.who))


class Flapping:
    """Connects per client id on this node within a sliding window; bounded by FLAPPING_TRACKED ids."""

    def __init__(self, max_count: int, window: float) -> None:
        self.max_count = max_count
        self.window = window
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def connected(self, client_id: str, now: float) -> bool:
        """Count a CONNECT; whether the client id is flapping (more than max_count in the window)."""
        times = self._seen.pop(client_id, None)
        if times is None:
            times = deque(maxlen=self.max_count + 1)
        times.append(now)
        self._seen[client_id] = times  # (to the end: the most recently seen)
        while len(self._seen) > FLAPPING_TRACKED:
            self._seen.popitem(last=False)
        return len(times) > self.max_count and now - times[0] <= self.window

    def forget(self, client_id: str) -> None:
        self._seen.pop(client_id, None)
