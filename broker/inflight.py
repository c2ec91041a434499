"""The Inflight Window: QoS1/2 deliveries sent to a client and not yet acknowledged (EMQX's emqx_inflight).

Insertion order is send order, which is the order retransmissions must keep; a QoS2 entry keeps its place
when it moves from PUBLISH to PUBREL.
"""

from __future__ import annotations

from collections.abc import Iterator

from .message import Delivery


class Inflight:
    __slots__ = ("_entries", "max_size")

    def __init__(self, max_size: int = 0) -> None:
        self.max_size = max_size  # 0 = no limit
        self._entries: dict[int, Delivery] = {}

    def full(self) -> bool:
        return 0 < self.max_size <= len(self._entries)

    def insert(self, delivery: Delivery) -> None:
        self._entries[delivery.packet_id] = delivery

    def get(self, packet_id: int) -> Delivery | None:
        return self._entries.get(packet_id)

    def pop(self, packet_id: int) -> Delivery | None:
        return self._entries.pop(packet_id, None)

    def __contains__(self, packet_id: int) -> bool:
        return packet_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(list(self._entries.values()))
