"""A preallocated key/value cache whose length is the only truth.

Per layer there is one key and one value buffer of shape [1, capacity, kv_heads, head_dim]
(the layout of ``contract.CACHE_LAYOUT``). Positions ``0..length-1`` are valid. A model pass binds
the valid prefix as its ``past`` input and binds its ``new`` outputs to the slots right after it,
so the buffers are written in place and never copied; rolling back after a rejected draft is
``truncate(n)``: the stale slots are simply overwritten by the next pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specx.runtime.errors import InputError

NP_DTYPES: dict[str, Any] = {"float32": np.float32, "float16": np.float16}


class KVCache:
    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: str = "float32",
        device: str = "cpu",
        device_id: int = 0,
    ) -> None:
        if capacity < 1:
            raise InputError(f"cache capacity must be positive, got {capacity}")
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.capacity = capacity
        self.dtype = dtype
        self.np_dtype = NP_DTYPES[dtype]
        self.device = device
        self.device_id = device_id
        self.slot_bytes = kv_heads * head_dim * np.dtype(self.np_dtype).itemsize  # one position
        shape = (1, capacity, kv_heads, head_dim)
        self._arrays: list[np.ndarray] = []
        self._ort_values: list[Any] = []
        self._device_buffers: list[Any] = []
        if device == "cpu":
            self._arrays = [np.zeros(shape, self.np_dtype) for _ in range(2 * num_layers)]
            self._ptrs = [a.ctypes.data for a in self._arrays]
        elif device == "cudart":  # raw CUDA memory, for the TensorRT backend
            from specx.runtime.cuda import DeviceBuffer

            nbytes = capacity * self.slot_bytes
            self._device_buffers = [DeviceBuffer(nbytes) for _ in range(2 * num_layers)]
            self._ptrs = [b.ptr for b in self._device_buffers]
        else:  # an onnxruntime device ("cuda"): OrtValues from its allocator
            import onnxruntime as ort

            self._ort_values = [
                ort.OrtValue.ortvalue_from_shape_and_type(shape, self.np_dtype, device, device_id)
                for _ in range(2 * num_layers)
            ]
            self._ptrs = [v.data_ptr() for v in self._ort_values]
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def free(self) -> int:
        return self.capacity - self._length

    @property
    def nbytes(self) -> int:
        return 2 * self.num_layers * self.capacity * self.slot_bytes

    def key_ptr(self, layer: int, position: int = 0) -> int:
        return self._ptrs[2 * layer] + position * self.slot_bytes

    def value_ptr(self, layer: int, position: int = 0) -> int:
        return self._ptrs[2 * layer + 1] + position * self.slot_bytes

    def advance(self, n: int) -> None:
        """Mark n more positions valid (after a pass wrote them)."""
        if n < 0 or self._length + n > self.capacity:
            raise InputError(
                f"cache overflow: {self._length} + {n} positions exceed capacity {self.capacity}"
            )
        self._length += n

    def truncate(self, length: int) -> None:
        """Roll back to `length` valid positions. No data moves."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a cache of length {self._length} to {length}")
        self._length = length

    def reset(self) -> None:
        self._length = 0

    def keys(self, layer: int) -> np.ndarray:
        """The valid keys of a layer, [length, kv_heads, head_dim] (a copy for device caches)."""
        return self._read(2 * layer)

    def values(self, layer: int) -> np.ndarray:
        return self._read(2 * layer + 1)

    def _read(self, index: int) -> np.ndarray:
        if self._arrays:
            return self._arrays[index][0, : self._length]
        if self._device_buffers:
            out = np.empty((self._length, self.kv_heads, self.head_dim), self.np_dtype)
            self._device_buffers[index].download(out)
            return out
        return self._ort_values[index].numpy()[0, : self._length]

    def buffer_addresses(self) -> tuple[int, ...]:
        """Base address of every buffer; constant for the cache's lifetime (tests check it)."""
        return tuple(self._ptrs)
