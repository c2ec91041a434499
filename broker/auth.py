"""Authentication (a users file of salted password hashes) and authorization (ordered ACL rules).

Passwords are hashed with PBKDF2-HMAC-SHA256 from hashlib (a well-kept primitive, no extra dependency):
``username:pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``, one user a line, as written by
``fleetmq-broker passwd FILE USER``. For Kubernetes the file is a mounted Secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from enum import IntEnum
from pathlib import Path

from .topic import CACHED_TOPIC_MAX, covers, is_sys, overlaps, topic_matches
from .zones import AclRule, ZoneSettings

SCHEME = "pbkdf2_sha256"
ITERATIONS = 100_000  # ~50 ms per check here; stored with each hash, so it can change later


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: bytes, encoded: str) -> bool:
    try:
        scheme, iterations, salt, digest = encoded.split("$")
        if scheme != SCHEME:
            return False
        got = hashlib.pbkdf2_hmac("sha256", password, base64.b64decode(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, base64.b64decode(digest))


class UsersFileError(Exception):
    """A users file that cannot be used; the message names the file and line."""


class UsersFilePending(UsersFileError):
    """A users file that does not have the content its config expects yet (a mounted Secret still on its
    way): not an error, the node waits for it with the config it runs."""


def read_users(path: str | Path, sha256: str | None = None) -> dict[str, str]:
    users: dict[str, str] = {}
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsersFileError(f"cannot read users file {path}: {e.strerror}") from e
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise UsersFilePending(f"users file {path} does not have the content the config expects yet")
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise UsersFileError(f"users file {path} is not UTF-8") from e
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, encoded = line.partition(":")
        if not sep or not user or not encoded.startswith(SCHEME + "$"):
            raise UsersFileError(f"{path}:{n}: expected 'username:{SCHEME}$...' (see fleetmq-broker passwd)")
        users[user] = encoded
    return users


def zone_users(settings: ZoneSettings) -> dict[str, str] | None:
    """Every user of a zone: users_file, then users_files (a later entry replaces an earlier one). None:
    the zone checks no passwords."""
    if settings.users_file is None and not settings.users_files:
        return None
    users = read_users(settings.users_file) if settings.users_file else {}
    for extra in settings.users_files:
        users.update(read_users(extra.path, extra.sha256))
    return users


def set_password(path: str | Path, user: str, password: str) -> None:
    """Add or update one user, keeping the others and the file's order."""
    if not user or ":" in user:
        raise UsersFileError("a username must be non-empty and contain no ':'")
    p = Path(path)
    lines = p.read_text().splitlines() if p.exists() else []
    entry = f"{user}:{hash_password(password)}"
    out, found = [], False
    for line in lines:
        if line.partition(":")[0] == user:
            out.append(entry)
            found = True
        else:
            out.append(line)
    if not found:
        out.append(entry)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("\n".join(out) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(p)


class Authenticator:
    """Checks CONNECT credentials against one zone's users; never says which part was wrong."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    def check(self, username: str, password: bytes | None) -> bool:
        encoded = self.users.get(username)
        if encoded is None or password is None:
            # spend the same time as a real check, so timing does not tell that the user is unknown
            verify_password(b"", f"{SCHEME}${ITERATIONS}$AAAAAAAAAAAAAAAAAAAAAA==$AAAA")
            return False
        return verify_password(password, encoded)


class Access(IntEnum):
    """A zone's decision on a SUBSCRIBE filter."""

    ALLOWED = 0  # granted, and every topic it can match may be read: its deliveries need no check
    FILTERED = 1  # granted, but a deny rule reaches some of its topics: each delivery is checked
    DENIED = 2  # refused


#: cached decisions per client and action; a client cycling through more topics than this starts over.
#: Topics longer than topic.CACHED_TOPIC_MAX are decided afresh each time, so a cache holds at most
#: CACHE_LIMIT x CACHED_TOPIC_MAX characters of topics (about 1 MiB), whatever topics a client makes up.
CACHE_LIMIT = 4096

Rules = tuple[tuple[bool, str], ...]  # (allow, filter) in order, first match wins

#: topic characters a client's authorization service's answers (Asked) may hold; the oldest go first
ASKED_CHARS = 64 * 1024


class Asked:
    """What a client's authorization service (an http authenticator's acl_url) answered, per action and
    topic: True allow, False deny, None ignore (the rules decide).

    The channel's host asks before a PUBLISH or SUBSCRIBE that needs an answer is handled (`due`), the
    channel then reads the answers synchronously through its ClientAcl. Answers hold for `ttl`; those of
    the latest round hold until `settle`, whatever their age, so that the packets that waited for them are
    decided by them even with a ttl of 0."""

    __slots__ = ("_answers", "_chars", "_fresh", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._answers: OrderedDict[tuple[str, str], tuple[bool | None, float]] = OrderedDict()
        self._chars = 0
        self._fresh: set[tuple[str, str]] = set()

    def due(self, action: str, topic: str, now: float) -> bool:
        """Whether the service is to be asked about this (never asked, or its answer has expired)."""
        key = (action, topic)
        a = self._answers.get(key)
        return a is None or (a[1] <= now and key not in self._fresh)

    def answer(self, action: str, topic: str) -> bool | None:
        a = self._answers.get((action, topic))
        return None if a is None else a[0]

    def put(self, answers: Iterable[tuple[str, str, bool | None]], now: float) -> None:
        """The service's answers of one round (they hold until `settle`)."""
        fresh = self._fresh = set()
        for action, topic, allowed in answers:
            key = (action, topic)
            if self._answers.pop(key, None) is None:
                self._chars += len(topic)
            self._answers[key] = (allowed, now + self.ttl)
            fresh.add(key)
        while self._chars > ASKED_CHARS:
            key = next(iter(self._answers))
            if key in fresh:
                break  # (everything after it is of this round too)
            del self._answers[key]
            self._chars -= len(key[1])

    def settle(self) -> None:
        """The packets that waited for the latest round are handled: its answers expire as any."""
        self._fresh = set()


class Acl:
    """A zone's ordered allow/deny rules (first match wins); `bind` gives one client's view of them."""

    def __init__(
        self,
        rules: Iterable[AclRule],
        default: str = "allow",
        user_rules: dict[str, list[AclRule]] | None = None,
    ) -> None:
        self.rules = list(rules)
        self.default_allow = default == "allow"
        self.user_rules = user_rules or {}
        # Where no rule names the client (%u, %c, %a), every client without rules of its own binds the
        # same view: one shared ClientAcl (232 bytes and two caches per client otherwise), made by the
        # first such bind. A change of rules makes a new Acl.
        self._personal = any(p in rule.filter for rule in self.rules for p in _PLACEHOLDERS)
        self._shared: ClientAcl | None = None

    def bind(
        self,
        username: str | None,
        client_id: str,
        own: Sequence[AclRule] = (),
        peerhost: str = "",
        asked: Asked | None = None,
    ) -> ClientAcl:
        """The rules as they apply to one client: `own` (an authenticator's, e.g. a token's acl claim),
        its user's own rules, then the zone's; %u, %c and %a (the client's address, as a PROXY header
        gives it behind a load balancer) substituted once. A rule with %a does not apply where the
        address is not known (a will published after its client went).

        A rule about the user does not apply to anonymous clients. A name holding '/', '+' or '#' would
        turn into other levels or wildcards, so an allow rule it would widen is left out (the client gets
        nothing from it), while a deny rule is kept as substituted (it can only deny more). So is an allow
        rule that a name starting with '$' would turn into one about the server's topics ($SYS): only a
        rule written so allows publishing there.

        `asked`: the answers of the client's authorization service, which decide before the rules. Such a
        client's deliveries are then checked against the deny rules only, not the zone's default: the
        service decided its SUBSCRIBEs (as in EMQX, where deliveries are not authorized again).
        """
        users = self.user_rules.get(username, []) if username is not None else []
        if not own and not users and asked is None and not self._personal:
            shared = self._shared
            if shared is None:
                shared = self._shared = self._bound(self.rules, username, client_id, peerhost, None)
            return shared
        return self._bound((*own, *users, *self.rules), username, client_id, peerhost, asked)

    def _bound(
        self,
        rules: Iterable[AclRule],
        username: str | None,
        client_id: str,
        peerhost: str,
        asked: Asked | None,
    ) -> ClientAcl:
        publish: list[tuple[bool, str]] = []
        read: list[tuple[bool, str]] = []
        for rule in rules:
            allow = rule.permission == "allow"
            pattern = rule.filter
            if "%u" in pattern:
                if username is None or (allow and _UNSAFE.intersection(username)):
                    continue
                pattern = pattern.replace("%u", username)
            if "%c" in pattern:
                if allow and _UNSAFE.intersection(client_id):
                    continue
                pattern = pattern.replace("%c", client_id)
            if "%a" in pattern:
                if not peerhost:
                    continue
                pattern = pattern.replace("%a", peerhost)
            if allow and pattern.startswith("$") and not rule.filter.startswith("$"):
                continue
            if rule.action != "subscribe":
                publish.append((allow, pattern))
            if rule.action != "publish":
                read.append((allow, pattern))
        return ClientAcl(tuple(publish), tuple(read), self.default_allow, asked)

    def allowed(self, action: str, topic: str, username: str | None, client_id: str) -> bool:
        """One decision without a bound view: `topic` is a PUBLISH topic or a SUBSCRIBE filter."""
        acl = self.bind(username, client_id)
        if action == "publish":
            return acl.can_publish(topic)
        return acl.subscribe_access(topic) is not Access.DENIED


_UNSAFE = frozenset("/+#")
_PLACEHOLDERS = ("%u", "%c", "%a")


class ClientAcl:
    """One client's rules, with its per-topic decisions cached (a live ACL change binds a new one).

    A publish on $SYS (topic.is_sys) is refused whatever the default, unless a rule allows it: wildcards
    at the first level never match a '$' topic, so only a rule naming $SYS can (MQTT 5 section 4.7.2).
    """

    __slots__ = (
        "_pub_cache",
        "_publish",
        "_read",
        "_read_cache",
        "asked",
        "default_allow",
        "guards_read",
        "publish_open",
        "read_default",
    )

    @classmethod
    def superuser(cls) -> ClientAcl:
        """Everything allowed but publishing on $SYS, which only a rule naming it grants."""
        return cls((), (), True)

    def __init__(self, publish: Rules, read: Rules, default_allow: bool, asked: Asked | None = None) -> None:
        self._publish = publish
        self._read = read
        self.default_allow = default_allow
        self.asked = asked  # the client's authorization service's answers, deciding before the rules
        #: what a delivery no rule matches gets: the default, but for a client whose service decided its
        #: subscriptions
        self.read_default = default_allow or asked is not None
        #: whether any topic can be denied to this client's reading; if not, nothing is ever checked
        self.guards_read = not self.read_default or any(not allow for allow, _ in read)
        #: whether every publish but one on $SYS is allowed: no rule to match (Channel's cheaper check)
        self.publish_open = default_allow and not publish and asked is None
        self._pub_cache: dict[str, bool] = {}
        self._read_cache: dict[str, bool] = {}

    def can_publish(self, topic: str) -> bool:
        if self.asked is not None and (said := self.asked.answer("publish", topic)) is not None:
            return said
        ok = self._pub_cache.get(topic)
        if ok is None:
            default = self.default_allow and not is_sys(topic)
            ok = self._decide(self._publish, topic, self._pub_cache, default)
        return ok

    def can_read(self, topic: str) -> bool:
        """Whether a message on `topic` may be delivered to this client (mosquitto's read access)."""
        ok = self._read_cache.get(topic)
        if ok is None:
            ok = self._decide(self._read, topic, self._read_cache, self.read_default)
        return ok

    @staticmethod
    def _decide(rules: Rules, topic: str, cache: dict[str, bool], default: bool) -> bool:
        ok = default
        for allow, pattern in rules:
            if topic_matches(pattern, topic):
                ok = allow
                break
        if len(topic) <= CACHED_TOPIC_MAX:
            if len(cache) >= CACHE_LIMIT:
                cache.clear()
            cache[topic] = ok
        return ok

    def subscribe_access(self, topic_filter: str) -> Access:
        """The decision on a filter (without its $share/group/ prefix).

        As in EMQX and mosquitto, the first rule that covers the whole filter decides whether it is
        granted (the default when none does), so a filter is refused when that rule denies it, even if
        an earlier allow rule reaches part of it. A granted filter that an earlier deny rule (or, under
        the default, any deny rule) reaches in part is FILTERED: those topics are denied per delivery.
        """
        said = self.asked.answer("subscribe", topic_filter) if self.asked is not None else None
        if said is False:
            return Access.DENIED
        if not self.guards_read and (said or self.default_allow):
            return Access.ALLOWED
        partial_deny = False
        granted = self.default_allow
        for allow, pattern in self._read:
            if not overlaps(pattern, topic_filter):
                continue
            if covers(pattern, topic_filter):
                granted = allow
                partial_deny = partial_deny or not allow
                break
            if not allow:
                partial_deny = True
        if said:  # granted by the service; what a deny rule reaches is still not delivered
            return Access.FILTERED if partial_deny else Access.ALLOWED
        if not granted:
            return Access.DENIED
        return Access.FILTERED if partial_deny else Access.ALLOWED
