"""The KV cache of an imported "concat" graph (runtime/artifact/contract.py): past in, past + new
out, as a new tensor.

Such a graph reads `past` as one contiguous [1, kv_heads, slots, head_dim] tensor and writes
`present` = past + new as another, [1, kv_heads, slots + seq, head_dim]. The cache keeps two sets
of buffers, allocated once with room for `capacity + room` slots, binds `past` to the set the last
pass wrote and `present` to the other, and swaps: the graph's own concatenation is the only copy
a pass makes.

A slot is a computed position; the logical length (the only truth, as for every cache) counts
the valid ones. Rolling back does not move data: the rejected slots become holes that the
pass's attention_mask masks out, and position_ids carry the logical positions, so a hole changes
nothing the graph computes. Holes cost attention work, so when they pass a quarter of the valid
positions (or the slots would outgrow the buffers) the valid slots are compacted into the other
set once: a copy of the valid positions per length / 4 rolled-back slots.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specx.runtime.errors import InputError
from specx.runtime.kv_cache import KVCache
from specx.runtime.memory import HOST, DeviceMemory, HostBuffer

# Holes kept before a compaction: at most a quarter of the valid positions (attention work),
# at least this many (so that a short context does not compact at every rejection).
MIN_HOLES = 32


class ConcatCache(KVCache):
    """One sequence's cache for a "concat" graph: two buffer sets in turn, holes masked."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        room: int,
        dtype: str = "float32",
        memory: DeviceMemory = HOST,
        mask_dtype: str = "int64",
    ) -> None:
        """room: slots beyond `capacity` for holes and a pass's new positions (>= the longest
        pass); mask_dtype: the graph's attention_mask type (int64, or int32), bound as is."""
        if memory is not HOST:
            raise InputError(
                "imported graphs (concat layout) run on the CPU only",
                "run with --provider cpu, or export the model with `specx export`",
            )
        self.slot_capacity = capacity + room
        super().__init__(
            num_layers, kv_heads, head_dim, self.slot_capacity, dtype, memory, layout="concat"
        )
        self.capacity = capacity  # positions; the buffers hold slot_capacity slots
        other = [memory.allocate(self.shape, self.np_dtype) for _ in self._buffers]
        self._sets: list[list[Any]] = [list(self._buffers), other]
        self._set_ptrs = [[b.ptr for b in buffers] for buffers in self._sets]  # fixed for life
        self._front = 0  # the set holding the slots
        self.slots = 0  # computed slots in the front set, holes included
        self.mask = np.zeros(self.slot_capacity, dtype=mask_dtype)  # 1: a valid slot
        self.slot_of = np.zeros(capacity, dtype=np.int64)  # each valid position's slot
        self.compactions = 0

    @property
    def nbytes(self) -> int:
        return 2 * super().nbytes

    def buffer_addresses(self) -> tuple[int, ...]:
        return tuple(p for ptrs in self._set_ptrs for p in ptrs)

    def truncate(self, length: int, row: int = 0) -> None:
        """Roll back to `length` positions: the later slots become holes; no data moves."""
        old = self.length
        super().truncate(length, row)
        self.mask[self.slot_of[length:old]] = 0

    def reset(self) -> None:
        super().reset()
        self.slots = 0
        self.mask[:] = 0

    # -- a pass -----------------------------------------------------------------------------
    def begin_pass(self, seq: int) -> tuple[list[int], list[int], int, np.ndarray]:
        """Before a pass of `seq` tokens: (past addresses, present addresses, past slots,
        attention_mask [slots + seq]), compacting first where the slots would not fit."""
        if self.length + seq > self.capacity:
            raise InputError(
                f"cache overflow: {self.length} + {seq} positions exceed capacity {self.capacity}"
            )
        holes = self.slots - self.length
        if self.slots + seq > self.slot_capacity or holes > max(MIN_HOLES, self.length // 4):
            self.compact()
        past, present = self._set_ptrs[self._front], self._set_ptrs[1 - self._front]
        self.mask[self.slots : self.slots + seq] = 1
        return past, present, self.slots, self.mask[: self.slots + seq]

    def end_pass(self, seq: int, tokens: np.ndarray | None) -> None:
        """After the pass: its output set holds the slots; the new positions are valid."""
        self._front = 1 - self._front
        self.slot_of[self.length : self.length + seq] = np.arange(self.slots, self.slots + seq)
        self.slots += seq
        self.advance(seq, tokens)

    def compact(self) -> None:
        """Copy the valid slots, in order, to the front of the other set and make it the front:
        no holes left."""
        valid = self.slot_of[: self.length]
        sets = zip(self._sets[self._front], self._sets[1 - self._front], strict=True)
        for source, target in sets:
            self._heads(target, self.length)[...] = self._heads(source, self.slots)[:, valid]
        self._front = 1 - self._front
        self.slots = self.length
        self.mask[:] = 0
        self.mask[: self.length] = 1
        self.slot_of[: self.length] = np.arange(self.length)
        self.compactions += 1

    def _heads(self, buffer: Any, slots: int) -> np.ndarray:
        """[kv_heads, slots, head_dim]: the first `slots` slots of a set's buffer, as the graph
        lays them out (a view)."""
        assert isinstance(buffer, HostBuffer)
        flat = buffer.array.reshape(-1)[: self.kv_heads * slots * self.head_dim]
        return flat.reshape(self.kv_heads, slots, self.head_dim)

    # -- what the prefix store copies ---------------------------------------------------------
    def keys(self, layer: int) -> np.ndarray:
        return self._valid(2 * layer).transpose(1, 0, 2)

    def values(self, layer: int) -> np.ndarray:
        return self._valid(2 * layer + 1).transpose(1, 0, 2)

    def _valid(self, index: int) -> np.ndarray:
        """[kv_heads, length, head_dim] a copy of one tensor's valid positions."""
        heads = self._heads(self._sets[self._front][index], self.slots)
        return heads[:, self.slot_of[: self.length]]

    def read_positions(self, row: int, start: int, end: int) -> list[np.ndarray]:
        slots = self.slot_of[start:end]
        return [self._heads(b, self.slots)[:, slots].copy() for b in self._sets[self._front]]

    def write_positions(
        self, row: int, start: int, values: list[np.ndarray], tokens: np.ndarray
    ) -> None:
        """Make positions start .. start + n - 1 hold `values` (read_positions' shape): the
        valid slots and the new ones written compactly into the other set (one copy)."""
        n = int(tokens.shape[0])
        if start > self.length or start + n > self.capacity:
            raise InputError(f"cannot write positions {start}..{start + n - 1} of row {row}")
        valid = self.slot_of[:start]
        for source, target, data in zip(
            self._sets[self._front], self._sets[1 - self._front], values, strict=True
        ):
            heads = self._heads(target, start + n)
            heads[:, :start] = self._heads(source, self.slots)[:, valid]
            heads[:, start:] = data
        self._front = 1 - self._front
        self.slots = start + n
        self.mask[:] = 0
        self.mask[: self.slots] = 1
        self.slot_of[: self.slots] = np.arange(self.slots)
        self.tokens[row, start : start + n] = tokens
        self.lengths[row] = start + n
