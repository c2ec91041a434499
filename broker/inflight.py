"""The Inflight Window: QoS1/2 deliveries sent to a client and not yet acknowledged (EMQX's emqx_inflight).

A dict of packet id -> delivery whose insertion order is send order, the order retransmissions must keep
(a QoS2 entry keeps its place when it moves from PUBLISH to PUBREL). It is a dict itself, so the lookups a
delivery and its ack make (get, pop, `in`, len) are the dict's own, compiled or not; as a dict, iterating
it gives packet ids, its values() the deliveries in send order.
"""

from __future__ import annotations

from typing import Final

from .message import Delivery


class Inflight(dict[int, Delivery]):
    __slots__ = ("max_size",)

    def __init__(self, max_size: int = 0) -> None:
        super().__init__()
        self.max_size = max_size  # 0 = no limit

    def full(self) -> bool:
        return 0 < self.max_size <= len(self)

    def insert(self, delivery: Delivery) -> None:
        self[delivery.packet_id] = delivery


#: the window of every session that has not sent a QoS1/2 delivery yet: empty, read and never written
#: (Session._own_window makes a session's own at its first; an empty one is 72 bytes of every session)
UNMADE: Final = Inflight()
