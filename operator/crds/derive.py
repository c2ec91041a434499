"""CRD models derived from the broker's own pydantic models, so a field the broker reads is described,
defaulted and bounded in one place: camelCase names, the same validators, durations as CRD strings."""

from __future__ import annotations

import copy
import functools
import types
import typing
from typing import Annotated, Any

from fleetmq.broker.zones import format_duration, parse_duration
from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema, create_model
from pydantic.fields import FieldInfo

#: A duration in a CRD: "30s"-style strings (ms, s, m, h, d) or a plain number of seconds.
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)?\s*$"
DURATION_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],  # the only anyOf a structural schema allows
    "pattern": DURATION_PATTERN,  # applies to strings only
    "x-kubernetes-validations": [
        {"rule": "type(self) == string || self >= 0", "message": "a duration cannot be negative"}
    ],
}
CrdDuration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_SCHEMA)]


def _is_duration(info: FieldInfo) -> bool:
    return any(getattr(m, "func", None) is parse_duration for m in info.metadata)


def derived_field(source: type[BaseModel], name: str, alias: str) -> tuple[Any, FieldInfo]:
    """One field of a broker model under its CRD name, keeping type, default, range and description."""
    info = copy.copy(source.model_fields[name])
    annotation: Any = info.annotation
    if _is_duration(info):
        annotation = CrdDuration
        info.metadata = []
        if isinstance(info.default, int | float):
            info.json_schema_extra = {"default": format_duration(info.default)}
    else:
        annotation = Annotated[annotation, *info.metadata] if info.metadata else annotation
    info.alias = alias
    info.validation_alias = alias
    info.serialization_alias = alias
    return annotation, info


def derive(
    model_name: str,
    source: type[BaseModel],
    fields: dict[str, str],
    doc: str,
    descriptions: dict[str, str] | None = None,
) -> type[BaseModel]:
    """A camelCase model made of some fields of a broker model (validated by the same rules);
    `descriptions` rewords a field where the CRD spells it differently (e.g. a Secret for a file path)."""
    defs = {name: derived_field(source, name, alias) for name, alias in fields.items()}
    for name, text in (descriptions or {}).items():
        defs[name][1].description = text
    model = create_model(  # type: ignore[call-overload]
        model_name,
        __config__=ConfigDict(extra="forbid", populate_by_name=True),
        __doc__=doc,
        **defs,
    )
    return model


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _retype(annotation: Any, nested: dict[type, type]) -> Any:
    """`annotation` with broker models replaced by their CRD models (inside Optional and list too)."""
    if isinstance(annotation, type) and annotation in nested:
        return nested[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[_retype(args[0], nested), *annotation.__metadata__]
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(lambda a, b: a | b, (_retype(a, nested) for a in args))
    if origin is list:
        return list[_retype(args[0], nested)]  # type: ignore[misc]
    return annotation


def derive_all(
    model_name: str,
    source: type[BaseModel],
    doc_: str,
    nested: dict[type, type] | None = None,
    skip: tuple[str, ...] = (),
) -> type[BaseModel]:
    """A camelCase model of every field of a broker model but `skip`, its nested broker models replaced
    by their CRD models (`nested`); the broker model validates what it renders to."""
    defs = {}
    for name in source.model_fields:
        if name in skip:
            continue
        annotation, info = derived_field(source, name, camel(name))
        if nested:
            annotation = _retype(annotation, nested)
            if isinstance(info.default_factory, type) and info.default_factory in nested:
                info.default_factory = nested[info.default_factory]
        defs[name] = (annotation, info)
    model = create_model(  # type: ignore[call-overload]
        model_name, __config__=ConfigDict(extra="forbid", populate_by_name=True), __doc__=doc_, **defs
    )
    return model
