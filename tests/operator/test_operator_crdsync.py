"""`--manage-crds` against a real kube-apiserver: the operator, as its least-privilege ServiceAccount,
updates an older fleetmq CRD to its own schema at start, and leaves a newer one alone (README "Upgrades")."""

from __future__ import annotations

import copy
import json
from typing import Any

from fleetmq.operator import crdgen

from .conftest import fleet, wait_for

BRIDGES = "mqttbridges.fleetmq.io"


def _ours() -> dict[str, Any]:
    return next(c for c in crdgen.owned() if c["metadata"]["name"] == BRIDGES)


def _spec_props(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def _install(control_plane, crd: dict[str, Any]) -> None:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))


def _installed(control_plane) -> dict[str, Any]:
    return json.loads(control_plane.kubectl("get", "crd", BRIDGES, "-o", "json").stdout)


def test_an_older_crd_is_updated_and_a_newer_one_left_alone(control_plane, k, run_operator, monkeypatch):
    monkeypatch.setenv("FLEETMQ_MANAGE_CRDS", "true")
    older = copy.deepcopy(_ours())
    del _spec_props(older)["ackTimeout"]  # an install from before the field existed
    newer = copy.deepcopy(_ours())
    _spec_props(newer)["futureField"] = {"type": "string", "description": "from a later release"}
    try:
        _install(control_plane, older)
        assert "ackTimeout" not in _spec_props(_installed(control_plane))
        op = run_operator()  # (its startup applies the CRDs; stop() fails on any Forbidden in its log)
        props = wait_for(lambda: "ackTimeout" in _spec_props(_installed(control_plane))
                         and _spec_props(_installed(control_plane)), msg="the older CRD updated")  # fmt: skip
        assert props["ackTimeout"] == _spec_props(_ours())["ackTimeout"]
        op.stop()

        _install(control_plane, newer)
        op = run_operator()
        k.apply(fleet())
        wait_for(lambda: k.get("configmap", "edge-config"), msg="the operator at work (its startup done)")
        output = op.stop()
        assert "futureField" in _spec_props(_installed(control_plane)), "a newer CRD was downgraded"
        assert f"CRD {BRIDGES} left as it is" in output and "v1alpha1: spec.futureField" in output
    finally:
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crdgen.CRD_DIR))
    assert "futureField" not in _spec_props(_installed(control_plane))
