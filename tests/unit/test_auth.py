"""Password hashes, users files and ACL matching."""

from __future__ import annotations

import pytest
from fleetmq.broker.auth import (
    Acl,
    Authenticator,
    UsersFileError,
    covers,
    hash_password,
    read_users,
    set_password,
)
from fleetmq.broker.zones import AclRule


def test_hash_is_salted_and_verifies(tmp_path):
    a, b = hash_password("pw", iterations=1000), hash_password("pw", iterations=1000)
    assert a != b  # salted
    auth = Authenticator({"u": a})
    assert auth.check("u", b"pw")
    assert not auth.check("u", b"PW")
    assert not auth.check("u", None)
    assert not auth.check("other", b"pw")


def test_users_file_update_keeps_others(tmp_path):
    f = tmp_path / "users"
    set_password(f, "a", "1")
    set_password(f, "b", "2")
    set_password(f, "a", "3")
    users = read_users(f)
    assert list(users) == ["a", "b"]
    assert Authenticator(users).check("a", b"3") and not Authenticator(users).check("a", b"1")
    assert oct(f.stat().st_mode & 0o777) == "0o600"


def test_bad_users_file_names_the_line(tmp_path):
    f = tmp_path / "users"
    f.write_text("# comment\nok:pbkdf2_sha256$1$AA==$AA==\nbroken\n")
    with pytest.raises(UsersFileError, match=r"users:3"):
        read_users(f)


@pytest.mark.parametrize(
    ("pattern", "topic_filter", "expected"),
    [
        ("a/#", "a/b/#", True),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),  # '#' under 'a/' reaches deeper than 'a/+' allows
        ("a/b", "a/+", False),
        ("#", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a", "a/b", False),
    ],
)
def test_subscribe_rules_cover_filters(pattern, topic_filter, expected):
    assert covers(pattern, topic_filter) is expected


def test_first_match_wins_and_substitution():
    acl = Acl(
        [
            AclRule(permission="allow", action="publish", filter="u/%u/#"),
            AclRule(permission="allow", action="publish", filter="c/%c"),
            AclRule(permission="deny", action="all", filter="u/#"),
        ],
        default="deny",
    )
    assert acl.allowed("publish", "u/al/x", "al", "c1")
    assert not acl.allowed("publish", "u/al/x", None, "c1")  # %u rules skip anonymous clients
    assert not acl.allowed("publish", "u/bo/x", "al", "c1")
    assert acl.allowed("publish", "c/c1", None, "c1")
    assert not acl.allowed("subscribe", "u/#", "al", "c1")
    assert not acl.allowed("publish", "elsewhere", "al", "c1")  # default deny


def test_zone_users_merges_files_and_checks_pinned_content(tmp_path):
    import hashlib

    from fleetmq.broker.auth import UsersFilePending, set_password, zone_users
    from fleetmq.broker.zones import ZoneSettings

    base, extra = tmp_path / "base", tmp_path / "extra"
    set_password(base, "alice", "a")
    set_password(base, "bob", "b")
    set_password(extra, "bob", "B")
    digest = hashlib.sha256(extra.read_bytes()).hexdigest()
    settings = ZoneSettings(users_file=str(base), users_files=[{"path": str(extra), "sha256": digest}])
    users = zone_users(settings)
    assert users is not None and sorted(users) == ["alice", "bob"]
    assert users["bob"] == extra.read_text().split(":", 1)[1].strip()  # the later file wins
    assert zone_users(ZoneSettings()) is None
    set_password(extra, "carol", "c")  # the file moved on from what the config pins
    with pytest.raises(UsersFilePending):
        zone_users(settings)
