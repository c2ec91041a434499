"""Unit tests of the broker config file and zones (fleetmq.broker.config, fleetmq.broker.zones)."""

from __future__ import annotations

import json

import pytest
from fleetmq.broker.config import BrokerConfig, ConfigError, load_config
from fleetmq.broker.zones import ZoneSettings, format_duration, parse_duration
from pydantic import ValidationError

EMQX_COMMON = {
    "mqueue_store_qos0": True,
    "retry_interval": 30.0,
    "max_awaiting_rel": 100,
    "await_rel_timeout": 300.0,
    "server_keepalive": None,
    "keepalive_backoff": 0.75,
    "session_expiry_interval": 7200.0,
    "max_packet_size": 1024 * 1024,
    "max_topic_alias": 65535,
}


def load(**overrides) -> BrokerConfig:
    overrides.setdefault("node_id", "n1")
    return load_config(overrides=overrides)


def error_of(**overrides) -> str:
    with pytest.raises(ConfigError) as ei:
        load(**overrides)
    return str(ei.value)


# -----------------------------------------------------------------------------------------------
# defaults
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "max_inflight", "max_mqueue_len"),
    [("external", 32, 1000), ("internal", 128, 10000), ("default", 32, 1000)],
)
def test_stock_zone_defaults(name, max_inflight, max_mqueue_len):
    cfg = load_config()
    z = cfg.zones[name]
    assert z.max_inflight == max_inflight
    assert z.max_mqueue_len == max_mqueue_len
    for field, value in EMQX_COMMON.items():
        assert getattr(z, field) == value, field


def test_default_config_shape():
    cfg = load_config()
    assert set(cfg.zones) == {"default", "external", "internal"}
    assert cfg.store.kind == "memory"
    assert cfg.listeners == []
    assert cfg.node_id  # the hostname by default
    assert cfg.event_log.enabled is False
    assert cfg.metrics.bind is None


def test_partial_stock_zone_keeps_its_emqx_defaults():
    cfg = load(zones={"internal": {"retry_interval": "5m"}, "external": {"max_mqueue_len": 5}})
    assert cfg.zones["internal"].max_inflight == 128
    assert cfg.zones["internal"].max_mqueue_len == 10000
    assert cfg.zones["internal"].retry_interval == 300.0
    assert cfg.zones["external"].max_inflight == 32
    assert cfg.zones["external"].max_mqueue_len == 5
    assert cfg.zones["default"].max_inflight == 32  # the stock zones not mentioned still exist


def test_empty_stock_zone_and_custom_zone():
    cfg = load(zones={"internal": None, "edge": {"max_inflight": 4}})
    assert cfg.zones["internal"].max_inflight == 128
    assert cfg.zones["edge"].max_inflight == 4
    assert cfg.zones["edge"].max_mqueue_len == 1000  # a custom zone starts from ZoneSettings defaults
    assert {"default", "external", "internal", "edge"} <= set(cfg.zones)


def test_keepalive_timeout_formula():
    assert ZoneSettings().keepalive_timeout(60) == 90.0
    assert ZoneSettings(keepalive_backoff=1.0).keepalive_timeout(10) == 20.0
    assert ZoneSettings().keepalive_timeout(0) == 0


# -----------------------------------------------------------------------------------------------
# durations
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("500ms", 0.5),
        ("1d", 86400.0),
        ("1.5s", 1.5),
        (" 10 s ", 10.0),
        ("45", 45.0),
        (12, 12.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
    assert ZoneSettings(retry_interval=text).retry_interval == seconds
    assert ZoneSettings(await_rel_timeout=text).await_rel_timeout == seconds


@pytest.mark.parametrize("bad", ["abc", "-5s", "5 minutes", "5x", "", True, None, "1e3s"])
def test_bad_durations(bad):
    with pytest.raises(ValidationError):
        ZoneSettings(retry_interval=bad)


def test_negative_number_duration_refused():
    with pytest.raises(ValueError):
        parse_duration(-1)


def test_durations_in_config_file_and_json_dump(tmp_path):
    p = tmp_path / "broker.yaml"
    p.write_text(
        "node_id: n1\n"
        "zones:\n"
        "  external:\n"
        "    retry_interval: 500ms\n"
        "    await_rel_timeout: 5m\n"
        "    session_expiry_interval: 2h\n"
    )
    cfg = load_config(p)
    z = cfg.zones["external"]
    assert (z.retry_interval, z.await_rel_timeout, z.session_expiry_interval) == (0.5, 300.0, 7200.0)
    dumped = cfg.model_dump(mode="json")["zones"]["external"]
    assert dumped["retry_interval"] == "500ms"
    assert dumped["await_rel_timeout"] == "300s"
    assert format_duration(30.0) == "30s"
    # what is dumped loads back to the same config
    assert BrokerConfig.model_validate(cfg.model_dump(mode="json")) == cfg


# -----------------------------------------------------------------------------------------------
# errors name the field path
# -----------------------------------------------------------------------------------------------


def test_error_names_zone_field_path():
    msg = error_of(zones={"external": {"max_inflight": -1}})
    assert "zones.external.max_inflight" in msg


def test_error_names_every_bad_field():
    msg = error_of(zones={"external": {"max_inflight": 70000}, "edge": {"keepalive_backoff": 0}})
    assert "zones.external.max_inflight" in msg
    assert "zones.edge.keepalive_backoff" in msg


def test_error_for_bad_duration_names_field():
    msg = error_of(zones={"default": {"retry_interval": "soon"}})
    assert "zones.default.retry_interval" in msg


def test_error_unknown_listener_zone():
    msg = error_of(listeners=[{"name": "mqtt", "bind": "127.0.0.1:1883", "zone": "nope"}])
    assert "listeners.0.zone" in msg
    assert "nope" in msg


def test_error_second_listener_path():
    msg = error_of(
        listeners=[
            {"name": "a", "bind": "127.0.0.1:1883"},
            {"name": "b", "bind": "127.0.0.1:1884", "zone": "missing"},
        ]
    )
    assert "listeners.1.zone" in msg


def test_error_unknown_top_level_field():
    msg = error_of(bogus=1)
    assert "bogus" in msg


def test_error_unknown_zone_field():
    msg = error_of(zones={"external": {"max_inflite": 3}})
    assert "zones.external.max_inflite" in msg


@pytest.mark.parametrize("bind", ["nope", "host:port", "1.2.3.4:70000", "1883", "1.2.3.4:"])
def test_error_bad_bind(bind):
    msg = error_of(listeners=[{"name": "mqtt", "bind": bind}])
    assert "listeners.0.bind" in msg


def test_error_bad_metrics_bind():
    assert "metrics.bind" in error_of(metrics={"bind": "x"})


def test_good_listeners():
    cfg = load(
        listeners=[
            {"name": "mqtt", "bind": "0.0.0.0:1883", "zone": "external"},
            {"name": "ws", "bind": "[::1]:8083", "protocol": "ws"},
            {"name": "any", "bind": ":1884"},
        ]
    )
    assert cfg.listeners[0].address == ("0.0.0.0", 1883)
    assert cfg.listeners[1].address == ("::1", 8083)
    assert cfg.listeners[2].address == ("0.0.0.0", 1884)


def test_error_duplicate_listener_name_and_bind():
    assert "listeners.1.name" in error_of(
        listeners=[{"name": "a", "bind": "0.0.0.0:1"}, {"name": "a", "bind": "0.0.0.0:2"}]
    )
    assert "listeners.1.bind" in error_of(
        listeners=[{"name": "a", "bind": "0.0.0.0:1"}, {"name": "b", "bind": "0.0.0.0:1"}]
    )


def test_error_tls_without_certificate():
    assert "listeners.0" in error_of(listeners=[{"name": "s", "bind": "0.0.0.0:8883", "protocol": "tls"}])


def test_error_ws_path_must_be_absolute():
    msg = error_of(listeners=[{"name": "w", "bind": "0.0.0.0:8083", "protocol": "ws", "path": "mqtt"}])
    assert "listeners.0.path" in msg


def test_error_bad_store_kind():
    msg = error_of(store={"kind": "etcd"})
    assert "store" in msg


def test_redis_store_config():
    cfg = load(store={"kind": "redis", "url": "redis://r:6379/0"})
    assert cfg.store.kind == "redis"
    assert cfg.store.wait_replicas == 0
    assert "store: set exactly one of url, sentinel, cluster" in error_of(store={"kind": "redis"})


def test_redis_store_topologies():
    sentinel = load(
        store={"kind": "redis", "sentinel": {"nodes": ["s1:26379", "[::1]:26380"], "master": "edge"}, "db": 2}
    ).store
    assert sentinel.topology == "sentinel" and sentinel.sentinel.nodes == ["s1:26379", "::1:26380"]
    cluster = load(store={"kind": "redis", "cluster": {"nodes": ["r1:6379"]}, "wait_replicas": 1}).store
    assert cluster.topology == "cluster" and cluster.wait_replicas == 1
    assert "got url, sentinel" in error_of(
        store={"kind": "redis", "url": "redis://r:6379/0", "sentinel": {"nodes": ["s:1"], "master": "m"}}
    )
    assert "store.sentinel.nodes: expected HOST:PORT, got 's1'" in error_of(
        store={"kind": "redis", "sentinel": {"nodes": ["s1"], "master": "m"}}
    )
    assert "store.sentinel.master" in error_of(store={"kind": "redis", "sentinel": {"nodes": ["s:1"]}})
    assert "store.db: a Redis Cluster has only database 0" in error_of(
        store={"kind": "redis", "cluster": {"nodes": ["r:1"]}, "db": 1}
    )
    assert "store.url" in error_of(store={"kind": "redis", "url": "http://r:6379"})


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("zones: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).zones["internal"].max_inflight == 128
    field = tmp_path / "field.yaml"
    field.write_text("node_id: x\nzones:\n  external:\n    max_inflight: -1\n")
    with pytest.raises(ConfigError, match=r"zones\.external\.max_inflight"):
        load_config(field)


def test_overrides_win_over_file(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("node_id: from-file\n")
    assert load_config(p, overrides={"node_id": "from-override"}).node_id == "from-override"


# -----------------------------------------------------------------------------------------------
# config hash
# -----------------------------------------------------------------------------------------------


def test_config_hash_is_stable():
    a = load(zones={"external": {"max_inflight": 10}})
    b = load(zones={"external": {"max_inflight": 10}})
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() == a.config_hash()
    assert len(a.config_hash()) == 16
    int(a.config_hash(), 16)


def test_config_hash_does_not_depend_on_spelling():
    a = load(zones={"external": {"retry_interval": "30s", "max_inflight": 32}})
    b = load(zones={"external": {}})
    c = load(zones={"external": {"retry_interval": 30}})
    assert a.config_hash() == b.config_hash() == c.config_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"zones": {"external": {"max_inflight": 33}}},
        {"zones": {"internal": {"retry_interval": "31s"}}},
        {"zones": {"default": {"server_keepalive": 10}}},
        {"zones": {"new": {}}},
        {"listeners": [{"name": "m", "bind": "0.0.0.0:1883"}]},
    ],
)
def test_config_hash_changes_with_a_setting(change):
    assert load(**change).config_hash() != load().config_hash()


def test_config_hash_is_the_same_on_every_pod():
    """The operator renders one config for all pods and computes the hash they report from it; the store's
    URL (with a password from a Secret) is not part of it."""
    assert load(node_id="broker-0").config_hash() == load(node_id="broker-1").config_hash()
    redis = [load(store={"kind": "redis", "url": f"redis://:{pw}@redis:6379/0"}) for pw in ("a", "b")]
    assert redis[0].config_hash() == redis[1].config_hash()


def test_config_dump_is_json_serialisable():
    cfg = load()
    json.dumps(cfg.model_dump(mode="json"))


def test_a_reload_refuses_an_empty_config_file(tmp_path):
    """A reload that read the file while it was being rewritten (truncated, not yet written) applied the
    defaults: every configured listener closed and a tcp one opened on 1883 (seen in an empty-cache CI
    run, tests/monitoring/test_promql.py). On reload an empty file is an error; at start it is the
    defaults, as ever."""
    path = tmp_path / "fleetmq.yaml"
    for text in ("", "\n", "# nothing yet\n"):
        path.write_text(text)
        with pytest.raises(ConfigError, match="the file is empty"):
            load_config(path, empty_ok=False)
        assert load_config(path).node_id


def test_transport_epoll_is_for_plain_listeners_only():
    assert (
        load(listeners=[{"name": "m", "bind": "0.0.0.0:1883", "transport": "epoll"}]).listeners[0].transport
        == "epoll"
    )
    assert load(listeners=[{"name": "m", "bind": "0.0.0.0:1883"}]).listeners[0].transport == "auto"
    msg = error_of(
        listeners=[
            {"name": "s", "bind": "0.0.0.0:8883", "protocol": "tls", "certfile": "c.pem", "keyfile": "k.pem",
             "transport": "epoll"}
        ]
    )  # fmt: skip
    assert "listeners.0" in msg and "transport epoll carries tcp and ws listeners only, not tls" in msg
    assert "transport" in error_of(listeners=[{"name": "m", "bind": "0.0.0.0:1883", "transport": "uring"}])
