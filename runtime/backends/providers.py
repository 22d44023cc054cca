"""Execution providers: the user's names (cpu, cuda, tensorrt), what is usable here, and which
backend serves them.

`tensorrt` first means the artifact's TensorRT engines, run by specx's own TensorRT backend;
otherwise ONNX Runtime runs the graphs with the listed providers (CPU always last, as the
fallback for any operator a GPU provider lacks).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from collections.abc import Sequence

import onnxruntime as ort

from specx.runtime.artifact.contract import Manifest
from specx.runtime.errors import InputError, ProviderError

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


MAX_THREADS = 1024


def check_threads(threads: int | None) -> None:
    """Intra-op threads asked for: None (all cores) or 1..MAX_THREADS."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise InputError(
            f"threads must be in 1..{MAX_THREADS}, got {threads}",
            "leave --threads unset to use every core",
        )


def both_runtimes_installed() -> bool:
    """onnxruntime and onnxruntime-gpu share one module; with both installed, whichever was
    installed last wins file by file and the GPU providers fail in odd ways."""
    found = 0
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            md.version(name)
            found += 1
        except md.PackageNotFoundError:
            continue
    return found == 2


def resolve_providers(requested: Sequence[str] | None) -> list[str]:
    """Map user names (cpu, cuda, tensorrt) to ONNX Runtime provider names; check availability."""
    names = list(requested or ["cpu"])
    available = ort.get_available_providers()
    wants_gpu = any(PROVIDER_ALIASES.get(n.lower(), n) != "CPUExecutionProvider" for n in names)
    if wants_gpu and both_runtimes_installed():
        raise ProviderError(
            "both onnxruntime and onnxruntime-gpu are installed; they provide the same module",
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu "
            "(or scripts/setup.sh --gpu)",
        )
    resolved: list[str] = []
    for name in names:
        full = PROVIDER_ALIASES.get(name.lower(), name)
        if full not in available:
            hint = (
                "install the GPU runtime: `pip uninstall -y onnxruntime && pip install "
                "'specx[gpu]'` (never both packages in one environment)"
                if full != "CPUExecutionProvider"
                else "check the onnxruntime installation"
            )
            raise ProviderError(
                f"execution provider {name!r} is not available in this onnxruntime "
                f"(available: {', '.join(available)})",
                hint,
            )
        resolved.append(full)
    if "CPUExecutionProvider" not in resolved:
        resolved.append("CPUExecutionProvider")  # fallback for ops a GPU provider lacks
    return resolved


def _usable(provider: str, manifest: Manifest) -> bool:
    if provider == "cpu":
        return True
    if provider == "tensorrt":
        return bool(manifest.engines) and importlib.util.find_spec("tensorrt") is not None
    return "CUDAExecutionProvider" in ort.get_available_providers()


def choose_providers(requested: Sequence[str] | None, manifest: Manifest) -> list[str]:
    """The command line's providers as given (errors name what is missing); otherwise the
    profile's, in its order, keeping those usable here, with cpu last as the fallback."""
    if requested:
        return [p.lower() for p in requested]
    wanted = list((manifest.profile or {}).get("providers", ["cpu"]))
    usable = [p for p in wanted if _usable(p, manifest)]
    return usable if "cpu" in usable else [*usable, "cpu"]
