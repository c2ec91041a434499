"""Topic names and filters (EMQX's emqx_topic): syntax, matching, and how two filters relate.

`covers` and `overlaps` compare two filters as the sets of topic names they match, which is what access
control needs to decide at SUBSCRIBE time whether a filter can reach a denied topic at all. All three
relations honour [MQTT-4.7.2-1]: a filter starting with a wildcard never matches a topic starting with '$'.
"""

from __future__ import annotations

SHARE_PREFIX = "$share/"


def parse_share(topic_filter: str) -> tuple[str | None, str]:
    """Split ``$share/group/filter`` into (group, filter); (None, filter) for a normal filter."""
    if topic_filter.startswith(SHARE_PREFIX):
        rest = topic_filter[len(SHARE_PREFIX) :]
        group, sep, real = rest.partition("/")
        if not sep:
            return group, ""
        return group, real
    return None, topic_filter


def valid_filter(topic_filter: str) -> bool:
    """Topic filter syntax [MQTT-4.7.1]: '#' last and alone in its level, '+' alone in its level."""
    group, real = parse_share(topic_filter)
    if group is not None and (not group or "+" in group or "#" in group):
        return False
    if not real or len(real) > 65535:
        return False
    levels = real.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def valid_topic(topic: str) -> bool:
    return bool(topic) and "+" not in topic and "#" not in topic


#: Topics longer than this (in characters) are not cached by topic (the router's matches, ACL decisions):
#: a cache holds every topic it keeps, so its bytes stay bounded by its entries times this, whatever
#: topics clients make up. (The codec's cache of topic bytes has the same limit: codec._TOPIC_CACHE_MAX_LEN.)
CACHED_TOPIC_MAX = 256


def is_sys(topic: str) -> bool:
    """A topic of the server's own ($SYS, MQTT 5 section 4.7.2): clients may not publish on it unless an
    ACL rule says so explicitly."""
    return topic.startswith("$SYS") and (len(topic) == 4 or topic[4] == "/")


def is_wild(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether one filter matches one topic name."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f = topic_filter.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


def covers(outer: str, inner: str) -> bool:
    """Whether every topic `inner` can match is matched by `outer` (both filters): a '#' in `inner` needs
    a '#' in `outer`, a '+' needs '+' or '#'."""
    o, n = outer.split("/"), inner.split("/")
    dollar = inner.startswith("$")  # only a literal first level matches '$' topics
    for i, level in enumerate(o):
        if level == "#":
            return not (i == 0 and dollar)
        if i >= len(n):
            return False
        if n[i] == "#":
            # 'x/#' also matches 'x' itself, which 'x/+/#' does not, unless 'x' is no topic at all:
            # nothing before the '#' ('+/#' and '#' match the same) or one empty level ("/#", "/+/#")
            return level == "+" and o[i + 1 :] == ["#"] and (i == 0 or (i == 1 and n[0] == ""))
        if level == "+":
            if i == 0 and dollar:
                return False
            continue
        if level != n[i]:
            return False
    return len(o) == len(n)


def overlaps(a: str, b: str) -> bool:
    """Whether some topic name is matched by both filters."""
    x, y = a.split("/"), b.split("/")
    for i in range(max(len(x), len(y))):
        p = x[i] if i < len(x) else None
        q = y[i] if i < len(y) else None
        if p is None or q is None:
            # one filter ends here: the topic ending here matches the other only through a '#'
            # ("a/#" matches "a"), unless that topic is the empty one ("/#" and "+" share only "")
            return (q if p is None else p) == "#" and not (i == 1 and "" in (x[0], y[0]))
        if p == "#" or q == "#":
            other = q if p == "#" else p
            return not (i == 0 and other != "#" and other != "+" and other.startswith("$"))
        if p == "+" or q == "+":
            other = q if p == "+" else p
            if i == 0 and other != "+" and other.startswith("$"):
                return False
            continue
        if p != q:
            return False
    return True
