"""The import contracts (pyproject.toml's [tool.importlinter], docs/design.md "Core layering") hold, and
they can fail: lint-imports run on a copy of the tree with one import that breaks each."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


# lint-imports with the editable install's import hooks taken out: they would add the repository's own
# operator/ to the namespace package beside the copy's, and grimp would read one or the other.
RUNNER = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in getattr(h, "__module__", "")]
sys.path_importer_cache.clear()
from importlinter.cli import lint_imports_command
sys.argv[0] = "lint-imports"
sys.exit(lint_imports_command())
"""


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts, on the packages under `tree`/fleetmq."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER, "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(tmp_path: Path) -> Path:
    """fleetmq/{broker,operator,pipeline} as copies of the repository's (Python files only)."""
    for package in ("broker", "operator", "pipeline"):
        shutil.copytree(
            ROOT / package,
            tmp_path / "fleetmq" / package,
            ignore=lambda _dir, names: [n for n in names if not n.endswith(".py") and "." in n],
        )
    return tmp_path


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line + "\n")


def test_the_repository_keeps_its_contracts(tmp_path):
    result = lint_imports(copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(tmp_path):
    tree = copy_tree(tmp_path)
    session = tree / "fleetmq" / "broker" / "session.py"
    append(session, "if TYPE_CHECKING:\n    from .node import Node  # noqa: F401")
    session.write_text("from typing import TYPE_CHECKING\n" + session.read_text())
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "broker layers BROKEN" in result.stdout
    assert "fleetmq.broker.session -> fleetmq.broker.node" in result.stdout


def test_a_module_without_a_layer_breaks_the_layers(tmp_path):
    tree = copy_tree(tmp_path)
    (tree / "fleetmq" / "broker" / "newthing.py").write_text('"""Not placed in a layer."""\n')
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "fleetmq.broker.newthing" in result.stdout


def test_the_operator_importing_the_brokers_runtime_breaks_the_contract(tmp_path):
    tree = copy_tree(tmp_path)
    append(
        tree / "fleetmq" / "operator" / "status.py",
        "from fleetmq.broker.channel import Channel  # noqa: F401",
    )
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "operator and pipeline use only the broker's contract modules BROKEN" in result.stdout
    assert "fleetmq.operator.status -> fleetmq.broker.channel" in result.stdout
