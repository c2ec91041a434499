"""The Message Queue: deliveries waiting for room in the Inflight Window or for the client to come back.

EMQX semantics: FIFO; when full, the new message is queued and the oldest is dropped (and counted), or,
with `drop_new` (the zone's `mqueue_overflow: dropNew`, a bridge's `overflow`), the new message is. It is
a deque itself, so the tests a delivery makes (truthiness, length) and the refill's popleft are the
deque's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

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


class _Unmade(MQueue):
    """The queue of a session that has not queued anything yet, shared by all of them: a deque is a
    760-byte block even when empty, and most sessions of a fleet are idle subscribers whose deliveries go
    straight into the window. Reading it is reading an empty queue; Session makes a queue of its own
    before it adds to one, and adding to this one is a bug that must not pass silently."""

    __slots__ = ()

    def _shared(self, *_: object) -> None:
        raise RuntimeError("the shared empty Message Queue cannot hold deliveries")

    append = appendleft = extend = extendleft = insert = _shared


UNMADE: MQueue = _Unmade()


def size(d: Delivery) -> int:
    """What a delivery counts for against a byte limit: its payload and topic."""
    return len(d.msg.payload) + len(d.msg.topic)


class BytesMQueue(MQueue):
    """An MQueue bounded by bytes too (a bridge's `queue.maxBytes`, a zone's max_mqueue_bytes). Every way
    a delivery enters or leaves keeps the count; zones without a byte limit use the plain MQueue, whose
    refill pops stay the deque's own."""

    __slots__ = ("bytes", "max_bytes")

    def __init__(self, max_len: int = 0, drop_new: bool = False, max_bytes: int = 0) -> None:
        super().__init__(max_len, drop_new)
        self.max_bytes = max_bytes
        self.bytes = 0

    def append(self, d: Delivery) -> None:
        super().append(d)
        self.bytes += size(d)

    def extend(self, ds: Iterable[Delivery]) -> None:
        for d in ds:
            self.append(d)

    def insert(self, i: int, d: Delivery) -> None:
        super().insert(i, d)
        self.bytes += size(d)

    def popleft(self) -> Delivery:
        d = super().popleft()
        self.bytes -= size(d)
        return d

    def pop(self) -> Delivery:  # type: ignore[override]
        d = super().pop()
        self.bytes -= size(d)
        return d

    def clear(self) -> None:
        super().clear()
        self.bytes = 0

    def push(self, delivery: Delivery) -> list[Delivery]:
        if self.drop_new and self.bytes + size(delivery) > self.max_bytes:
            return [delivery]
        return super().push(delivery)

    def trim(self) -> list[Delivery]:
        gone = super().trim()
        pop = self.pop if self.drop_new else self.popleft
        while self.bytes > self.max_bytes and self:
            gone.append(pop())
        return gone


def for_zone(max_len: int, drop_new: bool, max_bytes: int, old: MQueue | None = None) -> MQueue:
    """The queue a zone's settings call for, holding what `old` held (not trimmed yet: see `trim`): `old`
    itself when it is of the right kind."""
    if old is UNMADE:
        old = None
    if old is not None and isinstance(old, BytesMQueue) == bool(max_bytes):
        old.max_len, old.drop_new = max_len, drop_new
        if isinstance(old, BytesMQueue):
            old.max_bytes = max_bytes
        return old
    q = BytesMQueue(max_len, drop_new, max_bytes) if max_bytes else MQueue(max_len, drop_new)
    if old is not None:
        q.extend(old)
    return q
