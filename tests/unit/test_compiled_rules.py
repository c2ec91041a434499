"""What the modules mypyc compiles (scripts/compiled.py) must not do, read from their source.

A module constant whose type is a tuple of fixed length is kept by mypyc unboxed, as a C struct: every use
of it as a Python object (an index that is not a constant, an argument, a `for` over it) builds a new
tuple, and a tuple of floats new floats too. On the per-message path that was a tuple per acknowledgement
encoded and one per read; made while clients connect, such a copy outlives them and keeps an arena of the
allocator from going back. Typed `tuple[X, ...]`, the constant stays one Python object.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compiled_modules() -> list[str]:
    spec = importlib.util.spec_from_file_location("compiled_build", ROOT / "scripts" / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MODULES)


def _variable_length(annotation: ast.expr) -> bool:
    """`tuple[X, ...]`, maybe inside Final[...]."""
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        if annotation.value.id == "Final":
            return _variable_length(annotation.slice)
        if annotation.value.id == "tuple":
            items = annotation.slice
            return (
                isinstance(items, ast.Tuple)
                and len(items.elts) == 2
                and isinstance(items.elts[1], ast.Constant)
                and items.elts[1].value is Ellipsis
            )
    return False


def fixed_tuple_constants(source: str) -> list[str]:
    """Module-level names bound to a tuple display without a `tuple[X, ...]` annotation."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            found += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.value, ast.Tuple)
            and isinstance(node.target, ast.Name)
            and not _variable_length(node.annotation)
        ):
            found.append(node.target.id)
    return found


def test_the_rule_tells_fixed_from_variable_length_tuples():
    source = (
        "A = (1, 2)\n"
        "B: Final = (b'', b'x')\n"
        "C: tuple[int, int] = (1, 2)\n"
        "D: tuple[float, ...] = (0.1, 1.0)\n"
        "E: Final[tuple[bytes, ...]] = (b'',)\n"
        "F = [1, 2]\n"
    )
    assert fixed_tuple_constants(source) == ["A", "B", "C"]


@pytest.mark.parametrize("module", _compiled_modules())
def test_compiled_modules_keep_their_tuple_constants_boxed(module: str):
    path = ROOT / "broker" / f"{module}.py"
    assert fixed_tuple_constants(path.read_text()) == [], (
        f"{path.name}: annotate these `tuple[X, ...]` (Final[...] if final): mypyc would copy them per use"
    )
