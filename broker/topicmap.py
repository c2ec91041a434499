"""Destination templates of a bridge: where a message's topic goes on the other side.

A template is literal text with placeholders taken from the source topic's levels (1-based):
``{#}`` the whole topic, ``{n}`` its n-th level, ``{n-m}`` levels n to m, ``{n-#}`` level n to the end.
``site/{#}`` puts ``a/b`` under ``site/a/b``; ``{2-#}`` strips the first level. A template is parsed once,
when the config is loaded, so a bad one is refused there with the placeholder named; rendering is a few
slices per message.
"""

from __future__ import annotations

import re

#: What a template may contain, for the CRD schema too: literal text without braces or wildcards, and the
#: placeholders above. Checked again by `Template.parse`, which also names what is wrong.
TEMPLATE_PATTERN = r"^(?:[^{}+#\x00]|\{(?:#|[1-9][0-9]{0,2}(?:-(?:[1-9][0-9]{0,2}|#))?)\})+$"

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^([1-9][0-9]{0,2})(?:-([1-9][0-9]{0,2}|#))?$")

# A part is literal text or the levels (first, last) to take, last None meaning "to the end".
_Part = str | tuple[int, int | None]


class Template:
    __slots__ = ("_parts", "text")

    def __init__(self, text: str, parts: list[_Part]) -> None:
        self.text = text
        self._parts = parts

    @classmethod
    def parse(cls, text: str) -> Template:
        """The template, or ValueError saying which placeholder or character is not allowed."""
        if not text:
            raise ValueError("a destination template cannot be empty")
        parts: list[_Part] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            parts += _literal(text[pos : m.start()])
            parts.append(_levels(m.group(1)))
            pos = m.end()
        parts += _literal(text[pos:])
        return cls(text, parts)

    @property
    def identity(self) -> bool:
        """Whether the template is ``{#}``: topics go across unchanged."""
        return self._parts == [(1, None)]

    def render(self, topic: str) -> str | None:
        """The destination topic, or None when the topic has fewer levels than a placeholder takes."""
        if self.identity:
            return topic
        levels = topic.split("/")
        out = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
                continue
            first, last = part
            if first > len(levels) or (last is not None and last > len(levels)):
                return None
            out.append("/".join(levels[first - 1 : last]))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


def _literal(text: str) -> list[_Part]:
    for ch in "{}+#\x00":
        if ch in text:
            what = {"+": "a wildcard '+'", "#": "a wildcard '#'", "\x00": "a NUL character"}.get(ch)
            raise ValueError(f"{what or 'an unmatched ' + repr(ch)} outside a placeholder in {text!r}")
    return [text] if text else []


def _levels(inner: str) -> tuple[int, int | None]:
    if inner == "#":
        return (1, None)
    m = _RANGE.match(inner)
    if m is None:
        raise ValueError(
            f"unknown placeholder {{{inner}}}: use {{#}} (the whole topic), {{n}} (level n, from 1), {{n-m}} "
            "or {n-#}"
        )
    first = int(m.group(1))
    last = m.group(2)
    if last is None:
        return (first, first)
    if last == "#":
        return (first, None)
    if int(last) < first:
        raise ValueError(f"placeholder {{{inner}}}: the range ends before it starts")
    return (first, int(last))
