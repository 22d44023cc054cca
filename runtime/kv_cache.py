"""A preallocated key/value cache whose length is the only truth.

Per layer there is one key and one value buffer, in the layout of the graph's attention variant
(``contract.CACHE_LAYOUTS``): [1, capacity, kv_heads, head_dim] for plain graphs, whose passes
bind the valid prefix as ``past`` and the slots right after it as ``new``; [1, kv_heads, capacity,
head_dim] for gqa graphs, whose attention op reads and writes the whole buffer in place. Positions
``0..length-1`` are valid either way; the buffers are never copied, and rolling back after a
rejected draft is ``truncate(n)``: stale slots are overwritten by the next pass.

The buffers come from the backend's ``DeviceMemory`` (host arrays, ONNX Runtime device tensors,
raw CUDA allocations): the cache itself knows no device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specx.runtime.artifact.contract import FULL_BUFFER
from specx.runtime.errors import InputError
from specx.runtime.memory import HOST, DeviceMemory, HostBuffer

NP_DTYPES: dict[str, Any] = {"float32": np.float32, "float16": np.float16}


class CacheBuffers:
    """One key and one value buffer per layer, allocated once on a backend's memory, and a
    valid length per row (the only truth: rollback is a smaller length, no data moves)."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        rows: int,
        capacity: int,
        shape: tuple[int, ...],
        dtype: str,
        memory: DeviceMemory,
        fix: str,
    ) -> None:
        """shape: one buffer's, in the layout its graphs bind; fix: what to do when the memory
        cannot hold the buffers."""
        if rows < 1 or capacity < 1:
            raise InputError(
                f"a KV cache needs rows >= 1 and capacity >= 1, got {rows}, {capacity}"
            )
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.rows = rows
        self.capacity = capacity
        self.dtype = dtype
        self.np_dtype = NP_DTYPES[dtype]
        self.device = memory.device
        self.device_id = memory.device_id
        self.shape = shape
        self.slot_bytes = kv_heads * head_dim * np.dtype(self.np_dtype).itemsize  # one position
        self.row_bytes = capacity * self.slot_bytes
        try:
            self._buffers = [memory.allocate(shape, self.np_dtype) for _ in range(2 * num_layers)]
        except (MemoryError, RuntimeError) as e:  # RuntimeError: a device allocator's refusal
            raise InputError(
                f"cannot allocate a KV cache of {rows} x {capacity} positions "
                f"({self.nbytes / 2**20:.0f} MB) on {memory.device}: "
                f"{str(e).splitlines()[0][:200]}",
                fix,
            ) from e
        self._ptrs = [b.ptr for b in self._buffers]
        self.lengths = np.zeros(rows, dtype=np.int64)  # valid positions per row

    @property
    def nbytes(self) -> int:
        return 2 * self.num_layers * self.rows * self.row_bytes

    @property
    def on_host(self) -> bool:
        """Whether every buffer is in host memory (numpy can copy between rows)."""
        return all(isinstance(b, HostBuffer) for b in self._buffers)

    def buffer_addresses(self) -> tuple[int, ...]:
        """Base address of every buffer; constant for the cache's lifetime (tests check it)."""
        return tuple(self._ptrs)

    def truncate(self, length: int, row: int = 0) -> None:
        """Roll row `row` back to `length` valid positions. No data moves."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(
                f"cannot truncate a cache row of length {int(self.lengths[row])} to {length}"
            )
        self.lengths[row] = length


class KVCache(CacheBuffers):
    """One sequence's cache, in the layout of its graph's attention variant."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: str = "float32",
        memory: DeviceMemory = HOST,
        layout: str = "plain",
    ) -> None:
        self.layout = layout
        shape = (
            (1, kv_heads, capacity, head_dim)
            if layout in FULL_BUFFER
            else (1, capacity, kv_heads, head_dim)
        )
        fix = "use an artifact exported with a smaller --max-length (or a smaller profile)"
        super().__init__(num_layers, kv_heads, head_dim, 1, capacity, shape, dtype, memory, fix)

    @property
    def length(self) -> int:
        return int(self.lengths[0])

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def key_ptr(self, layer: int, position: int = 0) -> int:
        """Address of `position` in a plain-layout buffer (the base address for gqa)."""
        return self._ptrs[2 * layer] + position * self.slot_bytes

    def value_ptr(self, layer: int, position: int = 0) -> int:
        return self._ptrs[2 * layer + 1] + position * self.slot_bytes

    def advance(self, n: int) -> None:
        """Mark n more positions valid (after a pass wrote them)."""
        if n < 0 or self.length + n > self.capacity:
            raise InputError(
                f"cache overflow: {self.length} + {n} positions exceed capacity {self.capacity}"
            )
        self.lengths[0] += n

    def reset(self) -> None:
        self.lengths[0] = 0

    def keys(self, layer: int) -> np.ndarray:
        """The valid keys of a layer, [length, kv_heads, head_dim] (a copy for device caches)."""
        return self._read(2 * layer)

    def values(self, layer: int) -> np.ndarray:
        return self._read(2 * layer + 1)

    def _read(self, index: int) -> np.ndarray:
        full = self._buffers[index].to_host()
        if self.layout in FULL_BUFFER:
            return full[0, :, : self.length].transpose(1, 0, 2)
        return full[0, : self.length]


class BatchKVCache(CacheBuffers):
    """The caches of several sequences in one set of buffers, for batched graphs.

    Per layer one key and one value buffer [rows, kv_heads, capacity, head_dim]; row r belongs to
    one sequence at a time and ``lengths[r]`` is its only truth (rollback = a smaller length). A
    pass over rows a..b-1 binds the contiguous block of those rows, in place.
    """

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        rows: int,
        capacity: int,
        dtype: str = "float32",
        memory: DeviceMemory = HOST,
    ) -> None:
        shape = (rows, kv_heads, capacity, head_dim)
        fix = "serve fewer sequences at once, or shorter ones"
        super().__init__(num_layers, kv_heads, head_dim, rows, capacity, shape, dtype, memory, fix)

    def key_ptr(self, layer: int, row: int = 0) -> int:
        return self._ptrs[2 * layer] + row * self.row_bytes

    def value_ptr(self, layer: int, row: int = 0) -> int:
        return self._ptrs[2 * layer + 1] + row * self.row_bytes

    def keys(self, layer: int, row: int) -> np.ndarray:
        """The valid keys of a row, [length, kv_heads, head_dim] (a copy for device caches)."""
        full = self._buffers[2 * layer].to_host()
        return full[row, :, : int(self.lengths[row])].transpose(1, 0, 2)

    def copy_prefix(self, source: int, row: int, length: int) -> bool:
        """Copy positions 0..length-1 of row `source` into row `row` (a prompt prefix the rows
        share: computing it again would give the same keys and values) and set the row's length.
        Host memory only (False elsewhere: the caller computes the prefix instead)."""
        if not self.on_host:
            return False
        if not 0 < length <= min(int(self.lengths[source]), self.capacity) or source == row:
            raise InputError(f"cannot copy {length} positions of row {source} into row {row}")
        for buffer in self._buffers:
            assert isinstance(buffer, HostBuffer)
            data = buffer.array  # [rows, kv_heads, capacity, head_dim]
            data[row, :, :length] = data[source, :, :length]
        self.lengths[row] = length
        return True

    def reuse_prefix(
        self, row: int, prompt: np.ndarray, held: dict[int, np.ndarray], minimum: int
    ) -> int:
        """Copy into `row` the longest prefix of `prompt` that another row holds (`held`: row ->
        the tokens at its positions 0 .. length - 1), if at least `minimum` tokens; returns its
        length (0: nothing copied, the row is left as it was)."""
        best, donor = 0, -1
        for other, tokens in held.items():
            shared = common_prefix(tokens, prompt) if other != row else 0
            if shared > best:
                best, donor = shared, other
        if best < minimum or not self.copy_prefix(donor, row, best):
            return 0
        return best


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two id arrays share."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
