"""Where cache buffers live: the memory a backend hands to the KV cache.

A backend owns a device; the cache asks it for buffers instead of knowing device names. Every
buffer is zero-filled at allocation (a graph may read slots it has not written, e.g. the gqa
variant's attention over the whole buffer, masked by the lengths) and keeps its address for its
whole life, so that I/O bindings made once stay valid.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Buffer(Protocol):
    """One allocation: a stable address and a way to read it back."""

    @property
    def ptr(self) -> int: ...

    def to_host(self) -> np.ndarray:
        """The whole buffer as a host array: a view for host memory, a copy for device memory."""
        ...


class DeviceMemory(Protocol):
    """Allocates zeroed buffers on one device."""

    device: str  # the device as ONNX Runtime's I/O binding names it: "cpu", "cuda"
    device_id: int

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> Buffer: ...


class HostBuffer:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def ptr(self) -> int:
        return int(self.array.ctypes.data)

    def to_host(self) -> np.ndarray:
        return self.array


class HostMemory:
    """Plain numpy arrays in host memory (the CPU provider)."""

    device = "cpu"
    device_id = 0

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> HostBuffer:
        return HostBuffer(np.zeros(shape, dtype))


HOST = HostMemory()
