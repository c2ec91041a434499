"""Retained messages: the last retained message per topic, handed to new subscribers."""

from __future__ import annotations

from collections.abc import Iterator

from .message import Message
from .topic import is_wild, topic_matches

#: topics a scan looks at without finding anything before it yields (None), so a subscriber can pace it
SCAN_STEP = 32


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

    def scan(self, topic_filter: str, now: float) -> Iterator[Message | None]:
        """The live retained messages a new subscription to `topic_filter` gets, found as they are taken.

        The topics are listed when the scan starts; each message is the one its topic holds when the scan
        gets there (one cleared meanwhile is skipped, a newer one sent instead: the subscription, made
        before, also got it live). A scan yields None after every SCAN_STEP topics that gave nothing, so a
        subscriber taking a batch per loop turn (Channel) never searches a large store in one go; a
        subscriber that stops taking holds only the list of topics.
        """
        msgs = self._msgs
        topics = list(msgs) if is_wild(topic_filter) else [topic_filter]
        idle = 0
        for topic in topics:
            m = msgs.get(topic)
            if m is not None and topic_matches(topic_filter, topic):
                if not m.expired(now):
                    yield m
                    continue
                del msgs[topic]
            idle += 1
            if idle == SCAN_STEP:
                idle = 0
                yield None

    def match(self, topic_filter: str, now: float) -> list[Message]:
        """Every live retained message `topic_filter` matches, at once."""
        return [m for m in self.scan(topic_filter, now) if m is not None]

    def __len__(self) -> int:
        return len(self._msgs)
