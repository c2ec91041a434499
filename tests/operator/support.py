"""Helpers of the operator tests: what the operator rendered for fleet edge, and what runs it for real
without Kubernetes: broker "pods" started from a rendered config, and the managed Redis' script
(operator/redis.sh) run on loopback."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from fleetmq.operator import render

from tests.integration.harness import LIVE_BROKERS, BrokerProc, _wait_port
from tests.integration.mqttraw import RawClient
from tests.support import HOST, RedisServer, free_port

from .conftest import wait_for

# ------------------------------------------------------------------------------------ rendered config
CHILDREN = [
    ("configmap", "edge-config"),
    ("statefulset", "edge"),
    ("service", "edge-headless"),
    ("service", "edge-external-mqtt"),
    ("poddisruptionbudget", "edge"),
]


def config_of(k) -> dict:
    """Fleet edge's broker config as the operator rendered it ({} before it did)."""
    cm = k.get("configmap", "edge-config")
    return yaml.safe_load(cm["data"][render.CONFIG_KEY]) if cm else {}


def cm_hash(k) -> str | None:
    cm = k.get("configmap", "edge-config")
    return cm and cm["metadata"]["annotations"][render.A_CONFIG_HASH]


def hash_with_zone(k, name: str = "external") -> str:
    """The config hash once zone `name` is rendered (the fleet alone may be rendered first)."""
    return wait_for(lambda: name in config_of(k)["zones"] and cm_hash(k), msg=f"config with zone {name}")


def config_with_zone(k, name: str = "external") -> str:
    """The rendered config's text once zone `name` is in it (the fleet alone may be rendered first: a
    broker started from that would listen on none of the zone's ports)."""
    hash_with_zone(k, name)
    return k.get("configmap", "edge-config")["data"][render.CONFIG_KEY]


# -------------------------------------------------------------------------------------------- brokers
def readyz(port: int, within: float = 15.0) -> dict:
    """The node's /readyz once it is ready, as a readiness probe waits for it: a node's listeners accept
    connections (into their backlog) a moment before it says it is ready, which is after all of them opened."""
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def start_pod(config_path, node_id: str, mqtt_port: int, metrics_port: int, workdir) -> BrokerProc:
    """One broker "pod": the command line the StatefulSet gives its container."""
    log_path = workdir / f"{node_id}.log"
    cmd = [sys.executable, "-m", "fleetmq.broker", "--config", str(config_path), "--node-id", node_id]
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    bp = BrokerProc("127.0.0.1", mqtt_port, metrics_port, proc, log_path, "fleetmq", config_path,
                    {"external/mqtt": mqtt_port}, cmd)  # fmt: skip
    LIVE_BROKERS.append(bp)
    for port in (mqtt_port, metrics_port):
        _wait_port(bp, port)
    return bp


# ------------------------------------------------------------------------------ issued certificates
def secret_bytes(k, name: str) -> dict[str, bytes]:
    return {key: base64.b64decode(v) for key, v in ((k.get("secret", name) or {}).get("data") or {}).items()}


def mount_tls(k, root: Path, secrets: list[str]) -> str:
    """What the kubelet does for a broker pod: the ConfigMap's config, the fleet's users Secret and the
    listeners' Secrets as files (under `root` instead of /etc/fleetmq)."""
    base = root / "etc-fleetmq"
    for zone_name, data in secret_bytes(k, "edge-mqttusers").items():  # (the zones' users files)
        (base / "fleet-users").mkdir(parents=True, exist_ok=True)
        (base / "fleet-users" / zone_name).write_bytes(data)
    for name in secrets:
        d = base / "tls" / name
        d.mkdir(parents=True, exist_ok=True)
        for key, data in secret_bytes(k, name).items():
            tmp = d / f".{key}"
            tmp.write_bytes(data)
            tmp.replace(d / key)  # (atomically, as the kubelet swaps its symlink)
    text = k.get("configmap", "edge-config")["data"][render.CONFIG_KEY]
    return text.replace(render.CONFIG_DIR + "/", f"{base}/")


def tls_client(port: int, ca: Path, cert: tuple[Path, Path], hostname: str) -> RawClient:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    c = RawClient("127.0.0.1", port, version=5, timeout=5)
    c.sock = ctx.wrap_socket(c.sock, server_hostname=hostname)
    return c


# ------------------------------------------------------------------------------------ the managed Redis
SCRIPT = render.SCRIPT_PATH
SH_PATH = os.environ.get("FLEETMQ_REDIS_SH_PATH", "/usr/bin:/bin")
PASSWORD = "s3cret-for-the-test"


class ScriptedRedis(RedisServer):
    """One Redis "pod": `redis.sh <role>` with the container's environment (the script execs the server,
    so this process is the server)."""

    def __init__(self, data_dir: Path, port: int, role: str, env: dict[str, str]):
        self.role, self.environment = role, env
        self.password = PASSWORD
        super().__init__(data_dir, port, autostart=False)

    def argv(self) -> list[str]:
        return ["sh", str(SCRIPT), self.role]

    def env(self) -> dict[str, str]:
        return {"PATH": SH_PATH, **self.environment}

    @property
    def host(self) -> str:
        return self.environment.get("REDIS_LOCAL", HOST)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def run_script(command: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), command],
        env={"PATH": SH_PATH, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port + 10000))
            except OSError:
                continue
        return port
