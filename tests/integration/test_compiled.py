"""The broker's per-message path compiled with mypyc (scripts/compiled.py; issue 30): built from this
checkout's sources into the cache, its modules are the extension modules, and the unit tests pass against
them as they do against the interpreted ones (compiled code also checks the types at run time, which is how
it found a reused exception name in the codec)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_compiled_per_message_path_passes_the_unit_tests():
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compiled.py")],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": built.stdout.strip().splitlines()[-1]}
    where = subprocess.run(
        [sys.executable, "-c", "import fleetmq.broker.channel as m, fleetmq.broker.cm as c; print(m.__file__, c.__file__)"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert all(f.endswith(".so") for f in where.stdout.split()), where.stdout
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/unit"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-5000:]
    assert " passed" in tests.stdout.splitlines()[-1] and "failed" not in tests.stdout.splitlines()[-1]
