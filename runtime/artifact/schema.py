"""Validation of manifest.json against its JSON Schema (runtime/artifact/manifest.schema.json).

The schema is the published contract: any JSON-Schema library in any language can check a
manifest with it. The runtime applies it with this small validator (the subset of JSON Schema
the file uses: type, enum, minimum, maximum, minLength, maxLength, pattern, required,
properties, items, minItems, maxItems, $ref to local $defs), so that its core needs no extra
package; the test suite checks that a full JSON-Schema implementation agrees. Errors name the
field by its path, e.g. ``drafts[1].max_length``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

SCHEMA_FILE = "manifest.schema.json"

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


@cache
def manifest_schema() -> dict[str, Any]:
    text = resources.files("specx.runtime.artifact").joinpath(SCHEMA_FILE).read_text("utf-8")
    return dict(json.loads(text))


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def schema_errors(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "") -> str:
    """The first way `value` breaks `schema` (a message naming the field), or ""."""
    where = path or "the manifest"
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return schema_errors(value, root["$defs"][name], root, path)
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[k](value) for k in kinds):
            return f"{where} must be {' or '.join(kinds)}, got {_describe(value)}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{where} must be one of {allowed}, got {_describe(value)}"
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {_describe(value)}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {_describe(value)}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{where} must not be empty"
        if len(value) > schema.get("maxLength", len(value)):
            return f"{where} is longer than {schema['maxLength']} characters"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            rule = schema.get("description", f"pattern {schema['pattern']}")
            return f"{where} {_describe(value)} is not allowed here: {rule}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"{where} needs at least {schema['minItems']} item(s)"
        if len(value) > schema.get("maxItems", len(value)):
            return f"{where} has more than {schema['maxItems']} items"
        for i, item in enumerate(value):
            found = schema_errors(item, schema.get("items", {}), root, _join(path, i))
            if found:
                return found
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{where} lacks the field(s) {', '.join(missing)}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                found = schema_errors(value[key], sub, root, _join(path, key))
                if found:
                    return found
    return ""


def check_manifest(data: Any) -> str:
    """The first schema violation of a parsed manifest.json, or ""."""
    schema = manifest_schema()
    return schema_errors(data, schema, schema)
