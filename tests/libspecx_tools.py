"""The ctypes binding of libspecx (native/libspecx/bindings/python/specx_c.py), for the tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native/libspecx/bindings/python"))

from specx_c import (
    K_AUTO,
    K_DEFAULT,
    MAX_STEP_TOKENS,
    Context,
    Detokenizer,
    Library,
    Model,
    Result,
    SpecxError,
    binary,
    library_path,
)

__all__ = [
    "K_AUTO",
    "K_DEFAULT",
    "MAX_STEP_TOKENS",
    "Context",
    "Detokenizer",
    "Library",
    "Model",
    "Result",
    "SpecxError",
    "binary",
    "library_path",
]
