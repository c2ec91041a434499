"""The Message Queue: deliveries waiting for room in the Inflight Window or for the client to come back.

EMQX semantics: FIFO; when full, the new message is queued and the oldest is dropped (and counted). It is
a deque itself, so the tests a delivery makes (truthiness, length) and the refill's popleft are the
deque's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .message import Delivery


class MQueue(deque[Delivery]):
    __slots__ = ("max_len",)

    def __init__(self, max_len: int = 0) -> None:
        super().__init__()
        self.max_len = max_len  # 0 = no limit

    def push(self, delivery: Delivery) -> list[Delivery]:
        """Queue a delivery; return the oldest ones dropped to stay within max_len."""
        self.append(delivery)
        return self.trim()

    def trim(self) -> list[Delivery]:
        """Drop the oldest entries beyond max_len (after a push, or after the zone's limit was lowered)."""
        if self.max_len and len(self) > self.max_len:
            return [self.popleft() for _ in range(len(self) - self.max_len)]
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
