"""The Redis store's Lua scripts, kept as lua/*.lua files shipped with the package: read as Lua, linted
as Lua, and diffed as Lua, not as Python strings."""

from __future__ import annotations

from importlib.resources import files


def lua(name: str) -> str:
    """The text of lua/<name>.lua."""
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
