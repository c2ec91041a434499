"""Topic routing: which sessions want a message published on a topic (EMQX's emqx_router + emqx_shared_sub).

Exact filters live in a dict (one lookup per publish); wildcard filters in a trie walked level by level.
Shared subscriptions (``$share/group/filter``) deliver each message to exactly one member, round robin,
preferring members that are online.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from .topic import CACHED_TOPIC_MAX, is_wild, parse_share, topic_matches


@dataclass(slots=True)
class Subscription:
    """One subscription of one session, with the MQTT 5 options that shape each delivery."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    sub_id: int | None = None
    group: str | None = None  # shared-subscription group


#: the Subscription of every plain subscription (not shared, no identifier) with the same options: a
#: fleet's clients subscribe with a few, and one object each is 80 bytes of every connection. Never
#: changed once made (Router.add sets `group` on a shared subscription's own only); a few dozen at most.
_PLAIN: dict[tuple[int, bool, bool, int], Subscription] = {}


def plain_subscription(
    qos: int, no_local: bool, retain_as_published: bool, retain_handling: int
) -> Subscription:
    """The shared Subscription of a subscription that is not shared and has no identifier."""
    key = (qos, no_local, retain_as_published, retain_handling)
    sub = _PLAIN.get(key)
    if sub is None:
        sub = _PLAIN[key] = Subscription(qos, no_local, retain_as_published, retain_handling)
    return sub


class _Node:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.subs: dict[str, Subscription] = {}  # client id -> subscription


class _Group:
    """The members of one shared subscription (group + filter), with a round-robin cursor."""

    __slots__ = ("cursor", "members")

    def __init__(self) -> None:
        self.members: dict[str, Subscription] = {}
        self.cursor = 0

    def pick(self, online: Callable[[str], bool]) -> tuple[str, Subscription] | None:
        members = list(self.members.items())
        n = len(members)
        if not n:
            return None
        start = self.cursor % n
        for k in range(n):
            i = (start + k) % n
            if online(members[i][0]):
                self.cursor = i + 1
                return members[i]
        self.cursor = start + 1
        return members[start]


Match = tuple[str, Subscription]


CACHE_SIZE = 8192


class Router:
    __slots__ = ("_by_client", "_cache", "_exact", "_groups", "_root", "_wild_count")

    def __init__(self) -> None:
        # topic -> its subscribers: the one (client id, subscription) itself while there is one (a dict of
        # one is 230 bytes, and in a fleet most topics have one subscriber), a dict by client id past it
        self._exact: dict[str, Match | dict[str, Subscription]] = {}
        self._root = _Node()
        self._wild_count = 0
        # real filter -> group name -> members
        self._groups: dict[str, dict[str, _Group]] = {}
        # topic -> (trie nodes with subscribers, shared groups) it matches; cleared by any change to
        # wildcard or shared subscriptions, which are rare next to publishes. Topics longer than
        # CACHED_TOPIC_MAX are walked each time: the cache's bytes stay bounded whatever topics come.
        self._cache: dict[str, tuple[list[_Node], list[dict[str, _Group]]]] = {}
        # client id -> its filters, to drop them all at once: the filter itself while it is the only one
        # (a set of one is 216 bytes, and most clients of a fleet subscribe to one filter)
        self._by_client: dict[str, str | set[str]] = {}

    # -- changes ----------------------------------------------------------------------------------
    def add(self, client_id: str, topic_filter: str, sub: Subscription) -> bool:
        """Add or replace a subscription; True when it did not exist before."""
        group, real = parse_share(topic_filter)
        if group is not None or is_wild(real):
            self._cache.clear()
        by_client = self._by_client
        mine = by_client.get(client_id)
        if mine is None:
            by_client[client_id] = topic_filter
        elif isinstance(mine, str):
            if mine != topic_filter:
                by_client[client_id] = {mine, topic_filter}
        else:
            mine.add(topic_filter)
        if group is not None:
            sub.group = group
            members = self._groups.setdefault(real, {}).setdefault(group, _Group()).members
            new = client_id not in members
            members[client_id] = sub
            return new
        if not is_wild(real):
            return self._add_exact(real, client_id, sub)
        subs = self._subs_for(real, create=True)
        assert subs is not None
        new = client_id not in subs
        subs[client_id] = sub
        if new:
            self._wild_count += 1
        return new

    def _add_exact(self, topic: str, client_id: str, sub: Subscription) -> bool:
        exact = self._exact
        subs = exact.get(topic)
        if subs is None:
            exact[topic] = (client_id, sub)
            return True
        if isinstance(subs, tuple):
            if subs[0] == client_id:
                exact[topic] = (client_id, sub)
                return False
            exact[topic] = {subs[0]: subs[1], client_id: sub}
            return True
        new = client_id not in subs
        subs[client_id] = sub
        return new

    def remove_client(self, client_id: str) -> list[str]:
        """Drop every subscription of one client (its session ended); returns the filters."""
        filters = list(self._filters_of(client_id))
        for topic_filter in filters:
            self.remove(client_id, topic_filter)
        return filters

    def remove(self, client_id: str, topic_filter: str) -> bool:
        group, real = parse_share(topic_filter)
        if group is not None or is_wild(real):
            self._cache.clear()
        mine = self._by_client.get(client_id)
        if isinstance(mine, str):
            if mine == topic_filter:
                del self._by_client[client_id]
        elif mine is not None:
            mine.discard(topic_filter)
            if not mine:
                del self._by_client[client_id]
        if group is not None:
            groups = self._groups.get(real)
            g = groups.get(group) if groups is not None else None
            if groups is None or g is None or g.members.pop(client_id, None) is None:
                return False
            if not g.members:
                del groups[group]
                if not groups:
                    del self._groups[real]
            return True
        if not is_wild(real):
            exact = self._exact
            subs = exact.get(real)
            if subs is None:
                return False
            if isinstance(subs, tuple):
                if subs[0] != client_id:
                    return False
                del exact[real]
                return True
            if subs.pop(client_id, None) is None:
                return False
            if len(subs) == 1:
                exact[real] = next(iter(subs.items()))
            return True
        path = [self._root]
        node = self._root
        for level in real.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                return False
            path.append(nxt)
            node = nxt
        if node.subs.pop(client_id, None) is None:
            return False
        self._wild_count -= 1
        levels = real.split("/")
        for i in range(len(levels), 0, -1):  # prune empty branches
            child = path[i]
            if child.subs or child.children:
                break
            del path[i - 1].children[levels[i - 1]]
        return True

    # -- lookups ----------------------------------------------------------------------------------
    def match(self, topic: str, online: Callable[[str], bool]) -> list[Match]:
        """Every (client id, subscription) a message on `topic` goes to; one member per shared group."""
        out: list[Match] = []
        subs = self._exact.get(topic)
        if subs is not None:
            if isinstance(subs, tuple):
                out.append(subs)
            else:
                out.extend(subs.items())
        if not (self._wild_count or self._groups):
            return out
        cached = self._cache.get(topic)
        if cached is None:
            cached = self._lookup(topic)
        nodes, shared = cached
        for node in nodes:
            out.extend(node.subs.items())
        for groups in shared:
            for g in groups.values():
                picked = g.pick(online)
                if picked is not None:
                    out.append(picked)
        return out

    def _lookup(self, topic: str) -> tuple[list[_Node], list[dict[str, _Group]]]:
        nodes = list(self._walk(topic)) if self._wild_count else []
        shared = [groups for real, groups in self._groups.items() if topic_matches(real, topic)]
        if len(topic) <= CACHED_TOPIC_MAX:
            cache = self._cache
            if len(cache) >= CACHE_SIZE:
                cache.clear()
            cache[topic] = (nodes, shared)
        return nodes, shared

    def _walk(self, topic: str) -> Iterable[_Node]:
        levels = topic.split("/")
        n = len(levels)
        dollar = topic.startswith("$")
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            hash_node = children.get("#")
            # '#' matches the parent level too ("a/#" matches "a"), but never a root '$' topic.
            if hash_node is not None and hash_node.subs and not (i == 0 and dollar):
                yield hash_node
            if i == n:
                if node is not self._root and node.subs:
                    yield node
                continue
            level = levels[i]
            if not (i == 0 and dollar):
                plus = children.get("+")
                if plus is not None:
                    stack.append((plus, i + 1))
            child = children.get(level)
            if child is not None and level not in ("+", "#"):
                stack.append((child, i + 1))

    def _subs_for(self, real: str, create: bool) -> dict[str, Subscription] | None:
        """The subscribers of wildcard filter `real`, by client id."""
        node = self._root
        for level in real.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                if not create:
                    return None
                nxt = node.children[level] = _Node()
            node = nxt
        return node.subs

    def clients(self) -> list[str]:
        """Every client with a subscription routed here."""
        return list(self._by_client)

    def filters_of(self, client_id: str) -> set[str]:
        """One client's filters routed here."""
        return set(self._filters_of(client_id))

    def _filters_of(self, client_id: str) -> Collection[str]:
        mine = self._by_client.get(client_id)
        if mine is None:
            return ()
        return (mine,) if isinstance(mine, str) else mine

    def subscriptions(self, client_id: str) -> dict[str, Subscription]:
        """One client's subscriptions as routed here, by filter (a bridge checks its forwards are in)."""
        out: dict[str, Subscription] = {}
        for topic_filter in self._filters_of(client_id):
            group, real = parse_share(topic_filter)
            if group is not None:
                g = self._groups.get(real, {}).get(group)
                sub = g.members.get(client_id) if g is not None else None
            elif not is_wild(real):
                exact = self._exact.get(real)
                if isinstance(exact, tuple):
                    sub = exact[1] if exact[0] == client_id else None
                else:
                    sub = exact.get(client_id) if exact is not None else None
            else:
                subs = self._subs_for(real, create=False)
                sub = subs.get(client_id) if subs is not None else None
            if sub is not None:
                out[topic_filter] = sub
        return out

    def filters(self) -> int:
        return len(self._exact) + self._wild_count + sum(len(g) for g in self._groups.values())
