"""A preallocated key/value cache whose length is the only truth.

Per layer there is one key and one value buffer, in the layout of the graph's attention variant
(``contract.CACHE_LAYOUTS``): [1, capacity, kv_heads, head_dim] for plain graphs, whose passes
bind the valid prefix as ``past`` and the slots right after it as ``new``; [1, kv_heads, capacity,
head_dim] for gqa graphs, whose attention op reads and writes the whole buffer in place. Positions
``0..length-1`` are valid either way; the buffers are never copied, and rolling back after a
rejected draft is ``truncate(n)``: stale slots are overwritten by the next pass.

Beside the keys and values, every row records the token id each position was computed from
(``tokens``) and whose prompts it holds (``scopes``: a tenant, see runtime/prefix). After a
generation ends its row still holds its valid prefix, so that the next generation of the same
scope whose prompt starts with those tokens keeps them (``shared_prefix``, ``claim``): a reused
prefix is a length too.

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
UNKNOWN = -1  # the id of a position whose token was not recorded: it matches no prompt


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
        # [rows, capacity] the token id each position was computed from (valid below the length)
        self.tokens = np.full((rows, capacity), UNKNOWN, dtype=np.int64)
        self.scopes: list[str | None] = [None] * rows  # whose prompts a row holds (None: none)

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

    # -- what a row holds: token ids and their owner ------------------------------------------
    def record(self, row: int, start: int, tokens: np.ndarray | None, count: int) -> None:
        """A pass computed `count` positions of `row` from `start` on, from `tokens` (None: ids
        not known to the caller; those positions then match no prompt)."""
        end = start + count
        self.tokens[row, start:end] = UNKNOWN if tokens is None else tokens[:count]

    def held(self, row: int = 0) -> np.ndarray:
        """[length] the token ids of the row's valid positions (a view)."""
        return self.tokens[row, : int(self.lengths[row])]

    def shared_prefix(self, row: int, prompt: np.ndarray, scope: str | None) -> int:
        """How many leading tokens of `prompt` the row holds for `scope` (0 for another
        scope's row: one tenant never reuses, or times, another's prompt)."""
        if scope is None or self.scopes[row] != scope:
            return 0
        return common_prefix(self.held(row), prompt)

    def claim(self, row: int, scope: str | None, keep: int) -> None:
        """The row now serves a generation of `scope`, keeping its first `keep` positions
        (which must hold the generation's first tokens: shared_prefix)."""
        if keep and (scope is None or self.scopes[row] != scope):
            raise ValueError("a row keeps positions only for the scope that computed them")
        self.truncate(keep, row)
        self.scopes[row] = scope

    def read_positions(self, row: int, start: int, end: int) -> list[np.ndarray]:
        """Copies of positions start .. end - 1 of every buffer, each [kv_heads, n, head_dim]
        (host copies, whatever the device)."""
        return [self._span(b.to_host(), row, start, end).copy() for b in self._buffers]

    def write_positions(
        self, row: int, start: int, values: list[np.ndarray], tokens: np.ndarray
    ) -> None:
        """Write positions start .. start + n - 1 of every buffer (values as read_positions
        gives them) and their token ids, and make them the row's valid length. Host memory
        only."""
        n = int(tokens.shape[0])
        if not self.on_host or start > self.lengths[row] or start + n > self.capacity:
            raise InputError(f"cannot write positions {start}..{start + n - 1} of row {row}")
        for buffer, data in zip(self._buffers, values, strict=True):
            assert isinstance(buffer, HostBuffer)
            self._span(buffer.array, row, start, start + n)[...] = data
        self.tokens[row, start : start + n] = tokens
        self.lengths[row] = start + n

    def _span(self, full: np.ndarray, row: int, start: int, end: int) -> np.ndarray:
        """[kv_heads, n, head_dim] positions start .. end - 1 of a row of one buffer (a view)."""
        return full[row, :, start:end]


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

    def advance(self, n: int, tokens: np.ndarray | None = None) -> None:
        """Mark n more positions valid (after a pass wrote them from `tokens`)."""
        if n < 0 or self.length + n > self.capacity:
            raise InputError(
                f"cache overflow: {self.length} + {n} positions exceed capacity {self.capacity}"
            )
        self.record(0, self.length, tokens, n)
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

    def _span(self, full: np.ndarray, row: int, start: int, end: int) -> np.ndarray:
        if self.layout in FULL_BUFFER:
            return full[0, :, start:end]
        return full[0, start:end].transpose(1, 0, 2)  # plain: [1, capacity, kv_heads, head_dim]


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

    def copy_prefix(self, source: int, row: int, length: int, start: int = 0) -> bool:
        """Copy positions start .. length - 1 of row `source` into row `row`, whose first `start`
        positions already hold the same tokens (a prompt prefix the rows share: computing it
        again would give the same keys and values), and set the row's length. Host memory only
        (False elsewhere: the caller computes the prefix instead)."""
        if not self.on_host:
            return False
        held = int(self.lengths[source])
        if not start < length <= min(held, self.capacity) or source == row:
            raise InputError(f"cannot copy {length} positions of row {source} into row {row}")
        if start > self.lengths[row]:
            raise InputError(f"row {row} holds fewer than {start} positions")
        for buffer in self._buffers:
            assert isinstance(buffer, HostBuffer)
            data = buffer.array  # [rows, kv_heads, capacity, head_dim]
            data[row, :, start:length] = data[source, :, start:length]
        self.tokens[row, start:length] = self.tokens[source, start:length]
        self.lengths[row] = length
        return True

    def reuse_prefix(
        self, row: int, prompt: np.ndarray, minimum: int, rows: list[int] | None = None
    ) -> int:
        """Copy into `row` the longest prefix of `prompt` that another row of the same scope
        holds (of `rows`, default all), if at least `minimum` tokens and longer than what the
        row holds; returns the row's length (unchanged: nothing was copied)."""
        scope = self.scopes[row]
        have = int(self.lengths[row])
        best, donor = have, -1
        for other in range(self.rows) if rows is None else rows:
            if other != row:
                shared = self.shared_prefix(other, prompt, scope)
                if shared > best:
                    best, donor = shared, other
        if donor < 0 or best < minimum or not self.copy_prefix(donor, row, best, have):
            return have
        return best

    def release(self, row: int, room: int) -> None:
        """The row's generation is over: it keeps its valid prefix for a later one, but at most
        capacity - room positions, so that a pass over neighbouring rows (`room` tokens wide),
        which writes at this row's length too, stays inside it."""
        self.lengths[row] = max(0, min(int(self.lengths[row]), self.capacity - room))


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two id arrays share."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
