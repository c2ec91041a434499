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
from collections.abc import Iterable
from pathlib import Path

from .router import topic_matches
from .zones import AclRule

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


def read_users(path: str | Path) -> dict[str, str]:
    users: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsersFileError(f"cannot read users file {path}: {e.strerror}") from e
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, encoded = line.partition(":")
        if not sep or not user or not encoded.startswith(SCHEME + "$"):
            raise UsersFileError(f"{path}:{n}: expected 'username:{SCHEME}$...' (see fleetmq-broker passwd)")
        users[user] = encoded
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


class Acl:
    """Ordered allow/deny rules for publish and subscribe; the first match wins."""

    def __init__(self, rules: Iterable[AclRule], default: str = "allow") -> None:
        self.rules = list(rules)
        self.default_allow = default == "allow"

    def allowed(self, action: str, topic: str, username: str | None, client_id: str) -> bool:
        """`topic` is the topic name of a PUBLISH or the filter of a SUBSCRIBE."""
        for rule in self.rules:
            if rule.action != "all" and rule.action != action:
                continue
            pattern = rule.filter.replace("%c", client_id)
            if "%u" in pattern:
                if username is None:
                    continue  # a rule about the user does not apply to anonymous clients
                pattern = pattern.replace("%u", username)
            hit = topic_matches(pattern, topic) if action == "publish" else covers(pattern, topic)
            if hit:
                return rule.permission == "allow"
        return self.default_allow


def covers(pattern: str, topic_filter: str) -> bool:
    """Whether every topic `topic_filter` can match is matched by `pattern` (for SUBSCRIBE rules):
    a '#' in the filter needs a '#' in the pattern, a '+' needs '+' or '#'."""
    p, f = pattern.split("/"), topic_filter.split("/")
    for i, level in enumerate(p):
        if level == "#":
            return not (i == 0 and topic_filter.startswith("$"))
        if i >= len(f) or f[i] == "#":
            return False
        if level == "+":
            if i == 0 and topic_filter.startswith("$"):
                return False
            continue
        if level != f[i]:
            return False
    return len(p) == len(f)
