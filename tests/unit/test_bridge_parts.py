"""The pure parts of bridges (issue 16): destination templates, reconnect delays, loop prevention and the
`bridges:` config section with its errors."""

from __future__ import annotations

import pytest
from fleetmq.broker.bridge import loop as bridgeloop
from fleetmq.broker.bridge.backoff import Backoff
from fleetmq.broker.config import ConfigError, load_config
from fleetmq.broker.topicmap import TEMPLATE_PATTERN, Template


@pytest.mark.parametrize(
    ("template", "topic", "expected"),
    [
        ("{#}", "a/b/c", "a/b/c"),
        ("site/{#}", "a/b", "site/a/b"),
        ("{2-#}", "edge/a/b", "a/b"),
        ("{1}/x/{3}", "a/b/c", "a/x/c"),
        ("{2-3}", "a/b/c/d", "b/c"),
        ("fixed", "a/b", "fixed"),
        ("{1}-{2}", "a/b", "a-b"),
        ("{3}", "a/b", None),  # fewer levels than the placeholder takes
        ("{2-4}", "a/b/c", None),
        ("{3-#}", "a/b", None),
        ("p/{1}", "/x", "p/"),  # an empty first level is a level
    ],
)
def test_templates_render_levels(template, topic, expected):
    assert Template.parse(template).render(topic) == expected


@pytest.mark.parametrize(
    ("template", "complaint"),
    [
        ("{x}", "unknown placeholder {x}"),
        ("{0}", "unknown placeholder {0}"),
        ("{}", "unknown placeholder {}"),
        ("{3-1}", "ends before it starts"),
        ("a/+/b", "wildcard '+'"),
        ("a/#", "wildcard '#'"),
        ("a/{1", "unmatched '{'"),
        ("", "cannot be empty"),
    ],
)
def test_bad_templates_are_refused_with_the_reason(template, complaint):
    import re

    with pytest.raises(ValueError, match=re.escape(complaint)):
        Template.parse(template)
    assert template == "{3-1}" or not re.match(TEMPLATE_PATTERN, template)  # the CRD's pattern refuses it too


def test_the_crd_pattern_accepts_every_placeholder_form():
    import re

    for t in ("{#}", "a/{1}", "{1-2}/{3-#}", "x{12}y"):
        assert re.match(TEMPLATE_PATTERN, t), t


def test_backoff_doubles_to_the_cap_with_jitter_and_resets_only_after_a_stable_connection():
    rolls = iter([0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    b = Backoff(initial=1.0, maximum=5.0, jitter=0.25, stable_after=30.0, rand=lambda: next(rolls))
    assert [b.next_delay() for _ in range(5)] == [1.0, 2.5, 4.5, 5.0, 5.0]
    b.connected(100.0)
    b.disconnected(110.0)  # up 10 s: not stable, keeps backing off
    assert b.next_delay() == 5.0
    b.connected(200.0)
    b.disconnected(230.0)  # up 30 s: starts over
    assert b.next_delay() == 1.0 and b.attempts == 1


def test_loop_prevention_path_and_hop_count():
    props = [("k", "v")]
    out = bridgeloop.egress(props, "edge", "cloud", hop_limit=1)
    assert out == [("k", "v"), (bridgeloop.PATH, "edge"), (bridgeloop.HOP_COUNT, "1")]
    assert bridgeloop.ingress_loops(out, "edge") and not bridgeloop.ingress_loops(out, "cloud")
    # the cloud fleet must not send it back to edge, by path, nor anywhere with a hop limit of 1
    assert bridgeloop.egress(out, "cloud", "edge", hop_limit=0) is None
    assert bridgeloop.egress(out, "cloud", "third", hop_limit=1) is None
    onward = bridgeloop.egress(out, "cloud", "third", hop_limit=0)
    assert onward is not None and dict(onward)[bridgeloop.PATH] == "edge,cloud"
    assert dict(onward)[bridgeloop.HOP_COUNT] == "2"
    assert bridgeloop.egress([(bridgeloop.HOP_COUNT, "junk")], "a", "b", 1) is not None


def _bridge(**kw):
    base = {"name": "cloud", "remote": {"host": "mqtt.example.com"}, "forwards": [{"filter": "up/#"}]}
    base.update(kw)
    return base


def test_a_bridge_config_gets_the_seeds_defaults():
    cfg = load_config(overrides={"bridges": [_bridge()]})
    [b] = cfg.bridges
    assert b.remote.address == ("mqtt.example.com", 1883) and b.remote.mqtt_version == 5
    assert b.client_id(cfg.fleet) == "fleetmq-cloud" and b.session_id == "$bridge:cloud"
    assert (b.queue.overflow, b.reconnect.initial_delay, b.reconnect.max_delay) == ("dropOldest", 1.0, 120.0)
    tls = load_config(overrides={"bridges": [_bridge(remote={"host": "h", "transport": "wss"})]})
    assert tls.bridges[0].remote.address == ("h", 443)


@pytest.mark.parametrize(
    ("bridges", "path", "complaint"),
    [
        ([_bridge(forwards=[{"filter": "up/#", "destination": "x/{y}"}])], "bridges.0.forwards.0.destination",
         "unknown placeholder"),
        ([_bridge(forwards=[{"filter": "up/#/x"}])], "bridges.0.forwards.0.filter", "not a valid MQTT topic filter"),
        ([_bridge(forwards=[], subscriptions=[])], "bridges.0", "at least one forward or subscription"),
        ([_bridge(), _bridge()], "bridges.1.name", "duplicate bridge name"),
        ([_bridge(), _bridge(name="other", remote={"host": "mqtt.example.com", "client_id": "fleetmq-cloud"})],
         "bridges.1.remote.client_id", "already connects to mqtt.example.com:1883"),
        ([_bridge(queue={"overflow": "dropSome"})], "bridges.0.queue.overflow", "dropOldest"),
    ],
)  # fmt: skip
def test_bad_bridge_configs_name_the_field(bridges, path, complaint):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"bridges": bridges})
    assert path in str(err.value) and complaint in str(err.value), str(err.value)
