"""Structured output: each API's format field -> SGLang's ``json_schema`` sampling param.

- OpenAI Chat Completions ``response_format``: ``text`` | ``json_object`` |
  ``json_schema`` (``{"json_schema": {"name", "schema", "strict"}}``);
- OpenAI Responses ``text.format``: ``text`` | ``json_object`` |
  ``json_schema`` (``{"name", "schema", "strict"}`` inline);
- Anthropic Messages ``output_config.format``: ``json_schema`` (``{"schema"}``).

The engine (SGLang, or the embedded engine through llguidance) masks the tokens the
schema forbids at every step, so the output parses against the schema when it finishes
(a ``length`` finish can still cut it short). The engine compiles the schema and refuses
one it cannot compile with a 400 that names the problem.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.edge.errors import bad_request

MAX_SCHEMA_CHARS = 100_000
JSON_OBJECT = json.dumps({"type": "object"})


def _schema_text(schema: Any, where: str) -> str:
    if not isinstance(schema, dict):
        raise bad_request(f"{where} must be a JSON Schema object", where)
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise bad_request(
            f"{where} is {len(text)} characters as JSON; at most {MAX_SCHEMA_CHARS}", where
        )
    return text


def openai_format(fmt: Any, where: str, *, nested: bool) -> str | None:
    """``response_format`` (``nested``: the schema sits under ``json_schema``) or
    Responses' ``text.format`` (inline): the ``json_schema`` param, or None for text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request(f"{where} must be an object with a 'type'", where)
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise bad_request(
            f"{where}.type must be 'text', 'json_object' or 'json_schema' (got {kind!r})",
            f"{where}.type",
        )
    spec = fmt.get("json_schema") if nested else fmt
    spec_where = f"{where}.json_schema" if nested else where
    if not isinstance(spec, dict):
        raise bad_request(f"{spec_where} must be an object with a 'schema'", spec_where)
    if "schema" not in spec:
        raise bad_request(f"{spec_where}.schema is required", f"{spec_where}.schema")
    return _schema_text(spec["schema"], f"{spec_where}.schema")


def anthropic_format(output_config: dict[str, Any] | None) -> str | None:
    """``output_config.format``: the ``json_schema`` param, or None."""
    fmt = (output_config or {}).get("format")
    where = "output_config.format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad_request(f"{where} must be {{'type': 'json_schema', 'schema': {{...}}}}", where)
    if "schema" not in fmt:
        raise bad_request(f"{where}.schema is required", f"{where}.schema")
    return _schema_text(fmt["schema"], f"{where}.schema")
