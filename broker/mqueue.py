"""The Message Queue: deliveries waiting for room in the Inflight Window or for the client to come back.

EMQX semantics: FIFO; when full, the new message is queued and the oldest is dropped (and counted), or,
with `drop_new` (the zone's `mqueue_overflow: dropNew`, a bridge's `overflow`), the new message is. It is
a deque itself, so the tests a delivery makes (truthiness, length) and the refill's popleft are the
deque's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .message import Delivery


class MQueue(deque[Delivery]):
    __slots__ = ("drop_new", "max_len")

    def __init__(self, max_len: int = 0, drop_new: bool = False) -> None:
        super().__init__()
        self.max_len = max_len  # 0 = no limit
        self.drop_new = drop_new

    def push(self, delivery: Delivery) -> list[Delivery]:
        """Queue a delivery; return the ones dropped to stay within max_len (it, or the oldest)."""
        if self.drop_new and self.max_len and len(self) >= self.max_len:
            return [delivery]
        self.append(delivery)
        return self.trim()

    def trim(self) -> list[Delivery]:
        """Drop the entries beyond max_len (after a push, or after the zone's limit was lowered): the
        oldest, or with drop_new the newest."""
        if self.max_len and len(self) > self.max_len:
            pop = self.pop if self.drop_new else self.popleft
            gone = [pop() for _ in range(len(self) - self.max_len)]
            if self.drop_new:
                gone.reverse()
            return gone
        return []

    def take(self, pred: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take out every delivery `pred` picks, keeping the others in order."""
        kept: list[Delivery] = []
        taken: list[Delivery] = []
        for d in self:
            (taken if pred(d) else kept).append(d)
        if taken:
            self.clear()
            self.extend(kept)
        return taken
