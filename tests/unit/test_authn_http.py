"""The http authenticator's pure parts: the request's fields and the answer's decision."""

from __future__ import annotations

import pytest
from fleetmq.broker.authn.chain import IGNORED, Credentials, Verdict
from fleetmq.broker.authn.http import ServiceError, decision, fields
from fleetmq.broker.zones import AclRule, HttpAuthentication


def test_the_body_places_the_connects_client_id_username_password_and_address():
    body = HttpAuthentication(mechanism="http", url="http://auth/x").body
    c = Credentials("dev-1", "alice", b"s3cret", "10.1.2.3")
    assert fields(body, c) == {
        "clientid": "dev-1",
        "username": "alice",
        "password": "s3cret",
        "peerhost": "10.1.2.3",
    }
    assert fields({"who": "%u@%c"}, Credentials("c", None, None, "h")) == {"who": "@c"}


def test_an_answer_allows_denies_or_ignores_and_carries_superuser_and_rules():
    d = decision(
        200, b'{"result": "allow", "is_superuser": true, "acl": [{"permission": "deny", "filter": "x"}]}'
    )
    assert d.verdict is Verdict.ALLOW and d.identity is not None and d.identity.superuser
    assert d.identity.rules == (AclRule(permission="deny", filter="x"),)
    assert decision(200, b'{"result": "deny"}').verdict is Verdict.DENY
    assert decision(204, b'{"result": "ignore"}') is IGNORED


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (503, b"", "HTTP 503"),
        (404, b'{"result": "allow"}', "HTTP 404"),
        (200, b"<html>", "not a JSON object"),
        (200, b'["allow"]', "not a JSON object"),
        (200, b'{"result": "maybe"}', "not allow, deny or ignore"),
        (200, b'{"result": "allow", "acl": [{"permission": "perhaps", "filter": "#"}]}', "not rules"),
    ],
)
def test_an_answer_that_is_not_a_decision_is_the_service_unavailable(status, body, says):
    with pytest.raises(ServiceError, match=says):
        decision(status, body)
