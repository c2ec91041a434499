"""Fixtures of the monitoring tests: the real Prometheus (and promtool) of Debian's `prometheus` package."""

from __future__ import annotations

import pytest

# fixtures shared with the chart tests (helm) and the operator tests (CRD-installed control plane,
# the operator ServiceAccount's kubeconfig)
from tests.chart.conftest import helm  # noqa: F401
from tests.monitoring import promproc
from tests.operator.conftest import crds_installed, operator_kubeconfig  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.failed and rep.when in ("call", "setup"):
        for p in list(promproc.LIVE_PROMETHEUS):
            rep.sections.append((f"prometheus pid {p.proc.pid} port {p.port} log (tail)", p.log()[-4000:]))
    return rep


def _need(binary: str) -> str:
    if not promproc.available(binary):
        pytest.fail(
            f"{binary} not found: run `make deps` (Debian's prometheus package) or set PROMETHEUS_BIN"
        )
    return binary


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool."""
    return _need(promproc.PROMTOOL_BIN)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """Path of prometheus."""
    return _need(promproc.PROMETHEUS_BIN)
