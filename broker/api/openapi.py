"""The OpenAPI 3.1 document of the management API, written from its route table and its models (the same
ones that validate requests and shape answers)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import models

REF = "#/components/schemas/{model}"


class Route(Protocol):
    """What the document needs of a route (app.Route)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def answer(self) -> type[BaseModel] | None: ...
    @property
    def query(self) -> type[BaseModel] | None: ...
    @property
    def body(self) -> type[BaseModel] | None: ...
    @property
    def created(self) -> bool: ...
    @property
    def ndjson(self) -> bool: ...
    @property
    def public(self) -> bool: ...
    @property
    def operation_id(self) -> str: ...


def _schemas(routes: Sequence[Route]) -> dict[str, Any]:
    answers: set[type[BaseModel]] = {models.Problem}
    answers |= {r.answer for r in routes if r.answer is not None}
    bodies = {r.body for r in routes if r.body is not None}
    pairs = [(m, "serialization") for m in sorted(answers, key=lambda m: m.__name__)]
    pairs += [(m, "validation") for m in sorted(bodies, key=lambda m: m.__name__)]
    _, top = models_json_schema(pairs, ref_template=REF)  # type: ignore[arg-type]
    return dict(top.get("$defs", {}))


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}}}}  # fmt: skip


def document(routes: Sequence[Route], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {"summary": r.summary, "operationId": r.operation_id}
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"\{(\w+)[^}]*\}", r.path)]  # fmt: skip
        if r.query is not None:
            params += models.query_schema(r.query)
        if params:
            op["parameters"] = params
        responses: dict[str, Any] = {}
        if r.answer is not None:
            schema = {"$ref": REF.format(model=r.answer.__name__)}
            status = "201" if r.created else "200"
            responses[status] = {"description": "OK", "content": {"application/json": {"schema": schema}}}
        elif r.ndjson:
            responses["200"] = {
                "description": "JSON lines",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        elif r.public:
            responses["200"] = {
                "description": "OK",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        else:
            responses["204"] = {"description": "Done"}
        if not r.public:
            responses["400"] = _problem("A parameter or the body is not valid: the detail names it")
            responses["401"] = _problem("No API key, or an unknown one")
            responses["403"] = _problem("A viewer key asked for more than GET")
            if r.created:
                responses["409"] = _problem("It exists already")
            if "{" in r.path:
                responses["404"] = _problem("Not found: the detail says what")
            responses["503"] = _problem("A node or the session store did not answer")
            op["security"] = [{"apiKey": []}]
        if r.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=r.body.__name__)}}},
            }
            responses["415"] = _problem("The body is not application/json")
        op["responses"] = responses
        paths.setdefault(re.sub(r"\{(\w+):[^}]*\}", r"{\1}", r.path), {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleetmq management API", "version": version,
                 "description": "Any node answers for the whole fleet (docs/api.md)."},
        "paths": paths,
        "components": {
            "schemas": _schemas(routes),
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                           "description": "A key of `fleetmq-broker apikey`"}},
        },
    }  # fmt: skip
