"""Rendering MqttUsers: which zones they go into, the users files and rules the brokers get, the pods left
alone, and the status following the pods' config hashes."""

from __future__ import annotations

import base64
import dataclasses
import hashlib

from fleetmq.broker.auth import hash_password, zone_users
from fleetmq.broker.config import BrokerConfig
from fleetmq.broker.zones import ZoneSettings
from fleetmq.operator import render
from fleetmq.operator.status import user_status

from .operator_support import fleet, user, zone


def served(*zones: dict) -> list[render.Zone]:
    accepted, rejected = render.select_zones(render.Fleet.parse(fleet()), list(zones))
    assert not rejected
    return accepted


def with_hashes(users: list[render.User]) -> list[render.User]:
    return [dataclasses.replace(u, entry=hash_password(f"pw-{u.name}", iterations=1000)) for u in users]


def test_users_go_into_their_zones_with_their_rules_and_certificate_names(tmp_path):
    zones = served(zone("external"), zone("internal", listeners=[{"name": "mqtt", "port": 11883}]))
    rules = [{"permission": "allow", "action": "publish", "filter": "devices/%u/#"}]
    objs = [
        user("sensor", acl=rules, certificateCommonName="sensor.example"),
        user("ops", zones=["external", "internal"], username="operator"),
        user("cert-only", generatePassword=False, certificateCommonName="gw.example"),
    ]
    users, rejected = render.select_users(objs, zones)
    assert rejected == {}
    assert {u.name: u.zones for u in users} == {
        "cert-only": ("external",), "ops": ("external", "internal"), "sensor": ("external",)
    }  # fmt: skip
    users = [u if u.name == "cert-only" else dataclasses.replace(u, entry=hash_password(u.name, iterations=1000))
             for u in users]  # fmt: skip
    r = render.render(render.Fleet.parse(fleet()), zones, users=users)
    cfg = BrokerConfig.model_validate(r.config)
    ext, internal = cfg.zones["external"], cfg.zones["internal"]
    assert list(ext.user_acl) == ["sensor"] and [a.model_dump() for a in ext.user_acl["sensor"]] == rules
    assert ext.cert_users == {"sensor.example": "sensor", "gw.example": "cert-only"}
    assert internal.user_acl == {} and internal.cert_users == {}
    # the users file of each zone is in the fleet's users Secret, pinned by its digest
    [secret] = [m for m in r.manifests if m["kind"] == "Secret" and m["metadata"]["name"] == "edge-mqttusers"]
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "BrokerFleet"
    for name, zs in (("external", ext), ("internal", internal)):
        content = base64.b64decode(secret["data"][name])
        assert zs.users_files[0].path == f"/etc/fleetmq/fleet-users/{name}"
        assert zs.users_files[0].sha256 == hashlib.sha256(content).hexdigest()
        (tmp_path / name).write_bytes(content)
        files = [{"path": str(tmp_path / name), "sha256": zs.users_files[0].sha256}]
        got = zone_users(ZoneSettings.model_validate(zs.model_dump() | {"users_files": files}))
        assert sorted(got or {}) == (["operator", "sensor"] if name == "external" else ["operator"])
    assert render.user_file_entries(secret) == {
        "operator": [u.entry for u in users if u.name == "ops"] * 2,
        "sensor": [u.entry for u in users if u.name == "sensor"],
    }


def test_adding_a_user_changes_the_config_not_the_pod_template():
    zones = served(zone("external"))
    before = render.render(render.Fleet.parse(fleet()), zones)
    users = with_hashes(render.select_users([user("sensor")], zones)[0])
    after = render.render(render.Fleet.parse(fleet()), zones, users=users, user_history=before.user_history)
    sts = [next(m for m in r.manifests if m["kind"] == "StatefulSet") for r in (before, after)]
    assert sts[0]["spec"]["template"] == sts[1]["spec"]["template"]
    assert before.config_hash != after.config_hash
    assert after.user_history[before.config_hash] == {}
    assert after.user_history[after.config_hash] == {"sensor": users[0].token}
    cm = next(m for m in after.manifests if m["kind"] == "ConfigMap")
    assert render.user_history(cm) == after.user_history


def test_unknown_zones_and_taken_names_are_said_and_the_rest_rendered():
    zones = served(zone("external"), zone("internal", listeners=[{"name": "mqtt", "port": 11883}]))
    objs = [
        user("a", zones=["external", "internal"], certificateCommonName="cn-1"),
        user("b", created="2024-02-01T00:00:00Z", zones=["external", "nowhere"]),
        user("c", created="2024-03-01T00:00:00Z", username="a", zones=["external"]),
        user("d", created="2024-04-01T00:00:00Z", zones=["internal"], certificateCommonName="cn-1"),
        user("e", zones=["external"], username="bad/name"),
    ]
    users, rejected = render.select_users(objs, zones)
    assert {u.name: u.zones for u in users} == {"a": ("external", "internal"), "b": ("external",)}
    assert rejected["b"].reason == "UnknownZone" and "nowhere" in rejected["b"].message
    assert rejected["c"].reason == "UsernameConflict" and "MqttUser a" in rejected["c"].message
    assert rejected["d"].reason == "CertificateConflict"
    assert rejected["e"].reason == "InvalidSpec" and rejected["e"].message.startswith("username:")


def test_a_zone_refusing_anonymous_clients_without_users_gets_an_empty_users_file():
    """Without any users file a broker checks no password: a closed zone must get one, even empty."""
    zones = served(zone("external", authentication={"allowAnonymous": False}))
    cfg = BrokerConfig.model_validate(render.render(render.Fleet.parse(fleet()), zones).config)
    [pinned] = cfg.zones["external"].users_files
    assert pinned.sha256 == hashlib.sha256(b"").hexdigest()
    open_zone = served(zone("external"))
    assert (
        BrokerConfig.model_validate(render.render(render.Fleet.parse(fleet()), open_zone).config)
        .zones["external"]
        .users_files
        == []
    )


def test_peer_cert_as_username_reaches_the_listener():
    tls = {"name": "mqtts", "port": 8883, "protocol": "tls", "tlsSecretRef": {"name": "t"}, "verifyPeer": True,
           "peerCertAsUsername": "cn"}  # fmt: skip
    cfg = BrokerConfig.model_validate(
        render.render(render.Fleet.parse(fleet()), served(zone("external", listeners=[tls]))).config
    )
    assert cfg.listeners[0].peer_cert_as_username == "cn" and cfg.listeners[0].cafile


def test_user_status_follows_the_pods_hashes_and_the_password():
    zones = served(zone("external"))
    obj = user("sensor")
    users = with_hashes(render.select_users([obj], zones)[0])
    r1 = render.render(render.Fleet.parse(fleet()), zones, users=users)
    rotated = [dataclasses.replace(users[0], entry=hash_password("new", iterations=1000))]
    r2 = render.render(render.Fleet.parse(fleet()), zones, users=rotated, user_history=r1.user_history)
    pods = ["edge-0", "edge-1"]
    info = {"edge-0": {"config_hash": r2.config_hash}, "edge-1": {"config_hash": r1.config_hash}}
    st = user_status(obj, rejection=None, rendered_user=rotated[0], rendered=r2, nodeinfo=info, pods=pods,
                     secret_name="sensor-credentials")  # fmt: skip
    conds = {c["type"]: c for c in st["conditions"]}
    # the same generation, but pod 1 still runs the old password
    assert (conds["Applied"]["status"], conds["Applied"]["reason"], st["podsApplied"]) == (
        "False",
        "Pending",
        1,
    )
    assert (
        conds["Accepted"]["status"] == "True" and st["username"] == "sensor" and st["zones"] == ["external"]
    )
    info["edge-1"]["config_hash"] = r2.config_hash
    st = user_status(obj | {"status": st}, rejection=None, rendered_user=rotated[0], rendered=r2, nodeinfo=info,
                     pods=pods)  # fmt: skip
    assert {c["type"]: c["status"] for c in st["conditions"]} == {"Accepted": "True", "Applied": "True"}
    missing = render.Rejection("SecretMissing", "spec.passwordSecretRef: Secret pw not found")
    st = user_status(obj, rejection=missing, rendered_user=None, rendered=r2, nodeinfo=info, pods=pods)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Accepted"]["reason"] == conds["Applied"]["reason"] == "SecretMissing"
    assert "Secret pw not found" in conds["Applied"]["message"]


def test_a_users_quotas_reach_the_zones_it_is_in():
    zones = served(zone("external"), zone("internal", listeners=[{"name": "mqtt", "port": 11883}]))
    objs = [user("sensor", zones=["external"],
                 quotas={"maxSubscriptions": 1, "maxPublishBytesRate": 4096, "maxConnections": 2}),
            user("ops", zones=["external", "internal"])]  # fmt: skip
    users, rejected = render.select_users(objs, zones)
    assert rejected == {}
    users = [dataclasses.replace(u, entry=hash_password(u.name, iterations=1000)) for u in users]
    cfg = BrokerConfig.model_validate(render.render(render.Fleet.parse(fleet()), zones, users=users).config)
    ext = cfg.zones["external"]
    assert ext.user_quotas["sensor"].model_dump(exclude_none=True) == {"max_subscriptions": 1,
                                                                       "max_publish_bytes_rate": 4096,
                                                                       "max_connections": 2}  # fmt: skip
    assert ext.quota("sensor") == (ext.max_publish_rate, 4096, 1) and "ops" not in ext.user_quotas
    assert ext.connections_quota("sensor") == 2
    assert ext.connections_quota("ops") == ext.max_connections_per_user == 0
    assert ext.connections_quota(None) == 0
    assert cfg.zones["internal"].user_quotas == {}
