"""The Message Queue: deliveries waiting for room in the Inflight Window or for the client to come back.

EMQX semantics: FIFO; when full, the new message is queued and the oldest is dropped (and counted).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from .message import Delivery


class MQueue:
    __slots__ = ("_q", "max_len")

    def __init__(self, max_len: int = 0) -> None:
        self.max_len = max_len  # 0 = no limit
        self._q: deque[Delivery] = deque()

    def push(self, delivery: Delivery) -> list[Delivery]:
        """Queue a delivery; return the oldest ones dropped to stay within max_len."""
        q = self._q
        q.append(delivery)
        if self.max_len and len(q) > self.max_len:
            return [q.popleft() for _ in range(len(q) - self.max_len)]
        return []

    def pop(self) -> Delivery | None:
        return self._q.popleft() if self._q else None

    def trim(self) -> list[Delivery]:
        """Drop the oldest entries beyond max_len (after the zone's limit was lowered)."""
        q = self._q
        if self.max_len and len(q) > self.max_len:
            return [q.popleft() for _ in range(len(q) - self.max_len)]
        return []

    def take(self, pred: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take out every delivery `pred` picks, keeping the others in order."""
        taken: list[Delivery] = []
        kept: deque[Delivery] = deque()
        for d in self._q:
            (taken if pred(d) else kept).append(d)
        if taken:
            self._q = kept
        return taken

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(self._q)
