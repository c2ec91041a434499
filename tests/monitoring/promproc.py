"""A real `prometheus` process for tests (Debian's package, installed by `make deps`), and its HTTP API.

    prom = PrometheusServer(tmp_path / "prom", jobs={"edge-headless": [("127.0.0.1:9100", {"pod": "edge-0"})]},
                            rule_files=[alerts_yaml])
    prom.wait_scraped(2)                      # every target scraped (up == 1) twice
    prom.query('sum(fleetmq_connections)')    # -> the `data` of /api/v1/query
    prom.stop()                               # SIGTERM by pid (SIGKILL if it lingers)
    PrometheusServer(dir, jobs={}, scrape_configs=[{"job_name": ..., "kubernetes_sd_configs": ...}])

It listens on a free 127.0.0.1 port, keeps its TSDB in the given directory, scrapes and evaluates rules
every second. Every started server is killed by pid at interpreter exit as a last resort.

    substitute(panel_expr, {"pod": "edge-0"})  # a dashboard's query with Grafana's variables filled in
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support import free_port, stop_process

HOST = "127.0.0.1"
PROMETHEUS_BIN = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL_BIN = os.environ.get("PROMTOOL_BIN") or shutil.which("promtool") or "/usr/bin/promtool"

LIVE_PROMETHEUS: list[PrometheusServer] = []

Target = tuple[str, dict[str, str]]  # "host:port", extra target labels


def available(binary: str) -> bool:
    return os.path.isfile(binary) and os.access(binary, os.X_OK)


class PrometheusError(Exception):
    """An error answer of the Prometheus HTTP API (bad PromQL, for instance)."""


class PrometheusServer:
    def __init__(
        self,
        data_dir: Path,
        jobs: dict[str, list[Target]],
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
        scrape_configs: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config_path = self.data_dir / "prometheus.yml"
        self.log_path = self.data_dir / "prometheus.log"
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [addr], "labels": labels} for addr, labels in targets],
                }
                for job, targets in jobs.items()
            ]
            + list(scrape_configs),  # service discovery, e.g. kubernetes_sd_configs (the e2e)
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def start(self, timeout: float = 30.0) -> None:
        if not available(PROMETHEUS_BIN):
            raise RuntimeError(f"prometheus not found at {PROMETHEUS_BIN} (run `make deps`)")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS_BIN,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
                    f"--web.listen-address={HOST}:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        LIVE_PROMETHEUS.append(self)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"prometheus not ready on port {self.port} within {timeout}s:\n{self.log()}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM by pid and wait; SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        code = stop_process(self.proc, timeout)
        if self in LIVE_PROMETHEUS:
            LIVE_PROMETHEUS.remove(self)
        return code

    # -- HTTP API
    def api(self, path: str, **params: str | list[str]) -> Any:
        """GET /api/v1/<path>; returns `data`, raises PrometheusError with Prometheus's message on errors."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')} ({path} {params})")
        return body["data"]

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query at the current time: {"resultType": ..., "result": [...]}."""
        return self.api("query", query=expr)

    def label_values(self, label: str, match: str) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match})

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def wait_scraped(self, times: int = 2, timeout: float = 30.0) -> None:
        """Wait until every target was scraped successfully `times` times (its `up` series has that many 1s)."""
        deadline = time.monotonic() + timeout
        while True:
            targets = self.targets()
            want = {t["scrapeUrl"] for t in targets}
            ok = {
                r["metric"]["instance"]
                for r in self.query(f"count_over_time(up[1m]) >= {times} and up == 1")["result"]
            }
            if targets and all(t["labels"]["instance"] in ok for t in targets):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"targets not scraped {times} times within {timeout}s: {want}, up: {ok}")
            time.sleep(0.2)


@atexit.register
def _kill_leftovers() -> None:
    for p in list(LIVE_PROMETHEUS):
        if p.proc is not None and p.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.proc.pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------ Grafana's variables
#: the values Grafana gives its built-in variables, for the tests' short scrape and evaluation intervals
BUILTIN = {"__rate_interval": "15s", "__interval": "5s", "__range": "5m"}


def substitute(expr: str, variables: dict[str, str]) -> str:
    """A dashboard panel's expression as Grafana sends it: `$var` and `${var}` replaced by their values."""
    values = {**variables, **BUILTIN}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
