"""Bans and flapping detection (broker/banned.py): lookups, expiry, and bounded memory."""

from __future__ import annotations

from fleetmq.broker import banned
from fleetmq.broker.banned import Ban, BanList, Flapping


def test_a_ban_matches_by_client_id_username_or_address_until_it_ends():
    bans = BanList()
    assert bans.hit("c", "u", "10.0.0.1", 0) is None and not bans
    new = bans.replace([Ban(kind="clientid", who="c", until=100), Ban(kind="username", who="u"),
                        Ban(kind="peerhost", who="10.0.0.9")])  # fmt: skip
    assert len(new) == 3
    assert bans.hit("c", None, "1.1.1.1", 99).who == "c"
    assert bans.hit("c", None, "1.1.1.1", 100) is None  # ended
    assert bans.hit("x", "u", "1.1.1.1", 0).kind == "username"
    assert bans.hit("x", None, "10.0.0.9", 0).kind == "peerhost"
    assert bans.hit("x", "c", "c", 0) is None  # a client id ban is not a username ban
    assert [b.key for b in bans.all(100)] == ["peerhost:10.0.0.9", "username:u"]
    assert bans.replace([Ban(kind="username", who="u"), Ban(kind="clientid", who="d")]) == [
        Ban(kind="clientid", who="d")]  # fmt: skip
    assert bans.remove("username:u") and not bans.remove("username:u")


def test_flapping_counts_connects_in_a_sliding_window():
    f = Flapping(max_count=3, window=10)
    assert [f.connected("c", t) for t in (0, 1, 2)] == [False, False, False]
    assert f.connected("c", 3) is True  # the 4th within 10 s
    f.forget("c")
    assert [f.connected("c", t) for t in (0, 11, 22, 33)] == [False] * 4  # spread out: never


def test_flapping_remembers_a_bounded_number_of_client_ids(monkeypatch):
    monkeypatch.setattr(banned, "FLAPPING_TRACKED", 100)
    f = Flapping(max_count=1, window=60)
    for i in range(1000):
        f.connected(f"c{i}", 0)
    assert len(f._seen) == 100 and "c999" in f._seen and "c0" not in f._seen
