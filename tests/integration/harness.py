"""Integration-test harness: broker processes (fleetmq or mosquitto) and client helpers."""

from __future__ import annotations

import contextlib
import copy
import getpass
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support import HOST, free_port, kill_process, stop_process, wait_port

MOSQUITTO = os.environ.get("FLEETMQ_TEST_BROKER", "fleetmq").lower() == "mosquitto"
MOSQUITTO_BIN = os.environ.get("MOSQUITTO_BIN", "/usr/sbin/mosquitto")


def xfail_mosquitto(reason: str):
    """Mark a generic test as an expected failure in mosquitto mode only (mosquitto deviates)."""
    import pytest

    return pytest.mark.xfail(MOSQUITTO, reason=f"mosquitto 2.0 deviates: {reason}", strict=True)


# every broker process started by the harness, so failing tests can show their logs
LIVE_BROKERS: list[BrokerProc] = []


def uid(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def rewrite(bp: BrokerProc, change: Callable[[dict], None]) -> None:
    """Change a running broker's config file in place (it reloads what it sees: the live-change path)."""
    assert bp.config_path is not None
    cfg = yaml.safe_load(bp.config_path.read_text())
    change(cfg)
    bp.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))


# ------------------------------------------------------------------ broker processes
@dataclass
class BrokerProc:
    host: str
    port: int
    metrics_port: int | None
    proc: subprocess.Popen
    log_path: Path
    kind: str = "fleetmq"
    config_path: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)  # listener name -> port
    cmd: list[str] = field(default_factory=list)  # the command line, for restart()
    paused: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- metrics
    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        assert self.metrics_port, "this broker has no metrics endpoint"
        url = f"http://{HOST}:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.http_get("/metrics")
        assert status == 200, f"/metrics answered {status}"
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when absent)."""
        total = 0.0
        want = {k: str(v) for k, v in labels.items()}
        for key, value in self.metrics().items():
            sname, _, rest = key.partition("{")
            if sname != name:
                continue
            have = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
            if all(have.get(k) == v for k, v in want.items()):
                total += value
        return total

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    # -- lifecycle
    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (a paused broker is resumed to act on it), SIGKILL after `timeout`; reaped."""
        self.paused = False
        return stop_process(self.proc, timeout)

    def stop(self) -> None:
        self.terminate()
        if self in LIVE_BROKERS:
            LIVE_BROKERS.remove(self)

    def kill(self) -> int | None:
        """SIGKILL (kill -9) and reap. The broker stays in LIVE_BROKERS (its log is shown on failure)."""
        self.paused = False
        return kill_process(self.proc)

    def pause(self) -> None:
        """SIGSTOP: connections and listeners stay open, nothing is answered, no heartbeat."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def restart(self, timeout: float = 15.0) -> BrokerProc:
        """Stop the process if it still runs (SIGTERM), then run the same command line again (same config
        file, listener and metrics ports, log appended) and wait for every port. Returns self (new pid)."""
        assert self.cmd, "this BrokerProc has no command line to restart"
        self.terminate()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n----- harness: restart (previous pid {self.pid}) -----\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(
                self.cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.paused = False
        if self not in LIVE_BROKERS:
            LIVE_BROKERS.append(self)
        ports = [*self.ports.values()] or [self.port]
        for p in [*ports, *([self.metrics_port] if self.metrics_port else [])]:
            _wait_port(self, p, timeout)
        return self


def _wait_port(bp: BrokerProc, port: int, timeout: float = 15.0) -> None:
    """Wait until the broker listens on `port`; stop it and raise with its log if it exits or never does."""
    try:
        wait_port(HOST, port, timeout, bp.proc)
    except RuntimeError as e:
        bp.terminate()
        raise RuntimeError(f"{bp.kind} {e}:\n{bp.log()}") from None


def fleetmq_config(
    port: int, config: dict | None = None, zone_overrides: dict | None = None, zone: str = "default"
) -> dict:
    cfg: dict[str, Any] = {
        "node_id": "test-node",
        "store": {"kind": "memory"},
        "zones": {zone: {}},
        "listeners": [{"name": "mqtt", "zone": zone, "bind": f"{HOST}:{port}", "protocol": "tcp"}],
    }
    if config:
        cfg.update(copy.deepcopy(config))
    if zone_overrides:
        cfg["zones"].setdefault(zone, {}).update(zone_overrides)
    return cfg


def start_fleetmq(
    workdir: Path,
    config: dict | None = None,
    *,
    zone_overrides: dict | None = None,
    extra_args: tuple | list = (),
    wait_listeners: bool = True,
    wrap: tuple | list = (),
) -> BrokerProc:
    """Start `python -m fleetmq.broker --config FILE --metrics ...`.

    `wrap`: a command that execs the broker in place, e.g. ("unshare", "-T", "--monotonic", "86400"): a node
    whose monotonic clock is a day ahead, as on a host that booted a day earlier (the pid stays the broker's).

    `config` entries replace the defaults (node_id, store, zones, listeners); listeners in `config` may
    use bind "127.0.0.1:0" to get a free port. `zone_overrides` are merged into zone "default".
    `wait_listeners=False`: return once /metrics answers (a node waiting for its store has no listeners).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = fleetmq_config(port, config, zone_overrides)
    ports: dict[str, int] = {}
    for lst in cfg["listeners"]:
        h, _, p = lst["bind"].rpartition(":")
        if p == "0":
            lst["bind"] = f"{h}:{free_port()}"
        ports[lst["name"]] = int(lst["bind"].rpartition(":")[2])
    main_port = next(iter(ports.values()))
    api = cfg.get("api") or {}
    if str(api.get("bind", "")).endswith(":0"):  # the management API on a free port too
        api["bind"] = f"{api['bind'].rpartition(':')[0]}:{free_port()}"
    if api.get("bind"):
        ports["api"] = int(api["bind"].rpartition(":")[2])
    mport = free_port()
    name = uid("fleetmq-")
    cfg_path = workdir / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log_path = workdir / f"{name}.log"
    logf = open(log_path, "wb")  # noqa: SIM115
    cmd = [
        *wrap,
        sys.executable,
        "-m",
        "fleetmq.broker",
        "--config",
        str(cfg_path),
        "--metrics",
        f"{HOST}:{mport}",
        "--log-level",
        os.environ.get("FLEETMQ_TEST_LOG_LEVEL", "info"),  # debug: the lease, store and channel details
        *extra_args,
    ]
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    logf.close()
    bp = BrokerProc(HOST, main_port, mport, proc, log_path, "fleetmq", cfg_path, ports, cmd)
    LIVE_BROKERS.append(bp)
    try:
        for p in [*ports.values(), mport] if wait_listeners else [mport]:
            _wait_port(bp, p)
    except RuntimeError:
        LIVE_BROKERS.remove(bp)
        raise
    return bp


def passwd(path: Path, user: str, password: str) -> None:
    """Add or update `user` in the users file at `path`, with the broker's own `passwd` command."""
    cmd = [sys.executable, "-m", "fleetmq.broker", "passwd", str(path), user, "--password", password]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def start_mosquitto(
    workdir: Path,
    *,
    persistence: bool = False,
    port: int | None = None,
    websockets: bool = False,
    wss: tuple[str, str] | None = None,
    queue_qos0: bool = False,
) -> BrokerProc:
    """mosquitto on loopback; `persistence` keeps its sessions and queues in workdir across restarts
    (a remote broker of a bridge), `port` reuses one (a restart); `websockets` adds a WebSocket
    listener (its port in `ports["ws"]`), `wss` (certificate file, key file) one over TLS (`ports["wss"]`);
    `queue_qos0`: QoS 0 messages wait for an offline persistent session too (queue_qos0_messages)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    name = uid("mosquitto-")
    conf = workdir / f"{name}.conf"
    persist = (
        f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\nmax_queued_messages 1000000\n"
        if persistence
        else "persistence false\nmax_queued_messages 10000\n"
    )
    # (`user`: run as root, mosquitto drops to user mosquitto, which can neither write its persistence file
    # nor read a test's key here)
    persist += f"user {getpass.getuser()}\n"
    if queue_qos0:
        persist += "queue_qos0_messages true\n"
    ws_port = free_port() if websockets else None
    ws = f"listener {ws_port} {HOST}\nprotocol websockets\n" if ws_port else ""
    wss_port = free_port() if wss else None
    if wss:
        ws += f"listener {wss_port} {HOST}\nprotocol websockets\ncertfile {wss[0]}\nkeyfile {wss[1]}\n"
    conf.write_text(
        f"per_listener_settings false\nlistener {port} {HOST}\n{ws}allow_anonymous true\n{persist}"
        "log_dest stderr\nlog_type all\n"
    )
    log_path = workdir / f"{name}.log"
    logf = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [MOSQUITTO_BIN, "-c", str(conf)], stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    logf.close()
    bp = BrokerProc(
        HOST, port, None, proc, log_path, "mosquitto", conf,
        {"mqtt": port, **({"ws": ws_port} if ws_port else {}), **({"wss": wss_port} if wss_port else {})},
        [MOSQUITTO_BIN, "-c", str(conf)],
    )  # fmt: skip
    LIVE_BROKERS.append(bp)
    try:
        _wait_port(bp, port)
    except RuntimeError:
        LIVE_BROKERS.remove(bp)
        raise
    return bp


# ------------------------------------------------------------------ paho clients
PROTOCOLS = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    mid: int
    props: dict[str, Any]


def _props_dict(p: Properties | None) -> dict[str, Any]:
    if p is None:
        return {}
    out = {}
    for name in p.names:
        attr = name.replace(" ", "")
        if hasattr(p, attr):
            out[attr] = getattr(p, attr)
    return out


def make_props(packet_type: int = PacketTypes.PUBLISH, **kw) -> Properties:
    """make_props(PacketTypes.CONNECT, SessionExpiryInterval=60)"""
    p = Properties(packet_type)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


class Client:
    """A synchronous wrapper around a paho-mqtt 2.x client with its own network thread.

    Messages land in a thread-safe queue; `wait_for(n)` collects them. No auto-reconnect.
    """

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str = "",
        *,
        version: int = 4,
        clean: bool = True,
        keepalive: int = 60,
        session_expiry: int | None = None,
        connect_props: dict | None = None,
        will: dict | None = None,
        connect: bool = True,
        timeout: float = 5.0,
    ):
        self.host, self.port, self.version = host, port, version
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.c = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=PROTOCOLS[version],
            **kwargs,
        )
        self.client_id = client_id
        self.clean = clean
        self.keepalive = keepalive
        self.session_expiry = session_expiry
        self.connect_props = connect_props or {}
        self.messages: queue.Queue[Received] = queue.Queue()
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        self._suback: dict[int, list] = {}
        self._suback_ev = threading.Condition()
        self.connack: dict[str, Any] = {}
        self.disconnect_reason: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = self._on_subscribe
        self.c.on_disconnect = self._on_disconnect
        # Only the network thread writes. Without a thread of its own (loop_start), paho also writes from
        # the thread that publishes, and two threads taking packets off its queue at once can send them
        # out of order: a publish of the test's thread overtaking the one the network thread had taken
        # (test_ordering_1000_messages saw message 9 before 8). With a socket-write callback set, a call
        # only queues its packet and wakes the network thread.
        self.c.on_socket_register_write = lambda client, userdata, sock: None
        if will:
            wprops = None
            if version == 5 and will.get("props"):
                wprops = make_props(PacketTypes.WILLMESSAGE, **will["props"])
            self.c.will_set(
                will["topic"], will.get("payload", b""), will.get("qos", 0), will.get("retain", False), wprops
            )
        if connect:
            self.connect(timeout=timeout)

    # -- callbacks (network thread)
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connack = {
            "session_present": bool(flags.session_present),
            "reason_code": reason_code.value if hasattr(reason_code, "value") else int(reason_code),
            "props": _props_dict(properties),
        }
        self._connected.set()

    def _on_message(self, client, userdata, msg):
        r = Received(
            msg.topic,
            msg.payload,
            msg.qos,
            bool(msg.retain),
            bool(msg.dup),
            msg.mid,
            _props_dict(getattr(msg, "properties", None)),
        )
        with self._lock:
            self.received.append(r)
        self.messages.put(r)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        with self._suback_ev:
            self._suback[mid] = [getattr(rc, "value", rc) for rc in reason_codes]
            self._suback_ev.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnect_reason = getattr(reason_code, "value", reason_code)
        self._disconnected.set()

    def _run(self):
        while not self._stop.is_set():
            rc = self.c.loop(timeout=0.02)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                self._disconnected.set()
                return
        # (what the test queued before it stopped the client goes out, as when a call wrote it at once)
        with contextlib.suppress(Exception):
            self.c.loop_write()

    # -- API
    def connect(self, *, clean: bool | None = None, timeout: float = 5.0) -> dict:
        props = None
        kw: dict[str, Any] = {}
        if self.version == 5:
            cp = dict(self.connect_props)
            if self.session_expiry is not None:
                cp["SessionExpiryInterval"] = self.session_expiry
            if cp:
                props = make_props(PacketTypes.CONNECT, **cp)
            kw["clean_start"] = self.clean if clean is None else clean
        self._connected.clear()
        self._disconnected.clear()
        self.c.connect(self.host, self.port, self.keepalive, properties=props, **kw)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"paho-{self.client_id}")
        self._thread.start()
        if not self._connected.wait(timeout):
            self.stop()
            raise AssertionError(f"no CONNACK for {self.client_id!r} within {timeout}s")
        if self.connack["reason_code"] != 0:
            self.stop()
            raise AssertionError(f"connection refused: {self.connack}")
        return self.connack

    @property
    def session_present(self) -> bool:
        return self.connack.get("session_present", False)

    def subscribe(self, topic, qos: int = 0, *, timeout: float = 5.0, props: dict | None = None, **opts):
        """subscribe("a/b", 1) or subscribe([("a", 1), ("b", 2)]); v5 options via opts
        (noLocal, retainAsPublished, retainHandling). Returns the SUBACK reason codes."""
        p = make_props(PacketTypes.SUBSCRIBE, **props) if props else None
        if self.version == 5:
            topics = topic if isinstance(topic, list) else [(topic, qos)]
            topics = [(t, mqtt.SubscribeOptions(qos=q, **opts)) for t, q in topics]
            rc, mid = self.c.subscribe(topics, properties=p)
        else:
            rc, mid = self.c.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe failed: {rc}"
        with self._suback_ev:
            ok = self._suback_ev.wait_for(lambda: mid in self._suback, timeout)
        assert ok, f"no SUBACK for {topic!r}"
        return self._suback.pop(mid)

    def unsubscribe(self, topic, *, timeout: float = 5.0):
        rc, mid = self.c.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        with self._suback_ev:
            ok = self._suback_ev.wait_for(lambda: mid in self._suback, timeout)
        assert ok, f"no UNSUBACK for {topic!r}"
        return self._suback.pop(mid)

    def publish(
        self, topic, payload=b"", qos=0, retain=False, *, props: dict | None = None, wait: bool = True
    ):
        p = make_props(PacketTypes.PUBLISH, **props) if props else None
        info = self.c.publish(topic, payload, qos, retain, properties=p)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish failed: {info.rc}"
        if wait and qos > 0:
            info.wait_for_publish(5.0)
            assert info.is_published(), f"publish of {topic!r} not acknowledged"
        return info

    def wait_for(self, n: int, timeout: float = 5.0) -> list[Received]:
        """Take exactly n messages from the queue (fails on timeout)."""
        out: list[Received] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                out.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"received {len(out)} of {n} messages: {out[:10]}") from None
        return out

    def wait_topic(self, topic: str, timeout: float = 5.0) -> tuple[Received, list[Received]]:
        """Wait for a message on `topic`; returns it and the messages taken before it."""
        before: list[Received] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                m = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no message on {topic!r}; got {before}") from None
            if m.topic == topic:
                return m, before
            before.append(m)

    def drain(self, duration: float = 0.0) -> list[Received]:
        """Everything received within `duration` seconds (non-failing)."""
        out: list[Received] = []
        deadline = time.monotonic() + duration
        while True:
            try:
                out.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return out

    def wait_disconnected(self, timeout: float = 5.0) -> bool:
        return self._disconnected.wait(timeout)

    def is_connected(self) -> bool:
        return self.c.is_connected() and not self._disconnected.is_set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None
        with contextlib.suppress(Exception):
            self.c.socket() and self.c.socket().close()  # type: ignore[union-attr]

    def disconnect(self, *, props: dict | None = None) -> None:
        """A normal DISCONNECT, then stop the network thread."""
        if self._thread and self.c.is_connected():
            p = make_props(PacketTypes.DISCONNECT, **props) if props else None
            self.c.disconnect(properties=p)
            self._disconnected.wait(2)
        self.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()


class ClientFactory:
    """Creates paho clients bound to a broker and disconnects them all at teardown."""

    def __init__(self, broker: BrokerProc):
        self.broker = broker
        self.clients: list[Client] = []

    def __call__(self, client_id: str | None = None, **kw) -> Client:
        broker = kw.pop("broker", self.broker)
        cid = uid("c") if client_id is None else client_id
        c = Client(broker.host, broker.port, cid, **kw)
        self.clients.append(c)
        return c

    def close_all(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.disconnect()
        self.clients.clear()
