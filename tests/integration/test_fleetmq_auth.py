"""Authentication from a users file made by `fleetmq-broker passwd`, and per-zone ACL rules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .harness import MOSQUITTO, passwd, uid
from .mqttraw import CONNACK, PUBACK, PUBLISH, SUBACK

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq-specific")

V311, V5 = 4, 5


@pytest.fixture
def users(tmp_path):
    path = tmp_path / "users"
    passwd(path, "alice", "wonderland")
    passwd(path, "bob", "builder")
    passwd(path, "alice", "looking-glass")  # updates alice, keeps bob
    return path


def connack(bp, raw_clients, version: int, **kw):
    c = raw_clients(bp, version)
    return c, c.connect(uid("auth"), check=False, **kw)


@pytest.mark.parametrize("version", [V311, V5])
def test_users_file_and_anonymous_off(start_broker, raw_clients, users, version):
    bp = start_broker(zone_overrides={"users_file": str(users), "allow_anonymous": False})
    # v3 return codes: 5 not authorized, 4 bad user name or password; v5: 0x87, 0x86
    _, ack = connack(bp, raw_clients, version)
    assert ack.type == CONNACK and ack.reason == (0x87 if version == V5 else 5)
    for user, password in (("alice", b"wonderland"), ("nobody", b"x"), ("alice", None)):
        _, ack = connack(bp, raw_clients, version, username=user, password=password)
        assert ack.reason == (0x86 if version == V5 else 4), (user, password, ack)
    for user, password in (("alice", b"looking-glass"), ("bob", b"builder")):
        c, ack = connack(bp, raw_clients, version, username=user, password=password)
        assert ack.reason == 0, (user, ack)
        c.close()
    assert bp.metric("fleetmq_disconnects_total", reason="bad_username_or_password") >= 3


ACL = [
    {"permission": "deny", "action": "subscribe", "filter": "test/nosubscribe"},
    {"permission": "allow", "action": "publish", "filter": "users/%u/#"},
    {"permission": "allow", "action": "publish", "filter": "clients/%c"},
    {"permission": "deny", "action": "publish", "filter": "users/#"},
    {"permission": "deny", "action": "publish", "filter": "clients/#"},
    {"permission": "allow", "action": "all", "filter": "#"},
]


@pytest.mark.parametrize("version", [V311, V5])
def test_acl_rules(start_broker, raw_clients, users, version):
    bp = start_broker(zone_overrides={"users_file": str(users), "acl": ACL})
    sub = raw_clients(bp, version)
    sub.connect(uid("watch"), username="bob", password=b"builder")
    ack = sub.subscribe([("test/nosubscribe", 1), ("users/#", 1), ("clients/#", 1)])
    assert ack.type == SUBACK
    assert ack.codes == [0x87 if version == V5 else 0x80, 1, 1]
    cid = uid("alice")
    alice = raw_clients(bp, version)
    alice.connect(cid, username="alice", password=b"looking-glass")
    for topic in ("users/alice/x", "users/bob/x", f"clients/{cid}", "clients/someone-else"):
        alice.publish(topic, topic.encode(), qos=1)
    acks = alice.recv_n(4, timeout=5, ptype=PUBACK)
    if version == V5:  # a refused PUBLISH is acknowledged with Not authorized
        assert [a.reason for a in acks] == [0, 0x87, 0, 0x87]
    got = [p.payload for p in sub.recv_all(1.0) if p.type == PUBLISH]
    assert got == [b"users/alice/x", f"clients/{cid}".encode()]
    assert bp.metric("fleetmq_messages_dropped_total", reason="not_authorized") == 2


def test_acl_default_deny(start_broker, raw_clients):
    bp = start_broker(
        zone_overrides={
            "acl_default": "deny",
            "acl": [{"permission": "allow", "action": "all", "filter": "open/#"}],
        }
    )
    c = raw_clients(bp, V5)
    c.connect(uid("d"))
    ack = c.subscribe([("open/a", 0), ("closed/a", 0), ("#", 0)])
    assert ack.codes == [0, 0x87, 0x87]


def test_bad_users_file_is_refused_at_start(tmp_path):
    bad = tmp_path / "users"
    bad.write_text("alice:plaintext\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"zones:\n  default: {{users_file: {bad}}}\n")
    r = subprocess.run(
        [sys.executable, "-m", "fleetmq.broker", "--config", str(cfg), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert f"{bad}:1" in r.stderr


def test_users_file_change_applies_live(start_broker, raw_clients, users):
    """A mounted Secret changes only the users file: the broker notices it without a config change."""
    from tests.support import wait_until

    bp = start_broker(zone_overrides={"users_file": str(users), "allow_anonymous": False})
    c, ack = connack(bp, raw_clients, V5, username="carol", password=b"singer")
    assert ack.reason == 0x86
    c.close()
    passwd(users, "carol", "singer")

    def carol_accepted() -> bool:
        c, ack = connack(bp, raw_clients, V5, username="carol", password=b"singer")
        c.close()
        return ack.reason == 0

    wait_until(carol_accepted, timeout=10, msg="users file reloaded")
    _, ack = connack(bp, raw_clients, V5, username="bob", password=b"builder")
    assert ack.reason == 0  # the other users are still there


def test_pinned_users_file_waits_for_its_content(start_broker, raw_clients, tmp_path):
    """A config pinning a users file's sha256 (the operator's MqttUsers) is applied only once the file has
    that content, whichever of the two arrives first, and the wait counts as no reload error."""
    import hashlib
    import json

    import yaml

    from tests.support import wait_until

    def readyz_hash() -> str:
        return json.loads(bp.http_get("/readyz")[1])["config_hash"]

    first, second = tmp_path / "first", tmp_path / "second"
    passwd(first, "dave", "one")
    passwd(second, "dave", "two")
    pinned = tmp_path / "pinned"
    pinned.write_bytes(first.read_bytes())
    entry = {"path": str(pinned), "sha256": hashlib.sha256(first.read_bytes()).hexdigest()}
    bp = start_broker(zone_overrides={"users_files": [entry], "allow_anonymous": False})
    before = readyz_hash()
    _, ack = connack(bp, raw_clients, V5, username="dave", password=b"one")
    assert ack.reason == 0
    cfg = yaml.safe_load(bp.config_path.read_text())
    cfg["zones"]["default"]["users_files"][0]["sha256"] = hashlib.sha256(second.read_bytes()).hexdigest()
    bp.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # the ConfigMap first
    wait_until(lambda: "waits for its users files" in bp.log(), timeout=10, msg="pending config noticed")
    assert readyz_hash() == before
    _, ack = connack(bp, raw_clients, V5, username="dave", password=b"one")
    assert ack.reason == 0  # the running config and its users stay
    pinned.write_bytes(second.read_bytes())  # then the Secret
    wait_until(lambda: readyz_hash() != before, timeout=10, msg="config applied with its users")
    _, ack = connack(bp, raw_clients, V5, username="dave", password=b"two")
    assert ack.reason == 0
    assert bp.metric("fleetmq_config_reload_errors_total") == 0
