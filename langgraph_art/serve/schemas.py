"""JSON schemas as the wire format carries them: the schema a ``response_format`` asks for, and OpenAI's strict mode
(``additionalProperties: false`` wherever an object lists its properties). Pure functions on dicts: the request
(``protocol.py``) validates with them and the grammar builder (``structured.py``) compiles what they return.
"""

from __future__ import annotations

from typing import Any

from langgraph_art.errors import RequestError

# keys whose values are schemas, lists of schemas, or maps of name -> schema (JSON Schema 2020-12 and draft 7)
_SCHEMA = ("items", "not", "if", "then", "else", "contains", "additionalProperties", "propertyNames")
_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (``{"type": "object"}`` for a plain ``json_object``), or None
    for text. Raises ``RequestError`` naming what is malformed."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        if schema is None:
            return {"type": "object"}
        if not isinstance(schema, dict):
            raise RequestError("response_format.schema must be a JSON schema object", "response_format")
        return strict_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RequestError(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}', "response_format"
            )
        return strict_schema(spec["schema"])
    raise RequestError(
        f"response_format type {kind!r} is not supported; use 'text', 'json_object' or 'json_schema'",
        "response_format",
    )


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` in which every object schema that lists ``properties`` and says nothing about extra keys
    has ``additionalProperties: false``."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    for key in _SCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(s) for s in out[key]]
    if isinstance(out.get("items"), list):  # draft 7 tuple validation
        out["items"] = [strict_schema(s) for s in out["items"]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(s) for name, s in out[key].items()}
    return out
