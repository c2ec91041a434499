"""Start/stop the brokers under test on free loopback ports with equivalent, unlimited settings.

Both brokers get unlimited inflight windows and queues, so that the closed-loop
load generator (not a broker limit) decides how much is in flight, and a second, TLS
listener with the same certificate (tls-* rows).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fleetmq.broker import apikeys

from tests.support import free_port, kill_process, stop_process, wait_port

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
START_TIMEOUT = 20.0


class BrokerError(RuntimeError):
    """The broker could not be started or died."""


class Broker:
    """One broker process; subclasses say how to configure and launch it."""

    name = "broker"
    tls = True  # also listens with TLS on tls_port (the tls-* rows)

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir / self.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.tls_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._pki: dict | None = None

    @property
    def pki(self) -> dict:
        """{"server": (crt, key), "ca": crt}: made once, for the TLS listener."""
        if self._pki is None:
            from tests.integration.pki import make_pki

            self._pki = make_pki(self.workdir)
        return self._pki

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The environment to run it in (None: this process's)."""
        return None

    def version(self) -> str:
        return ""

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Launch on a fresh port and wait until it accepts connections."""
        self.stop()
        self.port = free_port(HOST)
        self.tls_port = free_port(HOST) if self.tls else 0
        cmd = self.command()
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                )
            except OSError as e:
                raise BrokerError(f"cannot run {cmd[0]}: {e}") from e
        try:
            wait_port(HOST, self.port, START_TIMEOUT, self.proc)
            if self.tls:
                wait_port(HOST, self.tls_port, START_TIMEOUT, self.proc)
        except RuntimeError as e:
            self.stop()
            raise BrokerError(f"{self.name} {e}{self.log_tail()}") from e

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL by pid (a crash), and reap it."""
        if self.proc is not None:
            kill_process(self.proc)

    def exit_reason(self) -> str:
        """Why a dead broker died, for error cells."""
        rc = self.proc.returncode if self.proc is not None else None
        return f"{self.name} exited (code {rc}){self.log_tail()}"

    def log_tail(self, lines: int = 3) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        tail = [t for t in tail if not t.startswith("--- start")]
        return (": " + " | ".join(t.strip() for t in tail))[:400] if tail else ""


class Mosquitto(Broker):
    """mosquitto with limits lifted to match fleetmq's zone (inflight/queue 0 = unlimited)."""

    name = "mosquitto"
    #: the lifted limits (an empty string: mosquitto's defaults, for the memory rows)
    limits = "max_inflight_messages 0\nmax_queued_messages 0\n"

    @staticmethod
    def binary() -> str:
        found = shutil.which("mosquitto") or next(
            (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
        )
        if not found:
            raise BrokerError("mosquitto not found (run scripts/system-deps.sh)")
        return found

    def command(self) -> list[str]:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} {HOST}\n"
            "max_connections -1\n"
            "allow_anonymous true\n"
            f"{self.limits}"
            "persistence false\n"
            "log_dest none\n"
            # as root, mosquitto would switch to its own user, who cannot read the bench's key file
            f"user {getpass.getuser()}\n"
            f"listener {self.tls_port} {HOST}\n"
            f"certfile {self.pki['server'][0]}\n"
            f"keyfile {self.pki['server'][1]}\n"
        )
        return [self.binary(), "-c", str(conf)]

    def version(self) -> str:
        try:
            out = subprocess.run([self.binary(), "-h"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError, BrokerError):
            return "unknown"
        first = out.splitlines()[0] if out else ""
        return first.removeprefix("mosquitto version ").strip() or "unknown"


class Fleetmq(Broker):
    """fleetmq from this checkout, in-memory store, one zone with unlimited inflight/queue/awaiting-rel."""

    name = "fleetmq"
    # max_awaiting_rel 0: mosquitto has no cap on incoming QoS 2 awaiting PUBREL either, and the default
    # (100) is below the loadgen's window of 200. An empty string: EMQX's defaults, for the memory rows.
    limits = "max_inflight: 0, max_mqueue_len: 0, max_awaiting_rel: 0"
    #: more settings of the zone (flow style YAML, each with a leading ", ")
    zone_extra = ""

    def command(self) -> list[str]:
        cfg = self.workdir / "fleetmq.yaml"
        cfg.write_text(
            "node_id: bench\n"
            "store: {kind: memory}\n"
            "zones:\n"
            f"  bench: {{{', '.join(s for s in (self.limits, self.zone_extra.removeprefix(', ')) if s)}}}\n"
            "listeners:\n"
            f'  - {{name: mqtt, zone: bench, bind: "{HOST}:{self.port}", protocol: tcp}}\n'
            f'  - {{name: mqtts, zone: bench, bind: "{HOST}:{self.tls_port}", protocol: tls,\n'
            f'     certfile: "{self.pki["server"][0]}", keyfile: "{self.pki["server"][1]}"}}\n'
        )
        return [self.python(), "-m", "fleetmq.broker", "--config", str(cfg), "--log-level", "warning"]

    @staticmethod
    def python() -> str:
        """The repo's venv Python if there is one (fleetmq is installed there), else this one."""
        venv_python = REPO / ".venv" / "bin" / "python"
        return str(venv_python) if venv_python.exists() else sys.executable


class FleetmqAt(Fleetmq):
    """fleetmq from another checkout (an earlier commit, in a git worktree), run by this venv's Python:
    a link tree in the bench's workdir puts that checkout's broker/ first on PYTHONPATH as fleetmq.broker,
    ahead of this checkout's editable install. Same config and load, side by side: before and after."""

    def __init__(self, workdir: Path, checkout: Path) -> None:
        label = (
            subprocess.run(
                ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or checkout.name
        )
        self.name = f"fleetmq@{label}"
        super().__init__(workdir)
        self.links = self.workdir / "pythonpath"
        (self.links / "fleetmq").mkdir(parents=True, exist_ok=True)
        target = self.links / "fleetmq" / "broker"
        if not target.exists():
            target.symlink_to(checkout.resolve() / "broker")

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.links)}


class FleetmqCompiled(Fleetmq):
    """fleetmq from this checkout with its per-message path compiled by mypyc (scripts/compiled.py, built
    into the cache when missing): that build's folder first on PYTHONPATH. Same config and load."""

    name = "fleetmq+mypyc"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        script = REPO / "scripts" / "compiled.py"
        out = subprocess.run([self.python(), str(script)], capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise BrokerError(f"cannot build the compiled modules: {out.stderr.strip()[-2000:]}")
        self.folder = out.stdout.strip().splitlines()[-1]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": self.folder}


class FleetmqAllowList(Fleetmq):
    """fleetmq whose zone denies by default and allows the bench's topics: its rules hold no deny rule
    that a bench filter overlaps, so SUBSCRIBE decides that no delivery needs a check."""

    name = "fleetmq-allowlist"
    zone_extra = ', acl_default: deny, acl: [{permission: allow, action: all, filter: "bench/#"}]'


class FleetmqDenyRule(Fleetmq):
    """fleetmq whose zone denies reading `bench/+/secret`, which the fan-in subscriber's `bench/<run>/+`
    overlaps: every delivery to it is checked (a cached decision per topic)."""

    name = "fleetmq-denyrule"
    zone_extra = (
        ', acl: [{permission: deny, action: subscribe, filter: "bench/+/secret"},'
        ' {permission: allow, action: all, filter: "#"}]'
    )


class FleetmqApi(Fleetmq):
    """fleetmq with its management API and console on, and nobody calling them (issue 29: the API must cost
    the data path nothing)."""

    name = "fleetmq-api"

    def command(self) -> list[str]:
        cmd = super().command()
        keys = self.workdir / "api-keys.yaml"
        if not keys.exists():
            apikeys.add(keys, "bench", "admin")
        _append(
            self.workdir / "fleetmq.yaml", f'api: {{bind: "{HOST}:{free_port(HOST)}", keys_file: "{keys}"}}\n'
        )
        return cmd


class _Forwarding(Broker):
    """A broker that forwards to another one (the bridge row's variants): it knows the remote's port."""

    def __init__(self, workdir: Path, remote_port: int) -> None:
        super().__init__(workdir)
        self.remote_port = remote_port


def _append(config: Path, text: str) -> None:
    """More settings at the end of a config file its broker class wrote."""
    config.write_text(config.read_text() + text)


class MosquittoBridge(_Forwarding, Mosquitto):
    """mosquitto forwarding `bench/#` to another broker with its own bridge, at QoS 1 (its defaults
    otherwise): the baseline of the bridge row."""

    name = "mosquitto-bridge"

    def command(self) -> list[str]:
        cmd = super().command()
        _append(
            self.workdir / "mosquitto.conf",
            f"connection cloud\naddress {HOST}:{self.remote_port}\ntopic bench/# out 1\ncleansession true\n",
        )
        return cmd


class FleetmqBridge(_Forwarding, Fleetmq):
    """fleetmq forwarding `bench/#` to another broker through a bridge (its defaults: a window of 32, the
    queue in its session), topics unchanged, at most QoS 1."""

    name = "fleetmq-bridge"

    def command(self) -> list[str]:
        cmd = super().command()
        _append(
            self.workdir / "fleetmq.yaml",
            "bridges:\n"
            f"  - {{name: cloud, remote: {{host: {HOST}, port: {self.remote_port}}},\n"
            '     forwards: [{filter: "bench/#", destination: "{#}", max_qos: 1}]}\n',
        )
        return cmd


class Rumqttd(Broker):
    """rumqttd (bytebeamio/rumqtt, Rust), a second anchor: MQTT 3.1.1 listeners, limits as large as its
    config allows. Built by the bench into the cache from the published crate (see `build_rumqttd`)."""

    name = "rumqttd"
    VERSION = "0.20.0"

    def command(self) -> list[str]:
        conf = self.workdir / "rumqttd.toml"
        crt, key = self.pki["server"]
        conf.write_text(
            "id = 0\n"
            "[router]\n"
            "id = 0\n"
            "max_connections = 100000\n"
            "max_outgoing_packet_count = 100000\n"  # per connection and router turn
            "max_segment_size = 104857600\n"
            "max_segment_count = 10\n"
            "[v4.1]\n"
            'name = "v4-1"\n'
            f'listen = "{HOST}:{self.port}"\n'
            "next_connection_delay_ms = 0\n"
            "[v4.1.connections]\n"
            "connection_timeout_ms = 60000\n"
            "max_payload_size = 268435455\n"
            "max_inflight_count = 65535\n"  # the most packet ids a session can have outstanding
            "dynamic_filters = true\n"
            "[v4.2]\n"
            'name = "v4-2"\n'
            f'listen = "{HOST}:{self.tls_port}"\n'
            "next_connection_delay_ms = 0\n"
            "[v4.2.tls]\n"
            f'certpath = "{crt}"\n'
            f'keypath = "{key}"\n'
            "[v4.2.connections]\n"
            "connection_timeout_ms = 60000\n"
            "max_payload_size = 268435455\n"
            "max_inflight_count = 65535\n"
            "dynamic_filters = true\n"
        )
        return [str(build_rumqttd()), "-c", str(conf)]

    def version(self) -> str:
        return self.VERSION


def build_rumqttd(cache: Path | None = None) -> Path:
    """rumqttd's binary, built once into the cache: the published crate (fetched by cargo from crates.io)
    with its own lock file, but `metrics` at 0.22.4, since the release that lock file pins no longer
    compiles with current rustc (E0521)."""
    cache = cache or Path.home() / ".cache" / "fleetmq" / "bench" / f"rumqttd-{Rumqttd.VERSION}"
    binary = cache / "bin" / "rumqttd"
    if binary.exists():
        return binary
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    work = cache / "build"
    shutil.rmtree(work, ignore_errors=True)
    fetcher = work / "fetch"
    (fetcher / "src").mkdir(parents=True)
    (fetcher / "src" / "main.rs").write_text("fn main() {}\n")
    (fetcher / "Cargo.toml").write_text(
        '[package]\nname = "fetch-rumqttd"\nversion = "0.0.0"\nedition = "2021"\n'
        f'[dependencies]\nrumqttd = "={Rumqttd.VERSION}"\n'
    )

    def cargo_run(*args: str, cwd: Path) -> str:
        done = subprocess.run(
            [cargo, *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=3600
        )
        return done.stdout

    try:
        meta = json.loads(cargo_run("metadata", "--format-version", "1", cwd=fetcher))
        manifest = next(p["manifest_path"] for p in meta["packages"] if p["name"] == "rumqttd")
        crate = work / "rumqttd"
        shutil.copytree(Path(manifest).parent, crate)
        cargo_run("update", "--package", "metrics", "--precise", "0.22.4", cwd=crate)
        cargo_run("build", "--release", "--locked", "--bin", "rumqttd", cwd=crate)
    except (OSError, StopIteration, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or ""
        raise BrokerError(f"cannot build rumqttd {Rumqttd.VERSION}: {e} {detail[-600:]}") from e
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(crate / "target" / "release" / "rumqttd", binary)
    shutil.rmtree(work, ignore_errors=True)
    return binary


BROKERS: dict[str, type[Broker]] = {"mosquitto": Mosquitto, "rumqttd": Rumqttd, "fleetmq": Fleetmq}
