"""Prompt reuse across generations: a new generation keeps the longest prefix of its prompt that
a cache already holds, and reads only the rest.

Agents and chat send the same growing conversation every turn. A cache row keeps the token ids of
its valid positions after its generation ends (kv_cache.py), so the next generation takes the row
whose held tokens share the longest prefix with its prompt and sets the row's length to that
prefix: no data moves (the cache's own rollback). A prefix that would be overwritten goes to the
host store first (store.py), and a prompt that some entry there starts longer than any row gets
it copied back.

Scopes. A prefix is reused only by a generation of the scope that computed it (GenerationSettings
.cache_scope: a tenant, narrowed by a request's cache salt), since a hit shows in the time to the
first token and would tell one user what another sent. A generation whose scope is None neither
reuses nor leaves anything for others.

Exactness: the kept positions hold the keys and values a prefill of the same tokens would write.
On the specx kernels they are those bits exactly (a row's result does not depend on the pass it
was computed in); on ONNX Runtime's own kernels a position computed in a verify pass may differ
from a prefill's in the last bits (docs/models-and-drafters.md, "What is exact").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from specx.runtime.kv_cache import CacheBuffers
from specx.runtime.prefix.store import PrefixStore

DEFAULT_STORE_MB = 2048
MIN_STORED = 16  # shorter prefixes are not worth an entry: reading them is a pass or two

# Resumed.source: where the kept positions came from
KEPT = "cache"  # the row held them (its own earlier generation)
RESTORED = "store"  # copied back from the host store
COPIED = "row"  # copied from another batch row holding them


@dataclass(frozen=True)
class PrefixConfig:
    """How a pipeline keeps prompts between generations."""

    reuse: bool = True  # False: every prompt is read whole (and nothing is kept)
    store_mb: int = DEFAULT_STORE_MB  # the host store's bound; 0: no store

    def __post_init__(self) -> None:
        if self.store_mb < 0:
            from specx.runtime.errors import InputError

            raise InputError(
                f"the prompt cache size must be >= 0 MB, got {self.store_mb}",
                "pass 0 to turn the host store off",
                "prompt_cache_mb",
            )


@dataclass(frozen=True)
class Resumed:
    """What a generation found of its prompt before reading it."""

    tokens: int = 0  # leading prompt positions kept or copied back
    source: str = ""  # KEPT, RESTORED or COPIED ("" where none)
    note: str = ""  # why nothing was reused where something might have been


@dataclass
class ReuseCounts:
    """Generations that reused a prefix from a cache row, and the positions they kept."""

    hits: int = 0
    tokens: int = 0
    lookups: int = 0


@dataclass
class PrefixCache:
    """A pipeline's prompt reuse: the policy over its caches' rows, and the host store."""

    config: PrefixConfig = field(default_factory=PrefixConfig)

    def __post_init__(self) -> None:
        mb = self.config.store_mb if self.config.reuse else 0
        self.store: PrefixStore | None = PrefixStore(mb * 2**20) if mb else None
        self.counts = ReuseCounts()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.config.reuse

    def resume(
        self,
        cache: CacheBuffers,
        row: int,
        key: str,
        reading: np.ndarray,
        scope: str | None,
        refuse: str = "",
    ) -> Resumed:
        """Before a generation reads `reading` (its prompt but the last token) into `row` of
        `cache` (whose positions graph `key` computes): keep the longest prefix of it the row
        holds, or copy back a longer one from the store; whatever the row held beyond that
        goes to the store first. The row then belongs to `scope` at the length returned.
        refuse: why this generation may reuse nothing (it still leaves its prefix)."""
        if not self.enabled or scope is None:
            self._stash(cache, row, key, scope, 0)
            cache.claim(row, scope, 0)
            return Resumed(note="" if self.enabled else "prompt reuse is off")
        if refuse:
            self._stash(cache, row, key, scope, 0)
            cache.claim(row, scope, 0)
            return Resumed(note=refuse)
        own = cache.shared_prefix(row, reading, scope)
        entry, stored = None, 0
        if self.store is not None and cache.on_host:
            entry, stored = self.store.lookup(key, scope, reading)
        self._stash(cache, row, key, scope, own)
        cache.claim(row, scope, own)
        with self._lock:
            self.counts.lookups += 1
        store = self.store
        if entry is not None and stored > own and store is not None and store.take(entry, stored):
            values = [v[:, own:stored] for v in entry.values]
            cache.write_positions(row, own, values, entry.tokens[own:stored])
            return Resumed(stored, RESTORED)
        if own:
            with self._lock:
                self.counts.hits += 1
                self.counts.tokens += own
            return Resumed(own, KEPT)
        return Resumed()

    def keep(self, cache: CacheBuffers, row: int, key: str) -> None:
        """Put what the row holds in the store (its cache is about to be dropped)."""
        self._stash(cache, row, key, None, 0)

    def record_copy(self, tokens: int) -> None:
        """A batch row copied `tokens` positions from another row (batch/prefill.py)."""
        with self._lock:
            self.counts.hits += 1
            self.counts.tokens += tokens

    def _stash(self, cache: CacheBuffers, row: int, key: str, scope: str | None, keep: int) -> None:
        """Put the row's held prefix in the store if claiming the row for `scope` at `keep`
        positions would lose at least MIN_STORED of it."""
        held = int(cache.lengths[row])
        owner = cache.scopes[row]
        kept = keep if owner == scope else 0
        if self.store is None or owner is None or not cache.on_host:
            return
        if held < MIN_STORED or held - kept < MIN_STORED:
            return
        tokens = cache.held(row).copy()
        self.store.put(key, owner, tokens, cache.read_positions(row, 0, held))
