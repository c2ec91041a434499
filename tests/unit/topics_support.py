"""MQTT topic matching written independently of the broker's router, for tests to check it against."""

from __future__ import annotations


def reference_match(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7, recursive over levels; wildcards at the first level never match a '$' topic."""
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False

    def rec(f: list[str], t: list[str]) -> bool:
        if not f:
            return not t
        if f[0] == "#":
            return True
        if not t:
            return False
        return (f[0] == "+" or f[0] == t[0]) and rec(f[1:], t[1:])

    return rec(topic_filter.split("/"), topic.split("/"))
