"""The operator brings its own CustomResourceDefinitions up to date at start (`--manage-crds`).

`helm upgrade` never touches a chart's crds/ (Helm installs them once), so without this a new operator
would run against the schemas of the first install: new fields pruned by the API server, new validations
missing. At start the operator server-side applies the CRDs it was built with (operator/crdgen.py), but
never one that would take anything away: an installed schema with a property path this operator's lacks
is from a newer release (or edited by hand), and applying ours would make the API server prune that field
from every stored object. Such a CRD is left as it is, and the operator says so.

Policy for `v1alpha1` (README "Upgrades"): within a served version fields are only added, never removed
or renamed, so a newer schema is always a superset of an older one and this check orders them.
"""

from __future__ import annotations

import logging
from typing import Any

from . import crdgen
from .kube import ApiError, Kube

log = logging.getLogger("fleetmq.operator.crds")

MANAGER = "fleetmq-operator"


def property_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Every property path of an OpenAPI v3 schema ("spec.redis.mode", "spec.zones.*.name", ...)."""
    out: set[str] = set()
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out.add(path)
        out |= property_paths(sub, path)
    if isinstance(schema.get("items"), dict):
        out |= property_paths(schema["items"], f"{prefix}.*")
    if isinstance(schema.get("additionalProperties"), dict):
        out |= property_paths(schema["additionalProperties"], f"{prefix}.*")
    return out


def missing_paths(installed: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Property paths the installed CRD has and ours lacks, by version ("v1alpha1: spec.x")."""
    mine = {v["name"]: v for v in ours["spec"]["versions"]}
    out = []
    for version in installed.get("spec", {}).get("versions", []):
        if version["name"] not in mine:
            out.append(f"{version['name']} (a version this operator does not know)")
            continue
        theirs = property_paths(version.get("schema", {}).get("openAPIV3Schema", {}))
        have = property_paths(mine[version["name"]]["schema"]["openAPIV3Schema"])
        out += [f"{version['name']}: {p}" for p in sorted(theirs - have)]
    return out


async def sync(kube: Kube) -> dict[str, str]:
    """Apply each of the operator's CRDs unless the installed one is newer; CRD name -> what happened
    ("applied", "unchanged", "newer installed: ...", "missing", or the API error)."""
    results: dict[str, str] = {}
    for crd in crdgen.owned():
        name = crd["metadata"]["name"]
        try:
            installed = await kube.get("CustomResourceDefinition", None, name)
            if installed is None:  # (created by the chart or `kubectl apply -f crds/`, never by us)
                results[name] = "missing"
                log.warning("CRD %s is not installed: install the chart's or crds/ first", name)
                continue
            newer = missing_paths(installed, crd)
            if newer:
                results[name] = "newer installed: " + ", ".join(newer[:5])
                log.warning(
                    "CRD %s left as it is: it has fields this operator does not know (%s); "
                    "is an older operator running?",
                    name,
                    ", ".join(newer[:5]),
                )
                continue
            before = installed["metadata"]["resourceVersion"]
            after = await kube.apply(crd, MANAGER)
            changed = after["metadata"]["resourceVersion"] != before
            results[name] = "applied" if changed else "unchanged"
            if changed:
                log.info("CRD %s updated to this operator's schema", name)
        except ApiError as e:
            results[name] = str(e)
            log.warning("cannot update CRD %s: %s", name, e)
    return results
