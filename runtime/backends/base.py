"""The backend seam: what runs one exported graph for the speculative loop.

A backend (ONNX Runtime on the CPU or CUDA, TensorRT) implements ``GraphSession``:

    forward(tokens, cache)   score 1..max_chunk new tokens on top of the cache's valid prefix,
                             write their keys/values into the cache in place, advance its length,
                             return the logits of the new positions ([seq, vocab], a view into a
                             buffer the next call overwrites)
    fork()                   a handle on the same loaded graph with its own bindings and buffers
                             (one per concurrent generation)
    memory                   where this backend's cache buffers live (runtime/memory.py)
    pair_id                  the export the graph belongs to, as the graph itself records it

Everything a backend shares with the others is written here once: cache creation against the
graph's capacity, the bounds check of a pass, prefill in chunks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from specx.runtime.contract import ModelSpec
from specx.runtime.errors import InputError
from specx.runtime.kv_cache import KVCache
from specx.runtime.memory import DeviceMemory

# Prompt tokens per pass: bounds the logits buffer ([chunk, vocab]) and the attention scratch.
DEFAULT_CHUNK = 128


class GraphSession(ABC):
    """One loaded graph that follows the contract, bound to caches in its own memory."""

    spec: ModelSpec
    path: Path
    memory: DeviceMemory
    max_chunk: int  # the most tokens one pass takes
    passes: int  # forward calls of this handle (forks count their own)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def device(self) -> str:
        return self.memory.device

    @property
    @abstractmethod
    def pair_id(self) -> str | None:
        """The export this graph belongs to, as recorded inside the graph file; None where the
        file format has no place for it (then the manifest's own record is the only one)."""

    @abstractmethod
    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """Run the new `tokens` ([seq] int64) on top of `cache`; the cache grows by seq.

        Returns the logits of every new position, [seq, vocab], as a view into a buffer that the
        next call overwrites."""

    @abstractmethod
    def fork(self) -> GraphSession:
        """A handle sharing the loaded graph, with its own bindings and output buffers."""

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        if capacity > s.max_length:
            raise InputError(
                f"a cache of {capacity} positions exceeds the {s.max_length} this graph was "
                "exported for",
                "re-export with a larger --max-length",
            )
        return KVCache(
            s.num_layers,
            s.kv_heads,
            s.head_dim,
            capacity,
            s.dtype,
            self.memory,
            layout=s.attention,
        )

    def check_pass(self, seq: int, cache: KVCache) -> None:
        """The bounds every backend enforces before a pass of `seq` tokens."""
        if seq < 1 or seq > self.max_chunk:
            raise InputError(f"a pass takes 1..{self.max_chunk} tokens, got {seq}")
        if cache.length + seq > cache.capacity:
            raise InputError(
                f"cache overflow: {cache.length} cached + {seq} new positions exceed "
                f"{cache.capacity}"
            )

    def prefill(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray | None:
        """Run any number of tokens in chunks; returns the last logits row (or None), a view
        that the next pass overwrites, like forward's."""
        last: np.ndarray | None = None
        for start in range(0, int(tokens.shape[0]), self.max_chunk):
            last = self.forward(tokens[start : start + self.max_chunk], cache)[-1]
        return last
