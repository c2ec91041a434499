"""What the distribution declares matches what its code imports: each of broker/, operator/ and pipeline/
needs exactly the third-party distributions its section of pyproject.toml names (the broker's the main
dependencies; the operator and the pipeline theirs on top)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"broker": ["main"], "operator": ["main", "operator"], "pipeline": ["main", "pipeline"]}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {"main": {_name(r) for r in project["dependencies"]}}
    for extra, reqs in project["optional-dependencies"].items():
        out[extra] = {_name(r) for r in reqs}
    return out


def imported(folder: str) -> set[str]:
    """Top-level modules imported anywhere in a folder that are neither ours nor the standard library's."""
    mods: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "fleetmq"}


def test_every_import_is_declared_and_every_declaration_imported():
    decl = declared()
    dists = packages_distributions()
    used_by: dict[str, set[str]] = {}
    for folder, sections in SECTIONS.items():
        allowed = set().union(*(decl[s] for s in sections))
        for mod in sorted(imported(folder)):
            names = {_name(d) for d in dists.get(mod, [mod])}
            assert names & allowed, f"{folder}/ imports {mod!r} ({names}) but {sections} declare none of it"
            for n in names & allowed:
                used_by.setdefault(n, set()).add(folder)
    for section in ("main", "operator", "pipeline"):
        unused = {d for d in decl[section] if d not in used_by}
        assert not unused, f"declared in {section} but imported nowhere: {sorted(unused)}"
