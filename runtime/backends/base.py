"""The backend seam: what runs one exported graph for the speculative loop.

A backend (ONNX Runtime on the CPU or CUDA, TensorRT) implements ``GraphSession``:

    forward(tokens, cache)   score 1..max_chunk new tokens on top of the cache's valid prefix,
                             write their keys/values into the cache in place, advance its length,
                             return the logits of the new positions ([seq, vocab], a view into a
                             buffer the next call overwrites)
    forward_last(...)        the same pass, of which only the last position's logits are read
                             (prefill); a graph with a logits count computes only that row
    fork()                   a handle on the same loaded graph with its own bindings and buffers
                             (one per concurrent generation)
    memory                   where this backend's cache buffers live (runtime/memory.py)
    last_features            a target exported for a feature draft: the `features` rows of the
                             last pass ([seq, F], a view the next pass overwrites), else None
    forward_head(...)        a feature draft's pass (its graph takes features or its own hidden
                             states besides the tokens); backends that cannot run one refuse
    pair_id                  the export the graph belongs to, as the graph itself records it
    batched()                this graph's passes over the rows of a batch cache (BatchedGraph),
                             or None where the backend or the graph declines them

Everything a backend shares with the others is written here once: cache creation against the
graph's capacity, the bounds check of a pass, prefill in chunks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.errors import InputError, ProviderError
from specx.runtime.kv_cache import BatchKVCache, KVCache
from specx.runtime.memory import DeviceMemory

# Prompt tokens per pass: bounds the logits buffer ([chunk, vocab]) and the attention scratch.
DEFAULT_CHUNK = 128


class BatchedGraph(Protocol):
    """A graph's passes over several rows of a BatchKVCache, each row at its own length: what
    batching (batch/) and shared draft passes (drafters/shared_passes.py) run. A backend
    offers it through GraphSession.batched, or declines."""

    spec: ModelSpec
    path: Path
    max_chunk: int
    passes: int
    last_features: np.ndarray | None  # [rows, seq, F] of the last pass, if the graph has them

    @property
    def vocab_size(self) -> int: ...

    def fork(self) -> BatchedGraph:
        """A handle sharing the loaded graph, with its own bindings and output buffers."""
        ...

    def new_batch_cache(self, rows: int, capacity: int) -> BatchKVCache:
        """Caches for `rows` sequences of up to `capacity` positions, in this graph's memory."""
        ...

    def forward_rows(
        self, tokens: np.ndarray, counts: np.ndarray, cache: BatchKVCache, first_row: int = 0
    ) -> np.ndarray:
        """One pass over cache rows first_row .. first_row + batch - 1: tokens [batch, seq],
        row b's counts[b] real tokens then padding, at positions lengths[row] ..; each row's
        length grows by its count. Returns logits [batch, seq, vocab], a view the next call
        overwrites."""
        ...


class GraphSession(ABC):
    """One loaded graph that follows the contract, bound to caches in its own memory."""

    spec: ModelSpec
    path: Path
    memory: DeviceMemory
    max_chunk: int  # the most tokens one pass takes
    passes: int  # forward calls of this handle (forks count their own)
    last_features: np.ndarray | None = None  # [seq, F] of the last pass, if the graph has them

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

    def forward_last(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """forward, of which only the last position's logits are read ([vocab], a view): a
        backend whose graph can compute the head on that row alone (contract.LOGITS_TO_KEEP)
        does so."""
        return self.forward(tokens, cache)[-1]

    def forward_head(
        self,
        tokens: np.ndarray,
        features: np.ndarray | None,
        hidden: np.ndarray | None,
        cache: KVCache,
    ) -> tuple[np.ndarray, np.ndarray]:
        """A feature draft's pass over `tokens` ([seq]): each position reads the target's
        `features` ([seq, F]) or, when features is None, the head's own `hidden` ([seq, hidden]).
        Returns (logits [seq, vocab], hidden_out [seq, hidden]), views the next call overwrites."""
        raise ProviderError(
            f"the {type(self).__name__} backend does not run feature drafts",
            "run the artifact with ONNX Runtime (--provider cpu or cuda)",
        )

    @abstractmethod
    def fork(self) -> GraphSession:
        """A handle sharing the loaded graph, with its own bindings and output buffers."""

    def batched(self) -> BatchedGraph | None:
        """This graph's passes over batch rows (BatchedGraph); None: the backend declines."""
        return None

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

    def prefill(
        self,
        tokens: np.ndarray,
        cache: KVCache,
        on_features: Callable[[int, np.ndarray], None] | None = None,
    ) -> np.ndarray | None:
        """Run any number of tokens in chunks; returns the last logits row (or None), a view
        that the next pass overwrites, like forward's. on_features(position, rows) receives each
        chunk's features, where the graph has them."""
        last: np.ndarray | None = None
        for start in range(0, int(tokens.shape[0]), self.max_chunk):
            position = cache.length
            last = self.forward_last(tokens[start : start + self.max_chunk], cache)
            if on_features is not None and self.last_features is not None:
                on_features(position, self.last_features)
        return last
