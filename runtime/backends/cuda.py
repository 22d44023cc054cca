"""The few CUDA runtime calls the TensorRT backend needs, through ctypes (no extra package).

Device buffers for the KV caches, ids and logits (``CudaMemory`` is the TensorRT backend's
``DeviceMemory``); host<->device copies; the device's compute capability (engines are bound to
it). libcudart comes with the CUDA toolkit, JetPack, or the
`nvidia-cuda-runtime` wheels that onnxruntime-gpu and tensorrt depend on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Any

import numpy as np

from specx.runtime.errors import ProviderError

_HOST_TO_DEVICE = 1
_DEVICE_TO_HOST = 2
_ATTR_CC_MAJOR = 75  # cudaDevAttrComputeCapabilityMajor
_ATTR_CC_MINOR = 76

_lib: Any = None


def _candidates() -> list[str]:
    names = [ctypes.util.find_library("cudart") or ""]
    names += [f"libcudart.so.{v}" for v in ("13", "12", "11.0")] + ["libcudart.so"]
    for base in sys.path:  # pip wheels: nvidia/cuda_runtime/lib/libcudart.so.*
        names += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*"))
        names += glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    return [n for n in names if n]


def cudart() -> Any:
    global _lib
    if _lib is None:
        for name in _candidates():
            try:
                _lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise ProviderError(
                "the CUDA runtime (libcudart) was not found",
                "install the CUDA runtime (JetPack, the CUDA toolkit, or pip install "
                "nvidia-cuda-runtime-cu12) and make sure a GPU is visible",
            )
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        lib = cudart()
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        message = lib.cudaGetErrorString(status).decode()
        raise ProviderError(f"CUDA {what} failed: {message} (error {status})")


def compute_capability(device: int = 0) -> str:
    lib = cudart()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib.cudaDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, device), "query")
    _check(lib.cudaDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, device), "query")
    return f"{major.value}.{minor.value}"


class DeviceBuffer:
    """cudaMalloc'ed memory, freed with the object."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        ptr = ctypes.c_void_p()
        _check(cudart().cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), "malloc")
        self.ptr = int(ptr.value or 0)

    def __del__(self) -> None:
        if getattr(self, "ptr", 0) and _lib is not None:
            _lib.cudaFree(ctypes.c_void_p(self.ptr))
            self.ptr = 0

    def upload(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        _check(
            cudart().cudaMemcpy(
                ctypes.c_void_p(self.ptr + offset),
                ctypes.c_void_p(data.ctypes.data),
                ctypes.c_size_t(data.nbytes),
                _HOST_TO_DEVICE,
            ),
            "copy",
        )

    def download(self, out: np.ndarray, offset: int = 0) -> None:
        _check(
            cudart().cudaMemcpy(
                ctypes.c_void_p(out.ctypes.data),
                ctypes.c_void_p(self.ptr + offset),
                ctypes.c_size_t(out.nbytes),
                _DEVICE_TO_HOST,
            ),
            "copy",
        )


class CudaMemory:
    """Zero-filled cudaMalloc'ed buffers: where the TensorRT backend keeps its caches."""

    device = "cuda"
    device_id = 0

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> CudaBuffer:
        return CudaBuffer(np.zeros(shape, dtype))


class CudaBuffer:
    def __init__(self, zeros: np.ndarray) -> None:
        self.shape, self.dtype = zeros.shape, zeros.dtype
        self.buffer = DeviceBuffer(zeros.nbytes)
        self.buffer.upload(zeros)

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    def to_host(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.buffer.download(out)
        return out
