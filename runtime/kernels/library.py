"""The specx kernels library: where it is, what it holds, and its registration in a session.

Graphs exported with ``--kernels specx`` compute their matmuls, embedding gather and attention
with the ops of the ``specx`` domain (GgufMatMul and GgufGather over GGUF blocks as the file
stores them, GroupQueryAttention over the in-place cache); ONNX Runtime runs them once the
library is registered in the session's options. The runtime reaches the library only through
ONNX Runtime (the ops) and its small C ABI (what it holds and which instruction set it
dispatches to, read through ctypes): never by importing native code.

The library is built by scripts/build_kernels.sh (scripts/setup.sh runs it) into ``lib/`` beside
this file; ``SPECX_KERNELS_LIBRARY`` names another build.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from specx.runtime.errors import ArtifactError

DOMAIN = "specx"
NAME = "specx_kernels"
FILE_NAME = "libspecx_kernels.so"
ENV = "SPECX_KERNELS_LIBRARY"
ABI_VERSION = 1
BUILD_HINT = (
    "build it with scripts/build_kernels.sh (scripts/setup.sh does), or export the artifact "
    "again with --kernels ort (ONNX Runtime's own MatMulNBits)"
)


@dataclass(frozen=True)
class KernelsInfo:
    """What `specx info` says of the library."""

    path: str
    version: str
    isa: str  # the instruction set the ops dispatch to
    formats: str  # the GGML block types held


def library_path() -> Path | None:
    """The library to load: $SPECX_KERNELS_LIBRARY, else the build beside this package."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    built = Path(__file__).resolve().parent / "lib" / FILE_NAME
    return built if built.is_file() else None


def library_built() -> bool:
    """Whether the library to load is there."""
    path = library_path()
    return path is not None and path.is_file()


def uses_kernels(operators: Iterable[str]) -> list[str]:
    """The ops of the specx domain among a graph's "domain:OpType" operators."""
    return sorted(op for op in operators if op.split(":", 1)[0] == DOMAIN)


@lru_cache(maxsize=4)
def _load(path: str) -> Any:
    lib = ctypes.CDLL(path)
    for name in ("specx_kernels_version", "specx_kernels_isa", "specx_kernels_formats"):
        getattr(lib, name).restype = ctypes.c_char_p
    return lib


def describe(path: Path | None = None) -> KernelsInfo | None:
    """The library's version, instruction set and formats; None where none is built. A file
    that is no specx kernels library of this ABI raises ArtifactError."""
    path = path or library_path()
    if path is None:
        return None
    try:
        lib = _load(str(path))
        abi = int(lib.specx_kernels_abi_version())
    except (OSError, AttributeError) as e:
        raise ArtifactError(f"{path} is no specx kernels library ({e}); {BUILD_HINT}") from e
    if abi != ABI_VERSION:
        raise ArtifactError(
            f"{path} has kernels ABI {abi}, this runtime reads {ABI_VERSION}: rebuild it with "
            "scripts/build_kernels.sh"
        )
    return KernelsInfo(
        path=str(path),
        version=lib.specx_kernels_version().decode(),
        isa=lib.specx_kernels_isa().decode(),
        formats=lib.specx_kernels_formats().decode(),
    )


def record(info: KernelsInfo) -> dict[str, Any]:
    """The manifest's entry for a graph on these kernels (ModelSpec.op_libraries)."""
    return {"domain": DOMAIN, "name": NAME, "version": info.version, "abi": ABI_VERSION}


def register(
    options: Any,
    operators: Iterable[str],
    graph: str = "this graph",
    libraries: Iterable[dict[str, Any]] = (),
) -> None:
    """Register the library in ONNX Runtime session `options` where `operators` need it; a
    graph that needs it on a machine without it (or with a build of another ABI than the
    manifest's `libraries` record) is refused here, before any session exists."""
    needed = uses_kernels(operators)
    if not needed:
        return
    for lib in libraries:
        if lib.get("name") == NAME and int(lib.get("abi", ABI_VERSION)) != ABI_VERSION:
            raise ArtifactError(
                f"{graph} was exported for specx kernels ABI {lib.get('abi')}; this runtime "
                f"and its library speak ABI {ABI_VERSION}",
                "export the artifact again with this version of specx",
            )
    path = library_path()
    if path is None or not path.is_file():
        where = f" ({ENV}={path})" if path is not None else ""
        raise ArtifactError(
            f"{graph} computes with specx kernels ({', '.join(needed)}) and the kernels library "
            f"is not built here{where}: {BUILD_HINT}"
        )
    describe(path)  # refuses a file of another ABI with that advice
    options.register_custom_ops_library(str(path))
