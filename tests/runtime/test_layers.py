"""The layers, read from the source: each package imports only itself and the layers below.

    runtime -> profiles -> exporter -> apps   (bottom to top)

Every import statement of every module is checked (module level and inside functions, absolute
and relative), so a lazy import cannot slip a dependency past the rule either. The runtime core
also never imports torch, transformers or a serving framework.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("runtime", "profiles", "exporter", "apps")  # bottom to top
HEAVY = ("torch", "transformers", "optimum", "onnx", "fastapi", "starlette", "uvicorn")


def imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module of `specx.<package>`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    parts = ["specx", package, *path.relative_to(ROOT / package).with_suffix("").parts]
    current = parts[:-1]  # the package a relative import starts from
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current[: len(current) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:  # `from specx import exporter` names a package too
                name = module if module.count(".") else f"{module}.{alias.name}"
                if (node.lineno, name) not in found:
                    found.append((node.lineno, name))
    return found


def violations(package: str) -> list[str]:
    allowed = LAYERS[: LAYERS.index(package) + 1]
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imports(path, package):
            top = module.split(".")
            if top[0] == "specx" and (len(top) < 2 or top[1] not in allowed):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
            if package == "runtime" and top[0] in HEAVY:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("package", LAYERS)
def test_each_layer_imports_only_itself_and_the_layers_below(package: str) -> None:
    assert violations(package) == []


def test_the_scan_sees_absolute_relative_and_lazy_imports() -> None:
    module = ROOT / "runtime" / "probe_for_the_layer_test.py"
    module.write_text(
        "import specx.exporter\n"
        "from specx.runtime import contract\n"
        "from . import errors\n"
        "from specx.apps import cli\n"
        "from .. import exporter\n"
        "def later():\n"
        "    import torch\n"
        "    from specx.profiles import load_profile\n"
    )
    try:
        found = violations("runtime")
    finally:
        module.unlink()
    probe = [v for v in found if "probe_for_the_layer_test" in v]
    assert [v.split(" imports ")[1] for v in probe] == [
        "specx.exporter",
        "specx.apps",
        "specx.exporter",
        "torch",
        "specx.profiles",
    ]
