"""The broker's per-message path compiled with mypyc (scripts/compiled.py; issue 30): built from this
checkout's sources into the cache, its modules are the extension modules; the unit tests and the delivery
tests on real broker processes pass against them as they do against the interpreted ones (compiled code
also checks the types at run time, which is how it found a reused exception name in the codec), and a node
says which path it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fleetmq.broker import __version__

from .harness import MOSQUITTO

ROOT = Path(__file__).resolve().parents[2]
#: the integration tests of the per-message path (QoS flows, windows, queues, sessions in Redis,
#: malformed input, takeover), run again against the compiled modules; the rest run interpreted only
DELIVERY = (
    "tests/integration/test_delivery.py",
    "tests/integration/test_session.py",
    "tests/integration/test_v5.py",
    "tests/integration/test_malformed.py",
    "tests/integration/test_fleetmq_window.py",
    "tests/integration/test_fleet_takeover.py",
)

pytestmark = pytest.mark.skipif(MOSQUITTO, reason="fleetmq's own modules")


@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    """The environment that runs the compiled build (built into the cache when missing)."""
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compiled.py")],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return {**os.environ, "PYTHONPATH": built.stdout.strip().splitlines()[-1]}


def _pytest(env: dict[str, str], *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=SUITE_TIMEOUT - 30,
    )  # fmt: skip
    last = run.stdout.splitlines()[-1] if run.stdout else ""
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert " passed" in last and "failed" not in last and "error" not in last, last
    return last


#: each of the two runs below is a suite of its own in one process (-n 0): 80-120 s alone, more while the
#: other worker of `make test` runs beside it, so the default per-test timeout (120 s) is not theirs
SUITE_TIMEOUT = 900


@pytest.mark.timeout(SUITE_TIMEOUT)
def test_the_compiled_per_message_path_passes_the_unit_tests(compiled):
    where = subprocess.run(
        [sys.executable, "-c", "import fleetmq.broker.channel as m, fleetmq.broker.cm as c; print(m.__file__, c.__file__)"],
        capture_output=True, text=True, env=compiled, check=True,
    )  # fmt: skip
    assert all(f.endswith(".so") for f in where.stdout.split()), where.stdout
    _pytest(compiled, "tests/unit")


@pytest.mark.timeout(SUITE_TIMEOUT)
def test_the_compiled_broker_passes_the_delivery_tests_on_real_processes(compiled):
    # the broker processes these tests start inherit PYTHONPATH: they run the compiled modules too
    _pytest(compiled, *DELIVERY)


def test_a_node_says_which_per_message_path_it_runs(compiled, start_broker, monkeypatch):
    interpreted = start_broker()
    assert interpreted.metric("fleetmq_build_info", path="interpreted", version=__version__) == 1
    monkeypatch.setenv("PYTHONPATH", compiled["PYTHONPATH"])
    node = start_broker()
    assert node.metric("fleetmq_build_info", path="compiled", version=__version__) == 1
    assert node.metric("fleetmq_build_info", path="interpreted") == 0
    assert f"fleetmq {__version__}, per-message path compiled" in node.log_path.read_text()
