"""Retained messages: the last retained message per topic, handed to new subscribers."""

from __future__ import annotations

from .message import Message
from .topic import is_wild, topic_matches


class Retained:
    __slots__ = ("_msgs",)

    def __init__(self) -> None:
        self._msgs: dict[str, Message] = {}

    def put(self, msg: Message) -> None:
        """Store a retained message; an empty payload clears the topic [MQTT-3.3.1-6]."""
        if msg.payload:
            self._msgs[msg.topic] = msg
        else:
            self._msgs.pop(msg.topic, None)

    def match(self, topic_filter: str, now: float) -> list[Message]:
        if not is_wild(topic_filter):
            found = self._msgs.get(topic_filter)
            candidates = [found] if found is not None else []
        else:
            candidates = [m for t, m in self._msgs.items() if topic_matches(topic_filter, t)]
        live = []
        for m in candidates:
            if m.expired(now):
                self._msgs.pop(m.topic, None)
            else:
                live.append(m)
        return live

    def __len__(self) -> int:
        return len(self._msgs)
