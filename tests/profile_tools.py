"""Helpers to write variations of the built-in profiles in tests."""

from __future__ import annotations

import json
import tomllib
from typing import Any


def mutated(name: str, change: Any) -> dict[str, Any]:
    import importlib.resources as resources

    text = resources.files("specx.profiles").joinpath(f"{name}.toml").read_text()
    data = tomllib.loads(text)
    change(data)
    return data


def to_toml(data: dict[str, Any]) -> str:
    """A minimal TOML writer for the profile layout (tables of scalars and lists)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return str(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if not isinstance(table, dict):
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
        for sub, inner in table.items():
            if isinstance(inner, dict):
                lines.append(f"[{section}.{sub}]")
                lines += [f"{k} = {value(v)}" for k, v in inner.items()]
    return "\n".join(lines) + "\n"
