"""The management API (docs/api.md) on a fleet of three nodes sharing a real Redis, with real MQTT clients:
any node answers for the whole fleet, asking the node a client is connected to what only it knows."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from tests.integration.fleet_support import apikey, call, raw_connect
from tests.integration.harness import BrokerProc, uid
from tests.integration.mqttraw import DISCONNECT, PUBLISH, RawClient
from tests.support import wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def api_fleet(fleet, tmp_path):
    keys = tmp_path / "keys.yaml"
    admin, viewer = apikey(keys, "ops", "admin"), apikey(keys, "grafana", "viewer")
    config = {"api": {"bind": "127.0.0.1:0", "keys_file": str(keys)},
              "flapping": {"enabled": True, "max_count": 4, "window": "3s", "ban_time": "30s"}}  # fmt: skip
    nodes = fleet(3, {"max_inflight": 2}, config)
    return nodes, admin, viewer


def test_any_node_answers_for_a_client_connected_to_another(api_fleet):
    (a, b, c), admin, _viewer = api_fleet
    tag = uid("api")
    sub, _ = raw_connect(c, f"{tag}-sub", 5)
    sub.subscribe([(f"{tag}/t", 1)])
    pub, _ = raw_connect(a, f"{tag}-pub", 5)
    for i in range(5):  # the subscriber acknowledges none: 2 in flight (max_inflight), 3 queued
        pub.publish(f"{tag}/t", b"m%d" % i, qos=1)
    sub.recv_n(2, ptype=PUBLISH)

    def listed() -> dict:
        status, body, ctype = call(a, "GET", f"/api/v1/clients?clientid={tag}-sub", admin)
        assert (status, ctype) == (200, "application/json"), body
        return body

    wait_until(lambda: listed()["data"] and listed()["data"][0]["mqueue_len"] == 3, timeout=10,
               msg="the queue as the subscriber's node holds it")  # fmt: skip
    body = listed()
    assert body["meta"] == {"page": 1, "limit": 100, "count": 1}
    (got,) = body["data"]
    assert got["node"] == "node-2" and got["connected"] is True and got["zone"] == "default"
    assert (got["inflight_cnt"], got["mqueue_len"], got["subscriptions_cnt"]) == (2, 3, 1)
    assert (got["peerhost"], got["proto_ver"], got["keepalive"]) == ("127.0.0.1", 5, 60)
    assert got["connected_at"] > 1.7e9

    status, detail, _ = call(b, "GET", f"/api/v1/clients/{tag}-sub", admin)  # through yet another node
    assert status == 200, detail
    assert [d["packet_id"] is not None for d in detail["inflight"]] == [True, True]
    assert [d["topic"] for d in detail["mqueue"]] == [f"{tag}/t"] * 3
    assert detail["subscriptions"] == [{"topic": f"{tag}/t", "qos": 1, "no_local": False,
                                        "retain_as_published": False, "retain_handling": 0,
                                        "subscription_id": None}]  # fmt: skip
    status, subs, _ = call(a, "GET", f"/api/v1/clients/{tag}-sub/subscriptions", admin)
    assert status == 200 and subs == {"data": detail["subscriptions"]}

    # kicked through node a: the client on node c gets DISCONNECT 0x98; its session stays, offline
    status, _, _ = call(a, "DELETE", f"/api/v1/clients/{tag}-sub", admin)
    assert status == 204
    assert sub.expect(DISCONNECT).reason == 0x98
    wait_until(lambda: listed()["data"][0]["connected"] is False, timeout=10, msg="listed offline")
    offline = listed()["data"][0]
    assert offline["node"] is None and offline["mqueue_len"] == 5 and offline["inflight_cnt"] == 0
    status, detail, _ = call(c, "GET", f"/api/v1/clients/{tag}-sub", admin)
    assert status == 200 and len(detail["mqueue"]) == 5 and detail["connected"] is False

    # with session=discard the session ends too: the next CONNECT gets session present 0
    status, _, _ = call(b, "DELETE", f"/api/v1/clients/{tag}-sub?session=discard", admin)
    assert status == 204
    status, gone, ctype = call(a, "GET", f"/api/v1/clients/{tag}-sub", admin)
    assert (status, ctype, gone["status"]) == (404, "application/problem+json", 404)
    again, ack = raw_connect(b, f"{tag}-sub", 5)
    assert ack.session_present is False
    again.close()
    pub.close()


def test_offline_sessions_are_listed_with_their_queue(api_fleet):
    (a, b, _c), _admin, viewer = api_fleet
    tag = uid("off")
    sub, _ = raw_connect(b, f"{tag}-away", 5)
    sub.subscribe([(f"{tag}/t", 1)])
    sub.disconnect()
    pub, _ = raw_connect(a, f"{tag}-pub", 5)
    for i in range(4):
        pub.publish(f"{tag}/t", b"q%d" % i, qos=1)
    wait_until(lambda: call(a, "GET", f"/api/v1/clients?connected=false&clientid={tag}", viewer)[1]["data"],
               timeout=10, msg="the offline session listed")  # fmt: skip
    status, body, _ = call(a, "GET", f"/api/v1/clients?connected=false&clientid={tag}", viewer)
    assert status == 200
    (got,) = body["data"]
    assert (got["clientid"], got["connected"], got["mqueue_len"], got["subscriptions_cnt"]) == (
        f"{tag}-away", False, 4, 1)  # fmt: skip
    # the connected publisher is not in that list, but is in the whole one
    status, body, _ = call(a, "GET", f"/api/v1/clients?clientid={tag}", viewer)
    assert status == 200
    assert [(x["clientid"], x["connected"], x["node"]) for x in body["data"]] == [
        (f"{tag}-away", False, None), (f"{tag}-pub", True, "node-0")]  # fmt: skip
    # pages
    status, body, _ = call(a, "GET", f"/api/v1/clients?clientid={tag}&limit=1&page=2", viewer)
    assert status == 200
    assert [x["clientid"] for x in body["data"]] == [f"{tag}-pub"] and body["meta"]["count"] == 2
    pub.close()


def test_nodes_keys_roles_and_bad_input(api_fleet):
    (a, _b, _c), admin, viewer = api_fleet
    status, body, _ = call(a, "GET", "/api/v1/nodes", viewer)
    assert status == 200
    assert [(n["node"], n["status"]) for n in body["data"]] == [(f"node-{i}", "running") for i in range(3)]
    assert all(n["version"] and len(n["config_hash"]) >= 8 for n in body["data"]), body
    for key, code in ((None, 401), ("fmq_nobody_xxxxxxxx", 401), ("not-a-key", 401)):
        status, problem, ctype = call(a, "GET", "/api/v1/nodes", key)
        assert (status, ctype, problem["status"]) == (code, "application/problem+json", code), problem
    status, zones, _ = call(a, "GET", "/api/v1/zones", viewer)
    assert status == 200 and sorted(z["node"] for z in zones["data"]) == ["node-0", "node-1", "node-2"]
    assert all(z["zones"]["default"]["max_inflight"] == 2 for z in zones["data"])
    status, problem, _ = call(a, "DELETE", "/api/v1/clients/anyone", viewer)
    assert status == 403 and "viewer" in problem["detail"]
    for query, field in (("page=0", "page"), ("limit=5000", "limit"), ("connected=maybe", "connected"),
                         ("colour=red", "colour"), ("page=1&page=2", "page")):  # fmt: skip
        status, problem, ctype = call(a, "GET", f"/api/v1/clients?{query}", admin)
        assert (status, ctype) == (400, "application/problem+json"), (query, problem)
        assert f"query parameter {field}" in problem["detail"], problem
    status, problem, _ = call(a, "DELETE", "/api/v1/clients/anyone?session=forever", admin)
    assert status == 400 and "session" in problem["detail"]
    status, problem, _ = call(a, "GET", "/api/v1/nowhere", admin)
    assert status == 404 and problem["instance"] == "/api/v1/nowhere"
    status, problem, _ = call(a, "DELETE", "/api/v1/clients/nobody", admin)
    assert status == 404 and "nobody" in problem["detail"]


def test_the_openapi_document_validates_and_the_answers_match_it(api_fleet):
    from jsonschema import Draft202012Validator
    from openapi_spec_validator import validate

    (a, _b, _c), admin, _viewer = api_fleet
    status, doc, _ = call(a, "GET", "/api/v1/openapi.json", None)  # (public: it holds no secret)
    assert status == 200
    validate(doc)
    tag = uid("doc")
    client, _ = raw_connect(a, f"{tag}-c", 5)
    client.subscribe([(f"{tag}/x", 0)])

    def check(path: str, schema_name: str, code: int = 200, key: str | None = admin) -> None:
        status, body, _ = call(a, "GET", path, key)
        assert status == code, body
        schema = {"$ref": f"#/components/schemas/{schema_name}", "components": doc["components"]}
        Draft202012Validator(schema).validate(body)

    check("/api/v1/nodes", "NodeList")
    check(f"/api/v1/clients?clientid={tag}", "ClientList")
    check(f"/api/v1/clients/{tag}-c", "ClientDetail")
    check(f"/api/v1/clients/{tag}-c/subscriptions", "SubscriptionList")
    check("/api/v1/clients/nobody", "Problem", 404)
    check("/api/v1/clients?page=0", "Problem", 400)
    check("/api/v1/nodes", "Problem", 401, key=None)
    check("/api/v1/banned", "BannedList")
    check("/api/v1/traces", "TraceList")
    check("/api/v1/zones", "ZonesAnswer")
    check("/api/v1/bridges", "BridgeList")
    none = f"{tag}-none"
    samples = {  # one request for every route the document names (a new route needs one here)
        ("get", "/api/v1/nodes"): ("", None, 200),
        ("get", "/api/v1/clients"): ("", None, 200),
        ("get", "/api/v1/clients/{clientid}"): (none, None, 404),
        ("get", "/api/v1/clients/{clientid}/subscriptions"): (none, None, 404),
        ("delete", "/api/v1/clients/{clientid}"): (none, None, 404),
        ("get", "/api/v1/subscriptions"): ("?topic=a/b", None, 200),
        ("get", "/api/v1/retained"): ("?topic=%23", None, 200),
        ("delete", "/api/v1/retained/{topic}"): (f"{tag}/nothing", None, 404),
        ("post", "/api/v1/publish"): ("", {"topic": f"{tag}/p"}, 200),
        ("get", "/api/v1/banned"): ("", None, 200),
        ("post", "/api/v1/banned"): ("", {"as": "peerhost", "who": "192.0.2.1", "duration": 5}, 201),
        ("delete", "/api/v1/banned/{as}/{who}"): ("clientid/nobody", None, 404),
        ("post", "/api/v1/traces"): ("", {"name": f"{tag}-doc", "topic": "a/#", "duration": 5}, 201),
        ("get", "/api/v1/traces"): ("", None, 200),
        ("get", "/api/v1/traces/{name}"): ("nothing", None, 404),
        ("delete", "/api/v1/traces/{name}"): ("nothing", None, 404),
        ("get", "/api/v1/zones"): ("", None, 200),
        ("get", "/api/v1/bridges"): ("", None, 200),
        ("get", "/api/v1/openapi.json"): ("", None, 200),
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == set(samples)
    for (method, path), (arg, body, code) in samples.items():
        url = re.sub(r"\{\w+\}(/\{\w+\})?", arg, path) if "{" in path else path + arg
        status, _, _ = call(a, method.upper(), url, admin, body)
        assert status == code, (method, url, status)
    client.close()


def test_publish_reaches_a_subscriber_on_another_node_and_survives_kill_9_after_the_200(api_fleet):
    (a, b, c), admin, _viewer = api_fleet
    tag = uid("pub")
    sub, _ = raw_connect(c, f"{tag}-sub", 5)
    sub.subscribe([(f"{tag}/t", 1)])
    status, subscribers, _ = call(a, "GET", f"/api/v1/subscriptions?topic={tag}/t", admin)
    assert status == 200 and [s["clientid"] for s in subscribers["data"]] == [f"{tag}-sub"]
    body = {"topic": f"{tag}/t", "payload": "aGVsbG8=", "payload_encoding": "base64", "qos": 1,
            "properties": {"content_type": "text/plain", "user_properties": {"k": "v"}}}  # fmt: skip
    status, answer, _ = call(a, "POST", "/api/v1/publish", admin, body)
    assert (status, answer) == (200, {"matched": 1})
    got = sub.expect(PUBLISH)
    assert (got.topic, got.payload, got.props.get("content_type")) == (f"{tag}/t", b"hello", "text/plain")
    sub.ack(got)
    # the subscriber goes away; what the API acknowledged is stored: the publishing node and the
    # subscriber's node killed with -9 right after the 200s lose none of it
    sub.close()
    wait_until(lambda: call(b, "GET", f"/api/v1/clients/{tag}-sub", admin)[1]["connected"] is False,
               timeout=10, msg="the subscriber offline")  # fmt: skip
    for i in range(10):
        status, answer, _ = call(
            a, "POST", "/api/v1/publish", admin, {"topic": f"{tag}/t", "payload": f"m{i}", "qos": 1}
        )
        assert (status, answer) == (200, {"matched": 1}), answer
    a.kill()
    c.kill()
    back, ack = raw_connect(b, f"{tag}-sub", 5, timeout=15)
    assert ack.session_present is True
    payloads: list[bytes] = []
    while len(set(payloads)) < 10:  # (acknowledged one by one: the window is 2)
        got = back.recv(timeout=15)
        assert got is not None, f"got only {payloads}"
        if got.type == PUBLISH:
            payloads.append(got.payload)
            back.ack(got)
    assert sorted(set(payloads)) == sorted(b"m%d" % i for i in range(10)), payloads
    back.close()


def test_retained_messages_are_listed_and_cleared_and_publish_input_is_checked(api_fleet):
    (a, b, _c), admin, viewer = api_fleet
    tag = uid("ret")
    for i in range(3):
        status, _, _ = call(a, "POST", "/api/v1/publish", admin,
                            {"topic": f"{tag}/r/{i}", "payload": f"v{i}", "retain": True, "qos": 1})  # fmt: skip
        assert status == 200
    wait_until(lambda: call(b, "GET", f"/api/v1/retained?topic={tag}/%23", viewer)[1]["meta"]["count"] == 3,
               timeout=10, msg="3 retained, seen from another node")  # fmt: skip
    status, body, _ = call(b, "GET", f"/api/v1/retained?topic={tag}/r/%2B&limit=2", viewer)
    assert status == 200 and [m["topic"] for m in body["data"]] == [f"{tag}/r/0", f"{tag}/r/1"]
    assert body["data"][0]["payload"] == "djA=" and body["meta"]["count"] == 3
    status, _, _ = call(b, "DELETE", f"/api/v1/retained/{tag}/r/1", admin)
    assert status == 204
    wait_until(lambda: call(a, "GET", f"/api/v1/retained?topic={tag}/%23", viewer)[1]["meta"]["count"] == 2,
               timeout=10, msg="cleared fleet-wide")  # fmt: skip
    late, _ = raw_connect(a, f"{tag}-late", 5)
    late.subscribe([(f"{tag}/r/#", 0)])
    assert sorted(p.topic for p in late.recv_n(2, ptype=PUBLISH)) == [f"{tag}/r/0", f"{tag}/r/2"]
    assert late.recv(timeout=1) is None  # the cleared topic sends nothing
    late.close()
    status, problem, _ = call(a, "DELETE", f"/api/v1/retained/{tag}/r/1", admin)
    assert status == 404
    # bad input: each a 400 naming what is wrong, nothing published
    for body, said in (({"topic": f"{tag}/+"}, "body topic"), ({"topic": f"{tag}/x", "qos": 3}, "body qos"),
                       ({"topic": "$SYS/x"}, "the server's"),
                       ({"topic": f"{tag}/x", "colour": "red"}, "body colour"), ({}, "body topic"),
                       ({"topic": f"{tag}/x", "payload": "%%", "payload_encoding": "base64"}, "not base64"),
                       ({"topic": f"{tag}/x", "properties": {"message_expiry_interval": -1}},
                        "body properties.message_expiry_interval")):  # fmt: skip
        status, problem, ctype = call(a, "POST", "/api/v1/publish", admin, body)
        assert (status, ctype) == (400, "application/problem+json"), (body, problem)
        assert said in problem["detail"], (said, problem)
    req = urllib.request.Request(f"http://{a.host}:{a.ports['api']}/api/v1/publish", b"{not json", method="POST",
                                 headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 400 and "not JSON" in json.loads(e.value.read())["detail"]
    status, problem, _ = call(a, "POST", "/api/v1/publish", viewer, {"topic": f"{tag}/x"})
    assert status == 403
    status, problem, _ = call(a, "GET", "/api/v1/retained?topic=a/%23/b", viewer)
    assert status == 400 and "topic filter" in problem["detail"]


def connack(bp: BrokerProc, cid: str, version: int = 5, username: str | None = None) -> int:
    with RawClient(bp.host, bp.port, version=version) as c:
        return c.connect(cid, check=False, username=username).reason


def test_bans_refuse_connect_with_0x8a_and_disconnect_connected_clients_fleet_wide(api_fleet):
    (a, b, c), admin, viewer = api_fleet
    tag = uid("ban")
    x, _ = raw_connect(c, f"{tag}-x", 5)
    status, ban, _ = call(a, "POST", "/api/v1/banned", admin,
                          {"as": "clientid", "who": f"{tag}-x", "reason": "stolen", "duration": 60})  # fmt: skip
    assert status == 201 and (ban["as"], ban["who"], ban["by"]) == ("clientid", f"{tag}-x", "ops")
    assert ban["until"] - ban["at"] == pytest.approx(60)
    assert x.expect(DISCONNECT, timeout=3).reason == 0x98  # connected on another node: let go at once
    assert connack(b, f"{tag}-x") == 0x8A
    assert connack(a, f"{tag}-x", version=4) == 5  # (v3 has no "banned": not authorized)
    status, listed, _ = call(b, "GET", "/api/v1/banned", viewer)
    assert status == 200 and [(x["as"], x["who"], x["reason"]) for x in listed["data"]] == [
        ("clientid", f"{tag}-x", "stolen")]  # fmt: skip
    status, _, _ = call(b, "DELETE", f"/api/v1/banned/clientid/{tag}-x", admin)
    assert status == 204
    wait_until(lambda: connack(c, f"{tag}-x") == 0, timeout=5, msg="the lifted ban reaches every node")
    status, _, _ = call(b, "DELETE", f"/api/v1/banned/clientid/{tag}-x", admin)
    assert status == 404
    # by username, on every node
    status, _, _ = call(a, "POST", "/api/v1/banned", admin, {"as": "username", "who": f"{tag}-bob"})
    assert status == 201
    assert [connack(n, uid("any"), username=f"{tag}-bob") for n in (a, b, c)] == [0x8A] * 3
    # bad input: a 400 naming the field, a viewer may not ban
    for body, said in (({"as": "hostname", "who": "h"}, "body as"), ({"as": "clientid"}, "body who"),
                       ({"as": "clientid", "who": "w", "until": 1, "duration": 5}, "not both"),
                       ({"as": "clientid", "who": "w", "until": 1000}, "in the past")):  # fmt: skip
        status, problem, _ = call(a, "POST", "/api/v1/banned", admin, body)
        assert status == 400 and said in problem["detail"], (body, problem)
    assert call(a, "POST", "/api/v1/banned", viewer, {"as": "clientid", "who": "w"})[0] == 403


def test_a_flapping_client_id_is_banned_fleet_wide_and_counted(api_fleet):
    (a, b, _c), admin, _viewer = api_fleet
    cid = uid("flap")
    codes = [connack(a, cid) for _ in range(5)]  # max_count 4 within 3 s
    assert codes == [0, 0, 0, 0, 0x8A], codes
    assert a.metric("fleetmq_flapping_bans_total") == 1
    assert a.metric("fleetmq_banned_refusals_total") == 1
    wait_until(lambda: any(x["who"] == cid for x in call(b, "GET", "/api/v1/banned", admin)[1]["data"]),
               timeout=5, msg="the flapping ban listed")  # fmt: skip
    (ban,) = [x for x in call(b, "GET", "/api/v1/banned", admin)[1]["data"] if x["who"] == cid]
    assert (ban["by"], ban["reason"]) == ("flapping", "flapping") and ban["until"] - ban[
        "at"
    ] == pytest.approx(30)
    wait_until(lambda: connack(b, cid) == 0x8A, timeout=5, msg="refused on the other nodes too")


def test_a_trace_holds_a_clients_packets_as_its_node_saw_them_and_a_topics_publishes(api_fleet):
    (a, b, c), admin, viewer = api_fleet
    tag = uid("trc")
    status, trace, _ = call(a, "POST", "/api/v1/traces", admin,
                            {"name": f"{tag}-c", "clientid": f"{tag}-dev", "duration": 60, "payload_limit": 8})  # fmt: skip
    assert status == 201 and (trace["kind"], trace["status"]) == ("clientid", "running"), trace
    status, _, _ = call(a, "POST", "/api/v1/traces", admin, {"name": f"{tag}-t", "topic": f"{tag}/#"})
    assert status == 201
    assert call(a, "POST", "/api/v1/traces", admin, {"name": f"{tag}-t", "topic": "x"})[0] == 409
    with RawClient(c.host, c.port, version=5) as dev:  # on node c, with a password that must not show
        dev.connect(f"{tag}-dev", username="dev", password=b"s3cret-pw")
        dev.subscribe([(f"{tag}/in", 1)])
        dev.publish(f"{tag}/out", b"A" * 1000, qos=1)
        dev.expect_any()  # its PUBACK
        dev.disconnect()

    def lines(name: str) -> list[dict]:
        req = urllib.request.Request(f"http://{a.host}:{a.ports['api']}/api/v1/traces/{name}",
                                     headers={"Authorization": f"Bearer {viewer}"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("application/x-ndjson")
            text = r.read().decode()
        assert "s3cret-pw" not in text
        return [json.loads(line) for line in text.splitlines()]

    wait_until(lambda: any(r["type"] == "DISCONNECT" for r in lines(f"{tag}-c")), timeout=10,
               msg="the whole session traced")  # fmt: skip
    got = lines(f"{tag}-c")
    assert {r["node"] for r in got} == {"node-2"} and {r["clientid"] for r in got} == {f"{tag}-dev"}
    seen = [(r["dir"], r["type"]) for r in got]
    assert seen[:2] == [("in", "CONNECT"), ("out", "CONNACK")], seen
    for step in [
        ("in", "SUBSCRIBE"),
        ("out", "SUBACK"),
        ("in", "PUBLISH"),
        ("out", "PUBACK"),
        ("in", "DISCONNECT"),
    ]:
        assert step in seen, (step, seen)
    (pub,) = [r for r in got if r["type"] == "PUBLISH"]
    assert (pub["topic"], pub["payload"], pub["payload_size"], pub["qos"]) == (f"{tag}/out", "A" * 8, 1000, 1)
    assert got[0]["username"] == "dev" and "password" not in got[0]
    # the topic trace: that PUBLISH as node c routed it
    wait_until(lambda: lines(f"{tag}-t"), timeout=10, msg="the topic trace's record")
    (routed,) = lines(f"{tag}-t")
    assert (routed["dir"], routed["node"], routed["clientid"], routed["topic"]) == (
        "routed", "node-2", f"{tag}-dev", f"{tag}/out")  # fmt: skip
    status, listed, _ = call(b, "GET", "/api/v1/traces", viewer)
    assert status == 200
    mine = {t["name"]: t for t in listed["data"] if t["name"].startswith(tag)}
    assert mine[f"{tag}-c"]["records"] == len(got) and mine[f"{tag}-t"]["records"] == 1
    assert call(b, "DELETE", f"/api/v1/traces/{tag}-c", admin)[0] == 204
    assert call(b, "GET", f"/api/v1/traces/{tag}-c", admin)[0] == 404
    for body, said in (({"name": "x", "clientid": "a", "topic": "b"}, "one of them"),
                       ({"name": "bad name", "clientid": "a"}, "body name"),
                       ({"name": "x", "topic": "a/#/b"}, "topic filter"),
                       ({"name": "x", "clientid": "a", "duration": 0}, "body duration")):  # fmt: skip
        status, problem, _ = call(a, "POST", "/api/v1/traces", admin, body)
        assert status == 400 and said in problem["detail"], (body, problem)
