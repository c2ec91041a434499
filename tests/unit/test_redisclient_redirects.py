"""Which error replies mean "this did not run here, ask the map again": told by the class redis-py parses
them into (a MovedError's text has no MOVED prefix: a prefix test missed every one of them)."""

from __future__ import annotations

import pytest
from fleetmq.broker.store.connections import in_transition, redirected
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError


@pytest.mark.parametrize(
    ("reply", "redirect", "wait"),
    [
        ("MOVED 3425 127.0.0.1:7001", True, False),
        ("ASK 3425 127.0.0.1:7001", True, False),
        ("TRYAGAIN Multiple keys request during rehashing of slot", True, True),
        ("CLUSTERDOWN The cluster is down", True, True),
        ("READONLY You can't write against a read only replica.", False, False),
        ("ERR unknown command", False, False),
    ],
)
def test_redirects_as_redis_py_parses_them(reply: str, redirect: bool, wait: bool):
    error = BaseParser.parse_error(reply)
    assert isinstance(error, ResponseError)
    assert (redirected(error), in_transition(error)) == (redirect, wait), (type(error), str(error))
